"""Payloads encrypted at rest (saga.store.encryption), read, verified, rotated and shredded
by new processes, on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.persistence import StoredEvent

from saga.config import Settings
from saga.store import encryption
from saga.store.application import SagaApplication
from saga.store.side_tables import Database

SECRET_IN = "INPUTPLAINTEXT7391"
SECRET_OUT = "OUTPUTPLAINTEXT5128"
FLOW = """name: sealed
inputs:
  who: {type: string}
  tag: {type: string}
steps:
  - {id: a, tool: echo, args: {greeting: "hi {{ inputs.who }}", extra: "{{ inputs.tag }}"}}
  - {id: b, tool: echo, args: {again: "{{ a.extra }}"}}
  - {id: c, tool: echo, args: {n: 3}}
  - {id: kept, tool: echo, args: {hidden: "{{ inputs.tag }}"}, secret_outputs: true}
  - {id: cached, tool: echo, args: {memo: "{{ inputs.who }}"}, cache: 600}
"""


def _key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


def cli(settings: Settings, cwd: Path, *args: str, key: str | None,
        **extra: str) -> subprocess.CompletedProcess[str]:
    """``saga ARGS`` in a new process on the test's store, with the encryption key in
    ``SAGA_KEY`` when given (else the variable named is unset)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_ACTOR": "ops", "SAGA_AUDIT_KEY": "audit-key", "SAGA_SNAPSHOT_INTERVAL": "2",
            "SAGA_ENCRYPTION_KEY_ENV": "SAGA_KEY", **extra}
    if key is not None:
        env["SAGA_KEY"] = key
    if settings.is_postgres:
        env |= {"SAGA_DATABASE_URL": str(settings.database_url),
                "SAGA_DATABASE_SCHEMA": str(settings.schema)}
    else:
        env["SAGA_HOME"] = str(settings.home)
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def side_rows(settings: Settings) -> bytes:
    """The undo store's and the cache's rows, as the database holds them."""
    db = Database(settings)
    try:
        return "".join(f"{dict(r)}" for table in ("saga_undo", "saga_cache")
                       for r in db.query(f"SELECT * FROM {table}")).encode()
    finally:
        db.close()


def raw_rows(settings: Settings) -> list[tuple[str, int, str, bytes]]:
    """Every stored event and snapshot row, as the database holds it."""
    events, snapshots = ("saga_events", "saga_snapshots") if settings.is_postgres else \
        ("stored_events", "stored_snapshots")
    db = Database(settings)
    try:
        return [(str(r["originator_id"]), int(r["originator_version"]), str(r["topic"]),
                 bytes(r["state"]) if not isinstance(r["state"], str) else r["state"].encode())
                for table in (events, snapshots)
                for r in db.query(f"SELECT originator_id, originator_version, topic, state "
                                  f"FROM {table}")]
    finally:
        db.close()


def start(settings: Settings, tmp_path: Path, key: str) -> str:
    flow = tmp_path / "sealed.yaml"
    flow.write_text(FLOW)
    out = ok(cli(settings, tmp_path, "run", str(flow), "--input", f"who={SECRET_IN}",
                 "--input", f"tag={SECRET_OUT}", "--json", key=key))
    run = json.loads(out)
    assert run["status"] == "completed"
    return str(run["run_id"])


