"""The undo store: what a tool records only to undo a step (a file's previous bytes, rows
captured before an update, a whole ``secret_outputs`` output) is kept in ``saga_undo``,
encrypted with ``SAGA_UNDO_KEY`` when set, never in the chained log, an export, a report
or the history; a compensation refuses undo state that is not what the step recorded.
Both stores (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.fernet import Fernet

from saga import Saga
from saga.cli import main
from saga.config import Settings
from saga.errors import ConfigError, DefinitionError
from saga.store import Database
from saga.tools import Tool, load_registry
from tests.tools.test_common import FAIL, chain

SECRET = "TOPSECRET42"
ORIGINAL = f"# app settings\nuser=admin\npassword={SECRET}\nname=Zoë\n".encode()
KEY = Fernet.generate_key().decode()


def make(settings: Settings, tmp_path: Path, key: str | None,
         tools: tuple[Tool, ...] = ()) -> Saga:
    settings = dataclasses.replace(settings, undo_key=key, file={
        "file": {"root": str(tmp_path)},
        "sql": {"connections": {"app": f"sqlite:///{tmp_path / 'app.db'}"}}})
    registry = load_registry((), settings=settings)
    for t in tools:
        registry.add(t)
    return Saga(settings, registry=registry)


def edit(path: Path, *then: dict[str, Any]) -> dict[str, Any]:
    return chain({"id": "edit", "tool": "file",
                  "args": {"action": "write", "path": str(path), "content": "password=new\n"}},
                 *then)


def raw_tables(settings: Settings) -> dict[str, bytes]:
    """Every table of the store, every value of every row, as bytes."""
    db = Database(settings)
    try:
        if db.pg:
            names = [r["table_name"] for r in db.query(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = current_schema()")]
        else:
            names = [r["name"] for r in db.query(
                "SELECT name FROM sqlite_master WHERE type = 'table'")]
        out = {}
        for name in names:
            values = [v for row in db.query(f"SELECT * FROM {name}") for v in row.values()]
            out[name] = b"\n".join(bytes(v) if isinstance(v, bytes | memoryview) else
                                   str(v).encode() for v in values)
        return out
    finally:
        db.close()


def sqlite_file_bytes(settings: Settings) -> bytes:
    """The SQLite store's files as they are on disk (the database, its WAL and journal)."""
    return b"".join(p.read_bytes() for p in settings.home.glob("saga.db*"))


