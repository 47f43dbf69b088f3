"""The side table of tools' last heartbeats (saga.store.heartbeats): the newest attempt's
row wins, its details are sealed when payloads are encrypted at rest, and retention
deletes a run's rows while it redacts the details its log recorded."""

from __future__ import annotations

import base64
import os
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from saga import Saga, audit
from saga.config import Settings
from saga.tools import load_registry

BEAT = {"done": 40, "note": "SECRETBEAT4471"}


def test_the_newest_attempt_of_each_step_execution_is_kept(settings: Settings) -> None:
    with Saga(settings) as saga:
        table = saga.heartbeats
        table.put("RUN-1", "copy", 2, BEAT, 7, "2026-01-01T00:00:00+00:00", "w1")
        table.put("RUN-1", "copy", 1, {"done": 99}, 9, None, "w0")  # an abandoned call, late
        table.put("RUN-1", "loop[2]", 1, [1, 2], 1, None)
        rows = table.of_run("RUN-1")
        assert rows["copy"] == {"attempt": 2, "details": BEAT, "beats": 7,
                                "at": "2026-01-01T00:00:00+00:00", "worker": "w1"}
        assert rows["loop[2]"]["details"] == [1, 2]
        assert table.of_run("RUN-2") == {}
        assert table.forget("RUN-1") == 2
        assert table.of_run("RUN-1") == {}


def test_details_are_sealed_at_rest(sqlite_settings: Settings) -> None:
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    with Saga(replace(sqlite_settings, encryption_key=key)) as saga:
        saga.heartbeats.put("RUN-1", "copy", 1, BEAT, 1, None)
        assert saga.heartbeats.of_run("RUN-1")["copy"]["details"] == BEAT
    with sqlite3.connect(sqlite_settings.home / "saga.db") as conn:
        [(stored,)] = conn.execute("SELECT details FROM saga_heartbeats").fetchall()
    assert "SECRETBEAT4471" not in stored and "_sealed_" in stored
    with Saga(sqlite_settings) as keyless:  # no key here: nothing to show, no error
        assert keyless.heartbeats.of_run("RUN-1")["copy"]["details"] is None


def test_retention_deletes_a_runs_heartbeats_and_redacts_their_details(
        sqlite_settings: Settings) -> None:
    definition = {"name": "beats", "steps": [
        {"id": "copy", "tool": "beating", "parameters": {"count": 2, "pause": 0}}]}
    with Saga(sqlite_settings, registry=load_registry(["tests.standins.beating"])) as saga:
        run = saga.run(saga.load(definition))
        saga.heartbeats.put(run.run_id, "copy", 1, BEAT, 2, None)  # as a live beat left it
        saga.heartbeats.put("OTHER", "copy", 1, BEAT, 2, None)
    later = datetime.now(UTC) + timedelta(days=2)
    assert audit.apply_retention(sqlite_settings, 1, now=later) == [run.run_id]
    with Saga(sqlite_settings) as saga:
        assert saga.heartbeats.of_run(run.run_id) == {}
        assert saga.heartbeats.of_run("OTHER") != {}  # not a finished run's
        [recorded] = [e["payload"] for e in saga.history(run.run_id)
                      if e["type"] == "HeartbeatRecorded"]
        assert recorded["details"] == {"_redacted": True}
    [verdict] = audit.verify_store(sqlite_settings, [run.run_id])
    assert verdict.ok and verdict.redacted >= 1, verdict
