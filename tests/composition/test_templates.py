"""The template library (saga/templates/ and saga.composition.library).

Every template is listed with its metadata and validates, and every one runs end to end
against real local systems: git repositories and folders in tmp, SQLite files and a
PostgreSQL schema of its own, HTTP servers on 127.0.0.1:0 and the test MCP server. For
each template with compensations, an input that makes a later step fail triggers them and
the test checks the real state was restored (rows gone, files restored, branch deleted).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
import threading
import tomllib
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.composition.definition import load_file
from saga.composition.library import TEMPLATES_DIR, find_template, list_templates
from saga.config import Settings, load_settings
from saga.domain import Run
from saga.errors import ConfigError
from saga.report import template_stats, templates_stats
from saga.tools import load_registry
from saga.tools.mcp import MANAGER
from tests.conftest import PG_URL

SERVER = str(Path(__file__).parents[1] / "standins" / "mcp_server.py")
MCP = {"mcp": {"servers": {"demo": {"command": sys.executable, "args": [SERVER]}}}}
ALLOW = {"shell": {"allow": ["grep", "git", sys.executable]}}
TEN = {"search-fold-store", "start-work", "money-transfer", "account-provisioning",
       "db-migration", "http-fetch-transform-store", "file-batch", "quality-gate", "release",
       "mcp-tools"}


# -- helpers ---------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _stop_mcp_servers() -> Iterator[None]:
    yield
    MANAGER.close()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SAGA_SHELL_ALLOW", "SAGA_TEMPLATES", "SAGA_CONFIG"):
        monkeypatch.delenv(name, raising=False)


SagaFactory = Callable[..., Saga]


@pytest.fixture
def make_saga(tmp_path: Path) -> Iterator[SagaFactory]:
    """Sagas on a SQLite store in tmp whose tools read this saga.toml data (the file tool's
    root is tmp); every run they recorded is replayed through the scheduler at teardown."""
    made: list[Saga] = []

    def make(settings: Settings | None = None, **file: Any) -> Saga:
        base = settings or Settings(home=tmp_path / ".saga", actor="tester")
        settings = dataclasses.replace(base, file={**ALLOW, "file": {"root": str(tmp_path)},
                                                   **file})
        s = Saga(settings, registry=load_registry((), settings=settings))
        made.append(s)
        return s

    yield make
    for s in made:
        if s._app is not None:
            for _, run_id in s.app.run_ids():
                assert s.verify(run_id) is None, f"run {run_id} does not replay"
        s.close()


def run_template(s: Saga, name: str, **inputs: Any) -> Run:
    return s.run(s.load(find_template(name)), inputs)


def step_status(run: Run, step: str) -> str:
    return run.steps[step]["status"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def make_repo(path: Path, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for key, value in (("user.name", "Saga Test"), ("user.email", "saga@example.invalid"),
                       ("commit.gpgsign", "false"), ("tag.gpgsign", "false")):
        git(path, "config", key, value)
    for name, text in (files or {"README": "hello\n"}).items():
        (path / name).write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "first")
    return path


def branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--format=%(refname:short)").splitlines()


class Http:
    """A loopback HTTP server answering from ``routes`` ("METHOD /path" -> (status, body)
    or a function of the request), recording every request."""

    def __init__(self, routes: dict[str, Any]) -> None:
        self.routes = routes
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(size).decode() if size else ""
                request = {"method": self.command, "path": self.path.split("?")[0],
                           "json": json.loads(raw) if raw else None}
                server.requests.append(request)
                answer = server.routes.get(f"{self.command} {request['path']}", (404, "no"))
                status, body = answer(request) if callable(answer) else answer
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain" if isinstance(body, str)
                                 else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def calls(self, method: str, path: str) -> list[Any]:
        return [r["json"] for r in self.requests if r["method"] == method and r["path"] == path]


@pytest.fixture
def http_server() -> Iterator[Callable[[dict[str, Any]], Http]]:
    servers: list[Http] = []

    def start(routes: dict[str, Any]) -> Http:
        servers.append(Http(routes))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def tools_used(data: dict[str, Any]) -> set[str]:
    used = set()
    for step in data["steps"]:
        if step.get("tool"):
            used.add(step["tool"])
        compensate = step.get("compensate")
        if isinstance(compensate, dict) and compensate.get("tool"):
            used.add(compensate["tool"])
    return used


# -- the library -------------------------------------------------------------------------------

def test_list_templates_returns_every_template_with_its_metadata() -> None:
    templates = list_templates()
    assert len(templates) >= 10
    by_name = {t.name: t for t in templates}
    assert TEN | {"quickstart"} <= set(by_name)
    for t in templates:
        assert t.error is None, t.error
        assert t.path.parent == TEMPLATES_DIR and t.definition_name == t.name
        assert t.category and t.tags and t.title and len(t.description) > 60, t.name
        assert t.version == "1.0"
        # required_tools says exactly which tools the steps and compensations call
        assert set(t.required_tools) == tools_used(load_file(t.path)), t.name
    assert by_name["money-transfer"].category == "finance"
    assert "compensation" in by_name["money-transfer"].tags
    assert {"name": "reference", "type": "string", "required": True,
            "description": "the transfer's unique reference (e.g. an invoice number)"} in \
        by_name["money-transfer"].inputs
    assert by_name["mcp-tools"].to_json()["required_tools"][0] == "mcp.demo.echo"
    for name in TEN:  # each says how to run it, and what saga.toml it needs
        t = by_name[name]
        assert t.example.startswith(f"saga templates run {name} "), name
        config = tomllib.loads(t.config)
        if "shell" in t.required_tools:
            assert {"grep"} <= set(config["shell"]["allow"]), name
        if name == "mcp-tools":
            assert config["mcp"]["servers"]["demo"]["args"] == ["-m", "saga.tools.demo_mcp"]
    categories = {t.category for t in templates}
    assert len(categories) >= 8


def test_find_template_by_name_with_close_matches_and_extra_folders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_template("money-transfer") == TEMPLATES_DIR / "money-transfer.yaml"
    assert find_template("release.yaml") == TEMPLATES_DIR / "release.yaml"
    with pytest.raises(ConfigError, match="did you mean money-transfer"):
        find_template("mony-transfer")
    with pytest.raises(ConfigError, match="unknown template 'zzz'; known templates: "):
        find_template("zzz")
    extra = tmp_path / "mine"
    extra.mkdir()
    (extra / "release.yaml").write_text("name: my-release\nsteps: [{id: a, tool: noop}]\n")
    (extra / "hello.yml").write_text(
        "name: hello\nmetadata: {category: demo, tags: [x], required_tools: [echo]}\n"
        "steps: [{id: a, tool: echo}]\n")
    monkeypatch.setenv("SAGA_TEMPLATES", str(extra))
    assert find_template("hello") == extra / "hello.yml"
    assert find_template("release") == extra / "release.yaml"  # own folders come first
    names = {t.name: t for t in list_templates()}
    assert names["hello"].category == "demo" and names["release"].definition_name == "my-release"
    monkeypatch.delenv("SAGA_TEMPLATES")
    settings = Settings(file={"templates": [str(extra)]})
    assert find_template("hello", settings) == extra / "hello.yml"


def test_every_template_validates(make_saga: SagaFactory) -> None:
    for t in list_templates():  # with the saga.toml its metadata says it needs
        s = make_saga(**{**MCP, **tomllib.loads(t.config or "")})
        plan = s.load(t.path)
        assert plan.definition.name == t.definition_name
        assert all(tool in s.registry for tool in t.required_tools)


def test_stats_give_success_rate_and_mean_duration(settings: Settings,
                                                   make_saga: SagaFactory) -> None:
    s = make_saga(settings)  # SQLite and PostgreSQL stores
    runs = [run_template(s, "quickstart"), run_template(s, "quickstart", fail_at="ship"),
            run_template(s, "quickstart", order_id="B-7")]
    assert [r.status for r in runs] == ["completed", "compensated", "completed"]
    stats = template_stats(s, "quickstart")
    assert stats["runs"] == stats["finished"] == 3
    assert stats["by_status"] == {"completed": 2, "compensated": 1}
    assert stats["success_rate"] == pytest.approx(2 / 3)
    durations = []
    for r in runs:
        summary = s.status(r.run_id)
        spent = datetime.fromisoformat(summary["finished_at"]) - \
            datetime.fromisoformat(summary["started_at"])
        durations.append(spent.total_seconds() * 1000)
    assert stats["mean_duration_ms"] == pytest.approx(sum(durations) / 3, abs=1)
    assert stats["mean_duration_ms"] > 0
    assert template_stats(s, "file-batch") | {"last_run_at": None} == {
        "template": "file-batch", "definition_name": "file-batch", "runs": 0, "finished": 0,
        "by_status": {}, "success_rate": None, "mean_duration_ms": None, "last_run_at": None}
    with pytest.raises(ConfigError):
        template_stats(s, "no-such-template")
    every = templates_stats(s)
    assert set(every) >= TEN and every["quickstart"] == stats


# -- search-fold-store -----------------------------------------------------------------------

def test_search_fold_store_digests_a_folder_and_restores_on_failure(
        tmp_path: Path, make_saga: SagaFactory) -> None:
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "a.txt").write_text("Saga pattern\nnothing here\nthe SAGA log, compensations\n")
    (notes / "b.txt").write_text("unrelated\n")
    (notes / "sub" / "c.md").write_text("a saga in a subfolder\n")
    digest, index = tmp_path / "digest.md", tmp_path / "index.txt"
    index.write_text("earlier entry\n")
    s = make_saga()
    run = run_template(s, "search-fold-store", query="saga", folder=str(notes),
                       output_path=str(digest), index_path=str(index))
    assert run.status == "completed", run.error
    assert run.outputs["files"] == [str(notes / "a.txt"), str(notes / "sub" / "c.md")]
    assert run.outputs["matches"] == 3
    text = digest.read_text()
    assert text.startswith("# Digest: saga\n\n3 matching lines in 2 files for 'saga'\n")
    assert f"## {notes / 'a.txt'}\n\n- line 1: Saga pattern\n- line 3: the SAGA log" in text
    assert "unrelated" not in text
    assert index.read_text() == f"earlier entry\n{digest}: 3 matching lines in 2 files for " \
                                "'saga'\n"

    failed = run_template(s, "search-fold-store", query="pattern", folder=str(notes),
                          output_path=str(digest), index_path=str(index),
                          fail_after_store=True)
    assert failed.status == "compensated" and failed.failed_step == "after_store"
    assert step_status(failed, "store") == step_status(failed, "index") == "compensated"
    assert digest.read_text() == text  # the first digest, byte for byte
    assert index.read_text().count("\n") == 2

    fresh = tmp_path / "new" / "digest.md"
    undone = run_template(s, "search-fold-store", query="nowhere", folder=str(notes),
                          output_path=str(fresh), fail_after_store=True)
    assert undone.status == "compensated" and undone.steps["pick"]["output"] == []
    assert not fresh.exists() and not fresh.parent.exists()


# -- start-work ------------------------------------------------------------------------------

def test_start_work_creates_a_branch_and_deletes_it_when_the_tracker_refuses(
        tmp_path: Path, make_saga: SagaFactory, http_server: Callable[..., Http]) -> None:
    repo = make_repo(tmp_path / "repo")
    tracker = http_server({"POST /issues/AAP-1/transitions": (200, {"ok": True})})
    s = make_saga()
    run = run_template(s, "start-work", repo=str(repo), issue_key="AAP-1",
                       summary="Fix the Login / page!", checkout=True, tracker_url=tracker.url)
    assert run.status == "completed", run.error
    assert run.outputs["branch"] == "feature/AAP-1-fix-the-login-page"
    assert run.outputs["tracker_status"] == 200
    assert git(repo, "branch", "--show-current") == "feature/AAP-1-fix-the-login-page"
    assert run.outputs["sha"] == git(repo, "rev-parse", "main")
    assert tracker.calls("POST", "/issues/AAP-1/transitions") == [
        {"status": "In Progress", "branch": "feature/AAP-1-fix-the-login-page"}]
    git(repo, "checkout", "-q", "main")

    failed = run_template(s, "start-work", repo=str(repo), issue_key="AAP-404",
                          branch_prefix="fix", checkout=True, tracker_url=tracker.url)
    assert failed.status == "compensated" and failed.failed_step == "transition_issue"
    assert failed.error["type"] == "HTTPStatus"
    assert step_status(failed, "create_branch") == "compensated"
    assert branches(repo) == ["feature/AAP-1-fix-the-login-page", "main"]
    assert git(repo, "branch", "--show-current") == "main"  # switched back, then deleted

    waiting = run_template(s, "start-work", repo=str(repo), issue_key="AAP-2",
                           require_approval=True)
    assert waiting.status == "waiting" and "feature/AAP-2-work" not in branches(repo)
    s.approve(waiting.run_id, "create_branch_approved", comment="go")
    done = s.resume(waiting.run_id)
    assert done.status == "completed" and "feature/AAP-2-work" in branches(repo)
    assert step_status(done, "create_branch") == "skipped"


# -- money-transfer ----------------------------------------------------------------------------

@pytest.fixture(params=["sqlite", "postgres"])
def bank(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A database to move money in: a SQLite file, or a PostgreSQL schema of its own."""
    if request.param == "sqlite":
        path = tmp_path / "bank.db"

        def query(sql: str) -> list[tuple[Any, ...]]:
            with sqlite3.connect(path) as conn:
                return conn.execute(sql).fetchall()

        yield {"url": f"sqlite:///{path}", "query": query}
        return
    import psycopg

    schema = f"tpl_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')

    def pg_query(sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            cur = conn.execute(sql)
            return [tuple(float(v) if hasattr(v, "as_tuple") else v for v in row)
                    for row in cur.fetchall()] if cur.description else []

    try:
        yield {"url": f"{PG_URL}?options=-csearch_path%3D{schema}", "query": pg_query}
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_money_transfer_moves_money_and_refunds_a_failed_credit(
        bank: dict[str, Any], make_saga: SagaFactory) -> None:
    s = make_saga(sql={"connections": {"bank": bank["url"]}})
    query = bank["query"]

    def transfer(**inputs: Any) -> Run:
        return run_template(s, "money-transfer", **inputs)

    # an unknown source account: the tables are created, then the debit is refused
    first = transfer(reference="T0", from_account="nobody", to_account="bob", amount=1)
    assert first.status == "failed" and first.failed_step == "debit"
    assert "account_id" in first.error["message"]
    query("INSERT INTO accounts (id, balance) VALUES ('alice', 100), ('bob', 5)")
    balances = "SELECT id, balance FROM accounts ORDER BY id"

    run = transfer(reference="T1", from_account="alice", to_account="bob", amount=25.5)
    assert run.status == "completed", run.error
    assert run.outputs["balances"] == [{"id": "alice", "balance": 74.5},
                                       {"id": "bob", "balance": 30.5}]
    assert query(balances) == [("alice", 74.5), ("bob", 30.5)]
    ledger = "SELECT reference, account_id, amount FROM ledger ORDER BY reference, account_id"
    assert query(ledger) == [("T1", "alice", -25.5), ("T1", "bob", 25.5)]

    failed = transfer(reference="T2", from_account="alice", to_account="carol", amount=10)
    assert failed.status == "compensated" and failed.failed_step == "credit"
    assert step_status(failed, "debit") == "compensated"
    assert query(balances) == [("alice", 74.5), ("bob", 30.5)]  # refunded
    assert query(ledger) == [("T1", "alice", -25.5), ("T1", "bob", 25.5)]  # entry gone

    again = transfer(reference="T1", from_account="alice", to_account="bob", amount=1)
    assert again.status == "failed" and again.failed_step == "debit"  # same reference
    broke = transfer(reference="T3", from_account="bob", to_account="alice", amount=1000)
    assert broke.status == "failed" and "balance" in broke.error["message"]  # no overdraft
    same = transfer(reference="T4", from_account="bob", to_account="bob", amount=1)
    assert same.status == "failed" and same.failed_step == "same_account"
    assert query(balances) == [("alice", 74.5), ("bob", 30.5)]
    assert len(query(ledger)) == 2


# -- account-provisioning ------------------------------------------------------------------

def test_account_provisioning_creates_everything_and_rolls_it_all_back(
        tmp_path: Path, make_saga: SagaFactory, http_server: Callable[..., Http]) -> None:
    repo = make_repo(tmp_path / "repo")
    homes = tmp_path / "homes"
    db = tmp_path / "accounts.db"

    def register(request: dict[str, Any]) -> tuple[int, Any]:
        if request["json"]["username"] == "taken":
            return 409, {"error": "user exists in the directory"}
        return 201, {"id": request["json"]["username"]}

    directory = http_server({"POST /users": register})
    s = make_saga(sql={"connections": {"accounts": f"sqlite:///{db}"}})
    common = {"home_root": str(homes), "repo": str(repo),
              "directory_url": directory.url}
    run = run_template(s, "account-provisioning", username="ada", email="ada@example.com",
                       full_name="Ada Lovelace", **common)
    assert run.status == "completed", run.error
    assert run.outputs == {"username": "ada", "home": f"{homes}/ada",
                           "profile": f"{homes}/ada/.profile", "branch": "users/ada",
                           "directory_status": 201}
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT username, email, full_name, home FROM users").fetchall() \
            == [("ada", "ada@example.com", "Ada Lovelace", f"{homes}/ada")]
    assert 'USER_EMAIL="ada@example.com"' in (homes / "ada" / ".profile").read_text()
    assert "users/ada" in branches(repo)
    assert directory.calls("POST", "/users")[0] == {
        "username": "ada", "email": "ada@example.com", "full_name": "Ada Lovelace"}

    failed = run_template(s, "account-provisioning", username="taken",
                          email="taken@example.com", **common)
    assert failed.status == "compensated" and failed.failed_step == "register"
    assert [step_status(failed, k) for k in ("user_row", "home", "branch")] == \
        ["compensated"] * 3
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT username FROM users").fetchall() == [("ada",)]
    assert sorted(p.name for p in homes.iterdir()) == ["ada"]  # taken's home is gone
    assert branches(repo) == ["main", "users/ada"]


# -- db-migration ------------------------------------------------------------------------------

def test_db_migration_backs_up_migrates_verifies_and_restores(
        tmp_path: Path, make_saga: SagaFactory) -> None:
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as conn:
        conn.executescript("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);"
                           "INSERT INTO users (name) VALUES ('a'), ('b'), ('c');")
    conn.close()
    add_plan = ["ALTER TABLE users ADD COLUMN plan TEXT NOT NULL DEFAULT 'free'",
                "CREATE TABLE audit (at TEXT, what TEXT)"]
    original = db.read_bytes()
    s = make_saga(sql={"connections": {"migration": f"sqlite:///{db}"}})

    failed = run_template(s, "db-migration", database=str(db), statements=add_plan,
                          verify_statement="SELECT COUNT(*) = 3 FROM users WHERE plan = 'pro'")
    assert failed.status == "compensated" and failed.failed_step == "check"
    assert failed.error["type"] == "VerificationFailed"
    assert step_status(failed, "migrate") == step_status(failed, "backup") == "compensated"
    assert db.read_bytes() == original  # restored byte for byte
    assert not (tmp_path / "app.db.bak").exists()

    broken = run_template(s, "db-migration", database=str(db),
                          statements=[add_plan[0], "ALTER TABLE nowhere ADD COLUMN x"])
    assert broken.status == "compensated" and broken.failed_step == "migrate"
    assert db.read_bytes() == original and not (tmp_path / "app.db.bak").exists()

    run = run_template(s, "db-migration", database=str(db), statements=add_plan,
                       verify_statement="SELECT COUNT(*) = 3 FROM users WHERE plan = 'free'")
    assert run.status == "completed", run.error
    assert run.outputs["tables_before"] == ["users"]
    assert run.outputs["tables_after"] == ["audit", "users"]
    assert (tmp_path / "app.db.bak").read_bytes() == original
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT name, plan FROM users ORDER BY id").fetchall() == [
            ("a", "free"), ("b", "free"), ("c", "free")]
    conn.close()


