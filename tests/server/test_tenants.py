"""Issue 43: tenants with scoped tokens. ``saga token create`` in one process, ``saga
serve`` in another, and requests with each scope over HTTP, on SQLite and PostgreSQL:
read cannot start, operate cannot manage tokens or schedules, admin can; another
tenant's run is a 404; an expired and a revoked token are refused; an approval made
with a token is recorded with the token's id (seen by ``saga history`` and ``saga
report`` in new processes); and the token table keeps no secret."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from saga.config import Settings
from saga.store.side_tables import Database
from saga.store.tokens import TokenStore
from tests.server.conftest import ROOT, Server, store_env

GATED = {"name": "gated", "steps": [
    {"id": "build", "tool": "act", "args": {"value": 1}},
    {"id": "deploy", "tool": "act", "args": {"value": 2}, "confirm": "ship it?"}]}


def saga(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def token(env: dict[str, str], tenant: str, scope: str) -> tuple[str, str]:
    """A token made by ``saga token create`` in a process of its own: (id, secret)."""
    made = saga(env, "token", "create", "--tenant", tenant, "--scope", scope, "--json")
    assert made.returncode == 0, made.stderr
    found = json.loads(made.stdout)
    return found["id"], found["secret"]


@pytest.fixture
def tenants(settings: Settings, tmp_path: Path) -> Iterator[tuple[Settings, dict[str, str]]]:
    """Two tenants, acme and beta, each a store of its own (a schema, or a file)."""
    schemas = [f"t_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    config = tmp_path / "saga.toml"
    if settings.is_postgres:
        config.write_text("".join(f'[tenants.{n}]\nschema = "{s}"\n'
                                  for n, s in zip(("acme", "beta"), schemas, strict=True)))
    else:
        config.write_text("[tenants.acme]\n[tenants.beta]\n")
    yield settings, store_env(settings, SAGA_CONFIG=str(config), SAGA_ACTOR="ops")
    if settings.is_postgres:
        import psycopg

        with psycopg.connect(settings.database_url or "", autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def stored_rows(settings: Settings) -> list[tuple[Any, ...]]:
    if settings.is_postgres:
        import psycopg

        with psycopg.connect(settings.database_url or "") as conn:
            return list(conn.execute(f'SELECT * FROM "{settings.schema}".saga_tokens'))
    with sqlite3.connect(settings.home / "saga.db") as conn:
        return list(conn.execute("SELECT * FROM saga_tokens"))


def test_scopes_tenants_and_the_recorded_actor(
        tenants: tuple[Settings, dict[str, str]]) -> None:
    settings, env = tenants
    ids, secrets = {}, {}
    for tenant, scope in (("acme", "read"), ("acme", "operate"), ("acme", "admin"),
                          ("beta", "admin")):
        ids[tenant, scope], secrets[tenant, scope] = token(env, tenant, scope)
    server = Server(settings, env).start()
    try:
        def client(tenant: str, scope: str) -> Any:
            return server.client(secrets[tenant, scope])

        with client("acme", "read") as read, client("acme", "operate") as operate, \
                client("acme", "admin") as admin, client("beta", "admin") as beta:
            # read reads, and cannot start
            assert read.get("/api/v1/runs").status_code == 200
            assert read.post("/api/v1/runs", json={"template": "quickstart"}
                             ).status_code == 403
            # operate starts; it may not manage tokens or schedules
            run_id = operate.post("/api/v1/runs", json={"composition": GATED}).json()["run_id"]
            server.wait_for(operate, run_id, lambda r: bool(r.get("waiting_for")))
            assert operate.get("/api/v1/tokens").status_code == 403
            assert operate.post("/api/v1/tokens", json={"scope": "read"}).status_code == 403
            assert operate.delete("/api/v1/schedules/nightly").status_code == 403
            # an agent's run through the seed API keeps the token on the record too
            agent = operate.post("/api/composition/execute", json={
                "workflow_id": "w", "agent_id": "agent-7", "steps": [
                    {"step_id": "a", "skill_id": "echo", "inputs": {}, "dependencies": []}]})
            assert agent.json()["agent_id"] == \
                f"token:{ids['acme', 'operate']}:acme-operate:agent-7", agent.text
            # admin may
            listed = admin.get("/api/v1/tokens")
            assert listed.status_code == 200
            assert {t["id"] for t in listed.json()} == {ids["acme", s] for s in
                                                        ("read", "operate", "admin")}
            made = admin.post("/api/v1/tokens", json={"scope": "read", "expires": "1d"})
            assert made.status_code == 201 and made.json()["tenant"] == "acme"
            assert admin.get("/api/v1/schedules").status_code == 200
            assert admin.delete("/api/v1/schedules/nightly").status_code == 404  # none
            # another tenant's run is not found, whatever the scope, and its tokens too
            assert beta.get(f"/api/v1/runs/{run_id}").status_code == 404
            assert beta.get("/api/v1/sessions").status_code == 403  # every tenant's
            assert read.get("/metrics").status_code == 403  # counts every tenant's runs
            assert beta.get("/api/v1/report?tenant=acme").status_code == 404
            assert beta.post(f"/api/v1/runs/{run_id}/approve/deploy", json={}
                             ).status_code == 404
            assert beta.delete(f"/api/v1/tokens/{ids['acme', 'read']}").status_code == 404
            # the viewer shows the tenant (its header asks whoami)
            assert beta.get("/api/v1/whoami").json()["tenant"] == "beta"
            assert 'id="tenant"' in beta.get("/", headers={"Accept": "text/html"}).text
            # the approval made with the operate token names that token
            approved = operate.post(f"/api/v1/runs/{run_id}/approve/deploy", json={})
            assert approved.status_code == 200, approved.text
            assert server.wait_for(operate, run_id)["status"] == "completed"
            # the API's report is the tenant's, and says who approved
            approver = f"token:{ids['acme', 'operate']}:acme-operate"
            api_report = read.get("/api/v1/report?tenant=acme").json()
            assert api_report["filters"]["tenant"] == "acme"
            assert [a["actor"] for a in api_report["actions"]
                    if a["action"] == "approved"] == [approver]
            # a revoked token is refused from then on
            revoked = saga(env, "token", "revoke", ids["acme", "read"])
            assert revoked.returncode == 0, revoked.stderr
            assert read.get("/api/v1/runs").status_code == 401
        # an expired token is refused
        store = TokenStore(Database(settings))
        try:
            _, expired = store.create("acme", "admin", expires=timedelta(minutes=1),
                                      now=datetime.now(UTC) - timedelta(hours=1))
        finally:
            store.db.close()
        with server.client(expired) as old:
            assert old.get("/api/v1/runs").status_code == 401
    finally:
        server.stop()

    # new processes read what the server recorded: the approval's actor names the token
    actor = f"token:{ids['acme', 'operate']}:acme-operate"
    history = saga({**env, "SAGA_TENANT": "acme"}, "history", run_id, "--json")
    assert history.returncode == 0, history.stderr
    assert [e["payload"].get("actor") for e in json.loads(history.stdout)
            if e["type"] == "ApprovalGranted"] == [actor]
    # the actor is in the run's hash chain, which verifies
    verified = saga({**env, "SAGA_TENANT": "acme"}, "audit", "verify", run_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    report = saga(env, "report", "--tenant", "acme", "--format", "json")
    assert report.returncode == 0, report.stderr
    built = json.loads(report.stdout)
    assert built["filters"]["tenant"] == "acme"
    assert {"action": "approved", "actor": actor} in [
        {"action": a["action"], "actor": a["actor"]} for a in built["actions"]]
    # the default tenant's store holds none of acme's runs
    assert saga(env, "history", run_id, "--json").returncode == 4
    listed = json.loads(saga(env, "token", "list", "--json").stdout)
    assert {t["id"]: t["state"] for t in listed}[ids["acme", "read"]] == "revoked"

    # the table keeps a digest of each secret, never the secret
    rows = stored_rows(settings)
    cells = [str(c) for row in rows for c in row]
    for secret in secrets.values():
        random = secret.split("_", 2)[2]
        assert not any(random in c for c in cells)
        assert hashlib.sha256(random.encode()).hexdigest() in cells


def test_where_each_tenant_is_stored(tmp_path: Path) -> None:
    from saga.config import load_settings, tenant_names, tenant_settings
    from saga.errors import ConfigError

    (tmp_path / "saga.toml").write_text(
        '[tenants.acme]\n[tenants.globex]\nschema = "gx"\n'
        'database_url = "postgresql://saga@db2:5432/saga"\n')
    lite = load_settings({"SAGA_HOME": str(tmp_path / "h")}, cwd=tmp_path)
    assert tenant_names(lite) == ["default", "acme", "globex"]
    assert tenant_settings(lite, "default") is lite
    acme = tenant_settings(lite, "acme")
    assert (acme.tenant, acme.home, acme.is_postgres) == ("acme", tmp_path / "h/tenants/acme",
                                                          False)
    globex = tenant_settings(lite, "globex")
    assert (globex.database_url, globex.schema) == ("postgresql://saga@db2:5432/saga", "gx")
    pg = load_settings({"SAGA_DATABASE_URL": "postgresql://saga@db1:5432/saga",
                        "SAGA_DATABASE_SCHEMA": "main", "SAGA_TENANT": "acme"}, cwd=tmp_path)
    assert (pg.tenant, pg.database_url, pg.schema) == (
        "acme", "postgresql://saga@db1:5432/saga", "tenant_acme")
    from saga.server.app import create_app

    with pytest.raises(ConfigError, match="leave SAGA_TENANT unset"):
        create_app(acme)
    with pytest.raises(ConfigError, match="no tenant 'nope'"):
        tenant_settings(lite, "nope")
    (tmp_path / "saga.toml").write_text("[tenants.default]\n")
    with pytest.raises(ConfigError, match="the configured store itself"):
        tenant_names(load_settings({}, cwd=tmp_path))