def test_sealed_at_rest_and_read_by_new_processes(settings: Settings, tmp_path: Path) -> None:
    key = _key()
    run_id = start(settings, tmp_path, key)
    rows = raw_rows(settings)
    assert any("Snapshot" in topic for _, _, topic, _ in rows)  # snapshots are sealed too
    stored = b"".join(state for *_, state in rows)
    assert b"_sealed_" in stored
    assert SECRET_IN.encode() not in stored and SECRET_OUT.encode() not in stored
    side = side_rows(settings)  # the undo store and the cache are sealed with the run's key
    assert side.count(b"_sealed_") == 2
    assert SECRET_IN.encode() not in side and SECRET_OUT.encode() not in side
    if not settings.is_postgres:  # nor anywhere in the database file
        files = b"".join(p.read_bytes() for p in settings.home.glob("saga.db*"))
        assert SECRET_IN.encode() not in files and SECRET_OUT.encode() not in files
    # The read model needs no sealed value: a process without the key catches it up.
    listed = json.loads(ok(cli(settings, tmp_path, "list", "--json", key=None)))
    assert [r["run_id"] for r in listed] == [run_id] and listed[0]["status"] == "completed"
    # A new process with the key reads the run, its history and replays it.
    status = json.loads(ok(cli(settings, tmp_path, "status", run_id, "--json", key=key)))
    assert status["status"] == "completed"
    history = ok(cli(settings, tmp_path, "history", run_id, "--json", key=key))
    assert SECRET_IN in history and SECRET_OUT in history
    ok(cli(settings, tmp_path, "replay", run_id, "--verify", key=key))
    assert "ok" in ok(cli(settings, tmp_path, "audit", "verify", run_id, key=key))
    # A second run reuses the cached output, opened with the first run's data key.
    again = start(settings, tmp_path, key)
    events = json.loads(ok(cli(settings, tmp_path, "history", again, "--json", key=key)))
    hit = next(e for e in events if e["type"] == "StepCompleted"
               and e["step_id"] == "cached")
    assert hit["payload"]["cache"] and hit["payload"]["output"] == {"memo": SECRET_IN}
    # Without the key: the chain verifies, the history is one clear error.
    assert "ok" in ok(cli(settings, tmp_path, "audit", "verify", run_id, key=None))
    exported = tmp_path / "run.json"  # an export verifies offline, sealed as stored
    exported.write_text(ok(cli(settings, tmp_path, "export", run_id, key=None)))
    assert SECRET_IN not in exported.read_text()
    assert "ok" in ok(cli(settings, tmp_path, "audit", "verify", "--file", str(exported),
                          key=None))
    refused = cli(settings, tmp_path, "history", run_id, key=None)
    assert refused.returncode == 2
    assert "encrypted at rest" in refused.stderr and "Traceback" not in refused.stderr


def test_a_changed_ciphertext_breaks_the_chain_without_the_key(settings: Settings,
                                                               tmp_path: Path) -> None:
    key = _key()
    run_id = start(settings, tmp_path, key)
    events = "saga_events" if settings.is_postgres else "stored_events"
    db = Database(settings)
    try:
        where = "originator_id = ?"
        oid: Any = run_id if db.pg else run_id.replace("-", "")
        row = db.query(f"SELECT state FROM {events} WHERE {where} AND originator_version = 3",
                       (oid,))[0]
        state = json.loads(bytes(row["state"]) if not isinstance(row["state"], str)
                           else row["state"])
        sealed = base64.b64decode(state["output"]["_sealed_"])
        state["output"]["_sealed_"] = base64.b64encode(
            sealed[:-1] + bytes([sealed[-1] ^ 1])).decode()
        db.execute(f"UPDATE {events} SET state = ? WHERE {where} AND originator_version = 3",
                   (json.dumps(state, separators=(",", ":")).encode(), oid))
    finally:
        db.close()
    broken = cli(settings, tmp_path, "audit", "verify", run_id, key=None,
                 SAGA_AUDIT_KEY="")
    assert broken.returncode != 0
    assert "BROKEN at event 3" in broken.stdout and "payload edited" in broken.stdout


def test_rotation_then_shredding(settings: Settings, tmp_path: Path) -> None:
    old, new = _key(), _key()
    run_id = start(settings, tmp_path, old)
    before = raw_rows(settings)  # a backup of the events, taken before the shred
    copy = tmp_path / "backup"
    if not settings.is_postgres:
        copy.mkdir()
        for path in settings.home.glob("saga.db*"):
            shutil.copy(path, copy / path.name)
    # Rotation rewraps the data keys: the events read with the new key only.
    rotated = json.loads(ok(cli(settings, tmp_path, "keys", "rotate", "--new-key-env",
                                "NEW_KEY", "--json", key=old, NEW_KEY=new)))
    assert rotated["rewrapped"] >= 1 and rotated["key_env"] == "NEW_KEY"
    generated = json.loads(ok(cli(settings, tmp_path, "keys", "generate", "--json", key=None)))
    assert generated["key_id"] not in {rotated["key_id"], generated["key"]}
    assert before == raw_rows(settings)  # no event was rewritten
    assert SECRET_OUT in ok(cli(settings, tmp_path, "history", run_id, key=new))
    stale = cli(settings, tmp_path, "history", run_id, key=old)
    assert stale.returncode == 2 and "rotated" in stale.stderr
    # Shredding deletes the run's data key; the chain and the report's rows remain.
    assert run_id in ok(cli(settings, tmp_path, "retention", "apply", "--older-than", "0",
                            "--shred", key=new))
    assert "ok" in ok(cli(settings, tmp_path, "audit", "verify", run_id, key=new))
    assert "ok" in ok(cli(settings, tmp_path, "audit", "verify", run_id, key=None))
    history = json.loads(ok(cli(settings, tmp_path, "history", run_id, "--json", key=new)))
    assert [e["type"] for e in history][:2] == ["RunStarted", "StepStarted"]
    assert history[0]["payload"]["inputs"] == {"_redacted": True, "_shredded": True}
    assert SECRET_IN not in json.dumps(history) and SECRET_OUT not in json.dumps(history)
    replayed = cli(settings, tmp_path, "replay", run_id, "--verify", key=new)
    assert replayed.returncode == 2 and "redacted" in replayed.stderr  # not a divergence
    report = json.loads(ok(cli(settings, tmp_path, "report", "--format", "json", key=new)))
    assert run_id in json.dumps(report)
    # The rows copied before the shred no longer open: the key is gone, not the rows.
    app = SagaApplication(replace(settings, encryption_key=new))
    try:
        for oid, version, topic, state in before:
            if "Snapshot" in topic:
                continue
            event = app.mapper.to_domain_event(StoredEvent(
                originator_id=app.recorder.convert_originator_id(oid)
                if hasattr(app.recorder, "convert_originator_id") else oid,
                originator_version=version, topic=topic, state=state))
            assert SECRET_IN not in json.dumps(vars(event), default=str)
            assert SECRET_OUT not in json.dumps(vars(event), default=str)
    finally:
        app.close()
    if not settings.is_postgres:  # the whole old database file, beside the live key table
        shutil.copy(settings.home / "keys.db", copy / "keys.db")
        old_copy = cli(settings, tmp_path, "history", run_id, "--json", key=new,
                       SAGA_HOME=str(copy))
        assert SECRET_OUT not in ok(old_copy) and "_shredded" in old_copy.stdout