# -- http-fetch-transform-store -------------------------------------------------------------

def test_http_fetch_transform_store_writes_json_or_csv_and_restores_on_failure(
        tmp_path: Path, make_saga: SagaFactory, http_server: Callable[..., Http]) -> None:
    items = [{"id": 1, "name": "kettle", "price": 20}, {"id": 2, "name": "cup, large",
                                                        "price": 4.5}]
    api = http_server({"GET /api/items": (200, {"data": {"items": items}}),
                       "POST /hook": (204, ""), "POST /broken-hook": (500, "down")})
    s = make_saga()
    out = tmp_path / "items.json"
    run = run_template(s, "http-fetch-transform-store", url=f"{api.url}/api/items",
                       items_path="data.items", fields=["id", "name"], output_path=str(out),
                       webhook_url=f"{api.url}/hook")
    assert run.status == "completed", run.error
    assert json.loads(out.read_text()) == [{"id": 1, "name": "kettle"},
                                           {"id": 2, "name": "cup, large"}]
    assert run.outputs["count"] == 2
    assert api.calls("POST", "/hook") == [{"url": f"{api.url}/api/items", "path": str(out),
                                           "count": 2}]

    csv = tmp_path / "items.csv"
    run = run_template(s, "http-fetch-transform-store", url=f"{api.url}/api/items",
                       items_path="data.items", format="csv", output_path=str(csv))
    assert run.status == "completed", run.error
    assert csv.read_text() == 'id,name,price\n1,kettle,20\n2,"cup, large",4.5\n'

    csv.write_text("previous export\n")
    failed = run_template(s, "http-fetch-transform-store", url=f"{api.url}/api/items",
                          items_path="data.items", format="csv", output_path=str(csv),
                          webhook_url=f"{api.url}/broken-hook")
    assert failed.status == "compensated" and failed.failed_step == "notify"
    assert step_status(failed, "store") == "compensated"
    assert csv.read_text() == "previous export\n"

    missing = run_template(s, "http-fetch-transform-store", url=f"{api.url}/nothing-here",
                           output_path=str(tmp_path / "never.json"))
    assert missing.status == "failed" and missing.error["type"] == "HTTPStatus"
    assert not (tmp_path / "never.json").exists()