def cli(settings: Settings, key: str | None, *args: str) -> str:
    env: dict[str, str | None] = {"SAGA_UNDO_KEY": key}
    if settings.is_postgres:
        env.update(SAGA_DATABASE_URL=settings.database_url, SAGA_DATABASE_SCHEMA=settings.schema)
    else:
        env.update(SAGA_HOME=str(settings.home), SAGA_DATABASE_URL=None)
    result = CliRunner().invoke(main, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(params=["plain", "encrypted"])
def key(request: pytest.FixtureRequest) -> Iterator[str | None]:
    yield KEY if request.param == "encrypted" else None


def test_a_secret_in_an_overwritten_file_never_enters_the_log_and_is_restored_exactly(
        settings: Settings, tmp_path: Path, key: str | None) -> None:
    config = tmp_path / "app.conf"
    config.write_bytes(ORIGINAL)
    with make(settings, tmp_path, key) as s:
        run = s.run(s.load(edit(config, FAIL)))
        run_id = run.run_id
        assert run.status == "compensated"
        assert config.read_bytes() == ORIGINAL  # restored byte for byte
        recorded = run.steps["edit"]["output"]
        assert set(recorded["_undo"]) == {"ref", "sha256"} and "previous" not in recorded
        assert recorded["existed"] is True
    tables = raw_tables(settings)
    events = "saga_events" if settings.is_postgres else "stored_events"
    assert b"password=new" in tables[events]  # the check can see what the log holds
    for name, data in tables.items():
        assert (SECRET.encode() in data) == (name == "saga_undo" and key is None), name
    if not settings.is_postgres and key is not None:
        assert SECRET.encode() not in sqlite_file_bytes(settings)
    exported = cli(settings, key, "export", run_id)
    history = cli(settings, key, "history", run_id, "--json")
    report = cli(settings, key, "report", "--format", "json")
    assert json.loads(exported)["run_id"] == run_id and run_id in report
    for text in (exported, history, report, cli(settings, key, "report", "--format", "md"),
                 cli(settings, key, "status", run_id, "--json")):
        assert SECRET not in text
    assert cli(settings, key, "audit", "verify", run_id)


def test_retention_clears_the_undo_state_of_the_runs_it_redacts(
        settings: Settings, tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from saga.audit import apply_retention

    config = tmp_path / "app.conf"
    config.write_bytes(ORIGINAL)
    with make(settings, tmp_path, None) as s:
        old = s.run(s.load(edit(config)))
        assert old.status == "completed"
    assert SECRET.encode() in raw_tables(settings)["saga_undo"]
    later = datetime.now(UTC) + timedelta(days=10)
    assert apply_retention(settings, 5, dry_run=True, now=later) == [old.run_id]
    assert SECRET.encode() in raw_tables(settings)["saga_undo"]  # a dry run keeps it
    assert apply_retention(settings, 5, now=later) == [old.run_id]
    assert raw_tables(settings)["saga_undo"] == b""
    if not settings.is_postgres:  # secure_delete: the freed pages hold no copy either
        assert SECRET.encode() not in sqlite_file_bytes(settings)


def tamper(settings: Settings, change: str, args: tuple[Any, ...] = ()) -> None:
    db = Database(settings)
    try:
        assert db.execute(f"UPDATE saga_undo SET {change}", args) == 1
    finally:
        db.close()


@pytest.mark.parametrize("how", ["edited", "swapped-for-plain", "deleted"])
def test_a_compensation_refuses_undo_state_that_was_changed(
        settings: Settings, tmp_path: Path, key: str | None, how: str) -> None:
    config = tmp_path / "app.conf"
    config.write_bytes(ORIGINAL)
    with make(settings, tmp_path, key) as s:
        run = s.run(s.load(edit(config)))
        assert run.status == "completed"
        if how == "edited" and key is None:
            forged = json.dumps({"previous": "password=attacker\n",
                                 "previous_encoding": "utf-8"}, separators=(",", ":"))
            tamper(settings, "data = ?", (forged,))
            expected = "UndoStateTampered"
        elif how == "edited":  # one character of the ciphertext
            tamper(settings, "data = substr(data, 1, 40) || CASE WHEN substr(data, 41, 1) = 'A' "
                   "THEN 'B' ELSE 'A' END || substr(data, 42)")
            expected = "UndoStateUnreadable"
        elif how == "swapped-for-plain":  # a row as a key-less saga would write it
            forged = json.dumps({"previous": "password=attacker\n"}, separators=(",", ":"))
            tamper(settings, "encrypted = 0, data = ?", (forged,))
            expected = "UndoStateTampered"
        else:
            db = Database(settings)
            db.execute("DELETE FROM saga_undo")
            db.close()
            expected = "UndoStateMissing"
        undone = s.compensate(run.run_id)
        assert undone.status == "failed" and undone.error["compensation_failed"] == ["edit"]
        failed = [e for e in s.history(run.run_id) if e["type"] == "CompensationFailed"]
        assert [e["payload"]["error_type"] for e in failed] == [expected]
    assert config.read_bytes() == b"password=new\n"  # nothing was written from forged state


def test_an_encrypted_row_needs_the_key_and_keys_rotate(settings: Settings,
                                                        tmp_path: Path) -> None:
    config = tmp_path / "app.conf"
    config.write_bytes(ORIGINAL)
    with make(settings, tmp_path, KEY) as s:
        run = s.run(s.load(edit(config)))
    with make(settings, tmp_path, None) as s:
        assert s.compensate(run.run_id).status == "failed"
        assert "UndoKeyMissing" in json.dumps(s.history(run.run_id)[-2:])
    assert config.read_bytes() == b"password=new\n"
    config.write_bytes(ORIGINAL)
    with make(settings, tmp_path, KEY) as s:
        run = s.run(s.load(edit(config)))
    newer = Fernet.generate_key().decode()
    with make(settings, tmp_path, f"{newer},{KEY}") as s:  # the new key first, the old kept
        assert s.compensate(run.run_id).status == "compensated"
    assert config.read_bytes() == ORIGINAL
    with pytest.raises(ConfigError, match="SAGA_UNDO_KEY"):
        make(settings, tmp_path, "not-a-key").run(s.load(edit(config)))


def test_sql_rows_captured_for_the_undo_stay_out_of_the_log(settings: Settings,
                                                            tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / "app.db")
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, password TEXT)")
    db.execute("INSERT INTO users VALUES (1, ?), (2, 'other')", (SECRET,))
    db.commit()
    step = {"id": "reset", "tool": "sql", "args": {
        "connection": "app",
        "statement": "UPDATE users SET password = :new WHERE id = :id",
        "params": {"id": 1, "new": "changed"},
        "undo_capture": {"statement": "SELECT id, password FROM users WHERE id = :id",
                         "params": {"id": 1}},
        "undo_statement": "UPDATE users SET password = :password WHERE id = :id"}}
    with make(settings, tmp_path, None) as s:
        run = s.run(s.load(chain(step, FAIL)))
        assert run.status == "compensated"
        assert run.steps["reset"]["output"]["rowcount"] == 1
        assert "_undo" in run.steps["reset"]["output"]
    assert db.execute("SELECT id, password FROM users ORDER BY id").fetchall() == [
        (1, SECRET), (2, "other")]
    db.close()
    tables = raw_tables(settings)
    assert SECRET.encode() in tables.pop("saga_undo")
    assert not [name for name, data in tables.items() if SECRET.encode() in data]


# -- secret_outputs ----------------------------------------------------------------------------

seen_by_undo: list[Any] = []


def _issue(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"token": f"tok-{SECRET}", "id": 7}


def _revoke(params: dict[str, Any], output: Any, ctx: Any) -> dict[str, Any]:
    seen_by_undo.append(output)
    return {"revoked": output["id"], "echo": output["token"]}


ISSUE = Tool("issue_token", _issue, _revoke, "returns a token", "test")


def test_secret_outputs_keep_the_whole_output_out_of_the_log(settings: Settings,
                                                             tmp_path: Path) -> None:
    seen_by_undo.clear()
    with make(settings, tmp_path, KEY, (ISSUE,)) as s:
        run = s.run(s.load(chain(
            {"id": "issue", "tool": "issue_token", "secret_outputs": True,
             "expect": "output.id == 7"}, FAIL)))
        assert run.status == "compensated"
        assert run.steps["issue"]["output"]["_secret_output"] is True
        assert seen_by_undo == [{"token": f"tok-{SECRET}", "id": 7}]  # the undo saw all of it
        events = s.history(run.run_id)
        assert [e["payload"]["output"] for e in events if e["type"] == "StepCompensated"] \
            == [{"_secret_output": True}]  # the undo's answer echoed the token: not recorded
        history = json.dumps(events)
        assert SECRET not in history and "_secret_output" in history
        failing = s.run(s.load(chain({"id": "issue", "tool": "issue_token",
                                      "secret_outputs": True, "expect": "output.id == 8"})))
        assert failing.steps["issue"]["error"]["type"] == "ExpectationFailed"
        assert SECRET not in json.dumps(s.history(failing.run_id))
    assert not [n for n, data in raw_tables(settings).items() if SECRET.encode() in data]


@pytest.mark.parametrize(("steps", "outputs", "problem"), [
    ([{"id": "issue", "tool": "issue_token", "secret_outputs": True},
      {"id": "use", "tool": "echo", "args": {"t": "{{ issue.token }}"}}], None,
     "references step 'issue': its output is kept out of the log"),
    ([{"id": "issue", "tool": "issue_token", "secret_outputs": True},
      {"id": "use", "tool": "echo", "when": "steps.issue.id == 7"}], None,
     "references step 'issue': its output is kept out of the log"),
    ([{"id": "issue", "tool": "issue_token", "secret_outputs": True}], {"t": "{{ issue }}"},
     "references step 'issue': its output is kept out of the log"),
    ([{"id": "issue", "tool": "issue_token", "secret_outputs": True,
       "compensate": {"tool": "echo", "args": {"id": "{{ output.id }}"}}}], None,
     "a compensate block cannot read it"),
    ([{"id": "c", "compute": "result = 1", "secret_outputs": True}], None,
     "needs a tool step"),
    ([{"id": "issue", "tool": "issue_token", "secret_outputs": True, "cache": 60}], None,
     "cannot be combined with 'cache'"),
])
def test_references_to_a_secret_output_are_refused_at_validation(
        sqlite_settings: Settings, tmp_path: Path, steps: list[dict[str, Any]],
        outputs: dict[str, Any] | None, problem: str) -> None:
    extra = {"outputs": outputs} if outputs else {}
    with make(sqlite_settings, tmp_path, None, (ISSUE,)) as s, \
            pytest.raises(DefinitionError, match=problem):
        s.load(chain(*steps, **extra))