def test_the_api_opens_sealed_runs_with_the_key_only(sqlite_settings: Settings,
                                                     tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Over HTTP a server with the key reads a run in the clear, one without it answers
    one clear error, and a shredded run reads as the marker (never a crash)."""
    from fastapi.testclient import TestClient

    from saga.server.app import create_app

    key = _key()
    run_id = start(sqlite_settings, tmp_path, key)
    sqlite_settings = replace(sqlite_settings, audit_key="audit-key")

    def read(settings: Settings) -> tuple[int, Any]:
        with TestClient(create_app(settings, worker=False), base_url="http://127.0.0.1") as c:
            answer = c.get(f"/api/v1/runs/{run_id}/events")
            return answer.status_code, answer.json()

    code, events = read(replace(sqlite_settings, encryption_key=key))
    assert code == 200 and SECRET_IN in json.dumps(events)
    code, refused = read(replace(sqlite_settings, encryption_key=""))
    assert code == 422 and refused["error"] == "EncryptionKeyError"
    assert "encrypted at rest" in refused["detail"]
    ok(cli(sqlite_settings, tmp_path, "retention", "apply", "--older-than", "0", "--shred",
           key=key))
    # Another process shredded it: this one reads the key table again (as a long-running
    # server does once its cached key is KEY_CACHE_SECONDS old).
    monkeypatch.setattr(encryption, "KEY_CACHE_SECONDS", 0.0)
    code, events = read(replace(sqlite_settings, encryption_key=key))
    assert code == 200 and SECRET_IN not in json.dumps(events)
    assert '"_shredded": true' in json.dumps(events)


def test_the_key_comes_from_the_variable_named_or_a_key_file(tmp_path: Path) -> None:
    from saga.config import load_settings
    from saga.errors import ConfigError
    from saga.store.encryption import Sealer

    key = _key()
    named = load_settings({"SAGA_ENCRYPTION_KEY_ENV": "MY_KEK", "MY_KEK": key}, cwd=tmp_path)
    assert named.encryption_key == key and key not in repr(named)
    assert load_settings({"SAGA_ENCRYPTION_KEY_ENV": "MY_KEK"}, cwd=tmp_path) \
        .encryption_key == ""  # named, not set here: configured, not available
    assert load_settings({}, cwd=tmp_path).encryption_key is None
    (tmp_path / "kek").write_text(key + "\n")
    (tmp_path / "saga.toml").write_text('[encryption]\nkey_file = "kek"\n')
    assert load_settings({}, cwd=tmp_path).encryption_key == key
    (tmp_path / "saga.toml").write_text('[encryption]\nkey_env = "TOML_KEK"\n')
    assert load_settings({"TOML_KEK": key}, cwd=tmp_path).encryption_key == key
    from saga.audit.chain import REDACTABLE
    from saga.store.encryption import SEALED

    # what is sealed is what retention redacts: the user data, and nothing the chain needs
    assert {k: v for k, v in SEALED.items() if k != "Snapshot"} == REDACTABLE
    with pytest.raises(ConfigError, match="32 bytes"):
        Sealer(replace(named, encryption_key="c2hvcnQ="))