# -- file-batch ----------------------------------------------------------------------------

def test_file_batch_writes_one_file_per_item_and_undoes_every_iteration(
        tmp_path: Path, make_saga: SagaFactory) -> None:
    s = make_saga()
    target = tmp_path / "batch" / "deep"
    items = [{"name": "a", "content": "first"}, {"name": "b", "content": "second"},
             {"name": "c", "content": 3}]
    run = run_template(s, "file-batch", items=items, directory=str(target))
    assert run.status == "completed", run.error
    assert [run.steps[f"write[{i}]"]["status"] for i in (1, 2, 3)] == ["completed"] * 3
    assert {p.name: p.read_text() for p in target.iterdir()} == {
        "a.txt": "first", "b.txt": "second", "c.txt": "3",
        "MANIFEST.json": json.dumps([str(target / f"{n}.txt") for n in "abc"], indent=2) + "\n"}
    assert run.outputs["count"] == 3 and run.outputs["replaced"] == []

    busy = tmp_path / "busy"
    (busy / "c.txt").mkdir(parents=True)  # a directory where item c's file should go
    (busy / "a.txt").write_text("old a")
    failed = run_template(s, "file-batch", items=items, directory=str(busy))
    assert failed.status == "compensated" and failed.failed_step == "write"
    assert "is a directory" in failed.error["message"]
    assert sorted(p.name for p in busy.iterdir()) == ["a.txt", "c.txt"]
    assert (busy / "a.txt").read_text() == "old a"  # overwritten, then restored

    rejected = run_template(s, "file-batch", items=[{"name": "../escape"}],
                            directory=str(busy))
    assert rejected.status == "failed" and rejected.error["type"] == "BadItems"
    assert not (tmp_path / "escape.txt").exists()


# -- quality-gate --------------------------------------------------------------------------

def test_quality_gate_runs_layers_in_order_and_degrades_on_enhancements(
        tmp_path: Path, make_saga: SagaFactory, http_server: Callable[..., Http]) -> None:
    project = make_repo(tmp_path / "project", {
        ".gitignore": "__pycache__/\n",
        "mod.py": "import os\n\n# TODO: make this useful\nVALUE = 1\n",
        "test_mod.py": "import unittest\n\nimport mod\n\n\nclass T(unittest.TestCase):\n"
                       "    def test_value(self):\n        self.assertEqual(mod.VALUE, 1)\n"})
    hooks = http_server({"POST /gate": (200, {"ok": True}), "POST /refuse": (422, "no")})
    report = tmp_path / "quality.md"
    s = make_saga()
    common = {"project": str(project), "report_path": str(report),
              "test_argv": [sys.executable, "-m", "unittest", "-q"],
              "lint_argv": [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated",
                            "."]}
    plan = s.load(find_template("quality-gate"))
    assert plan.levels()[:3] == [["tree"], ["clean"], ["tests"]]
    run = s.run(plan, {**common, "notify_url": f"{hooks.url}/gate"})
    assert run.status == "completed", run.error
    layers = run.outputs["_layers"]
    assert layers["degraded"] is True and layers["enhancement"]["failed"] == ["lint"]
    assert layers["guarantee"]["completed"] == 2  # tree, tests (clean was skipped)
    assert run.outputs["todos"] == 1 and run.outputs["lint_passed"] is False
    text = report.read_text()
    assert "- tests: passed" in text and "- lint: skipped or failed" in text
    assert "./mod.py:3:# TODO: make this useful" in text
    assert hooks.calls("POST", "/gate")[0]["todos"] == 1

    eco = s.run(plan, common, options={"mode": "eco"})
    assert eco.status == "completed"
    assert step_status(eco, "lint") == step_status(eco, "todos") == "skipped"

    report.write_text("the last good report\n")
    refused = s.run(plan, {**common, "notify_url": f"{hooks.url}/refuse"})
    assert refused.status == "compensated" and refused.failed_step == "notify"
    assert report.read_text() == "the last good report\n"

    (project / "mod.py").write_text("VALUE = 2\n")  # breaks the test, dirties the tree
    dirty = s.run(plan, common)
    assert dirty.status == "failed" and dirty.failed_step == "clean"
    assert dirty.error["type"] == "DirtyTree" and "M mod.py" in dirty.error["message"]
    assert "tests" not in dirty.steps and "lint" not in dirty.steps  # blocked
    failing = s.run(plan, {**common, "require_clean": False})
    assert failing.status == "failed" and failing.failed_step == "tests"
    assert "lint" not in failing.steps
    assert report.read_text() == "the last good report\n"


# -- release -------------------------------------------------------------------------------

def test_release_checks_in_parallel_waits_for_approval_and_undoes_everything(
        tmp_path: Path, make_saga: SagaFactory, http_server: Callable[..., Http]) -> None:
    repo = make_repo(tmp_path / "repo", {
        "VERSION": "1.0.0\n", "CHANGELOG.md": "# 1.2.0\n- more\n# 1.1.0\n- things\n"})
    hooks = http_server({"POST /announce": (200, {"ok": True}), "POST /down": (503, "down")})
    s = make_saga()
    plan = s.load(find_template("release"))
    assert sorted(plan.levels()[0]) == ["changelog", "tag_free", "tests", "tree"]
    common = {"repo": str(repo), "test_argv": [sys.executable, "-c", "print('tests ok')"]}
    first_commit = git(repo, "rev-parse", "HEAD")

    waiting = s.run(plan, {**common, "version": "1.1.0", "announce_url": f"{hooks.url}/announce"})
    assert waiting.status == "waiting" and waiting.pending_approvals == ["release"]
    assert git(repo, "log", "-1", "--format=%s") == "Release 1.1.0"  # committed, not tagged
    assert git(repo, "tag", "--list") == ""
    s.approve(waiting.run_id, "release", comment="ship it")
    released = s.resume(waiting.run_id)
    assert released.status == "completed", released.error
    sha = git(repo, "rev-parse", "HEAD")
    assert released.outputs == {"version": "1.1.0", "tag": "v1.1.0", "sha": sha,
                                "announced": 200}
    assert git(repo, "rev-parse", "v1.1.0^{commit}") == sha != first_commit
    assert (repo / "VERSION").read_text() == "1.1.0\n"
    assert hooks.calls("POST", "/announce") == [{"version": "1.1.0", "tag": "v1.1.0",
                                                 "sha": sha}]

    def assert_untouched() -> None:
        assert git(repo, "rev-parse", "HEAD") == sha
        assert (repo / "VERSION").read_text() == "1.1.0\n"
        assert git(repo, "status", "--porcelain") == ""  # index and worktree restored
        assert git(repo, "tag", "--list") == "v1.1.0"

    rejected = s.run(plan, {**common, "version": "1.2.0"})
    assert rejected.status == "waiting"
    s.reject(rejected.run_id, "release", comment="not today")
    rejected = s.resume(rejected.run_id)
    assert rejected.status == "compensated" and rejected.error["type"] == "ApprovalRejected"
    assert [step_status(rejected, k) for k in ("index_guard", "bump", "commit")] == \
        ["compensated"] * 3
    assert_untouched()

    down = s.run(plan, {**common, "version": "1.2.0", "announce_url": f"{hooks.url}/down"})
    s.approve(down.run_id, "release")
    down = s.resume(down.run_id)
    assert down.status == "compensated" and down.failed_step == "announce"
    assert step_status(down, "release") == "compensated"  # the tag was deleted
    assert_untouched()

    (repo / "VERSION").write_text("dirty\n")
    refused = s.run(plan, {**common, "version": "1.3.0",
                           "test_argv": [sys.executable, "-c", "raise SystemExit(1)"]})
    assert refused.status == "failed" and refused.failed_step == "stop"
    message = refused.error["message"]
    assert "the working tree has changes" in message and "the tests failed" in message
    assert "CHANGELOG.md is missing or does not mention 1.3.0" in message
    assert "bump" not in refused.steps
    tagged = s.run(plan, {**common, "version": "1.1.0"})
    assert tagged.status == "failed" and "tag v1.1.0 already exists" in tagged.error["message"]


# -- mcp-tools -------------------------------------------------------------------------------

def test_mcp_tools_calls_the_configured_server_and_deletes_the_key_on_failure(
        tmp_path: Path, make_saga: SagaFactory) -> None:
    config = tmp_path / "saga.toml"
    config.write_text(f'[mcp.servers.demo]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n')
    settings = load_settings(env={"SAGA_CONFIG": str(config)}, cwd=tmp_path)
    assert settings.file["mcp"]["servers"]["demo"]["args"] == [SERVER]
    s = make_saga(dataclasses.replace(settings, home=tmp_path / ".saga"), **settings.file)
    run = run_template(s, "mcp-tools", key="greeting", value="hello", a=20, b=22)
    assert run.status == "completed", run.error
    assert run.outputs == {"echo": "ping greeting", "stored": "hello", "sum": 42}
    kv_get = s.registry.get("mcp.demo.kv_get")
    assert kv_get.source == "mcp:demo"

    failed = run_template(s, "mcp-tools", key="draft", value="temporary", fail_after_put=True)
    assert failed.status == "compensated" and failed.failed_step == "simulate"
    assert failed.error["type"] == "MCPError"
    assert step_status(failed, "put") == "compensated"
    assert failed.steps["read"]["output"] == {"result": "temporary"}
    after = run_template(s, "mcp-tools", key="probe", value="x")  # the same server process
    assert after.status == "completed"
    check = s.run(s.load({"name": "probe", "steps": [
        {"id": "kept", "tool": "mcp.demo.kv_get", "args": {"key": "greeting"}},
        {"id": "gone", "tool": "mcp.demo.kv_get", "args": {"key": "draft"}}]}))
    assert check.steps["kept"]["output"] == {"result": "hello"}
    assert check.steps["gone"]["output"] == {"result": None}
