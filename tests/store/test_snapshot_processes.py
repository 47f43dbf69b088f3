"""A run past its snapshots, written by one process, is read and moved by new ones.

Snapshots are a cache (DESIGN.md, promise 6): a process that never took one (a CLI
command, another worker, a restarted service) must still resolve a stored snapshot, and
one it cannot use must never stop it from reading the run.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

from saga.api import Saga
from saga.config import Settings


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["SAGA_ACTOR"] = "ops"
    if settings.database_url:
        env |= {"SAGA_DATABASE_URL": settings.database_url,
                "SAGA_DATABASE_SCHEMA": str(settings.schema)}
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], env=_env(settings),
                          capture_output=True, text=True, timeout=120)


def test_a_long_waiting_run_is_read_approved_and_finished_by_new_processes(
        settings: Settings) -> None:
    steps: list[dict[str, object]] = [{"id": f"s{i}", "tool": "noop"} for i in range(120)]
    steps.append({"id": "gate", "tool": "noop", "confirm": "ship it?"})
    definition = {"name": "long", "steps": steps}
    saga = Saga(settings)
    try:
        run_id = saga.run(saga.load(definition)).run_id  # waits at the gate
        app = saga.app
        assert app.snapshots is not None and app.snapshots.recorder.select_events(  # type: ignore[attr-defined]
            app.get_run(run_id).id), "the run is long enough to have a snapshot"
    finally:
        saga.close()

    status = _cli(settings, "status", run_id, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["status"] == "waiting"
    approved = _cli(settings, "approve", run_id, "gate")
    assert approved.returncode == 0, approved.stderr
    worker = _cli(settings, "worker", "--until-idle", "--poll", "0.05")
    assert worker.returncode == 0, worker.stderr
    final = json.loads(_cli(settings, "status", run_id, "--json").stdout)
    assert final["status"] == "completed"
    for check in (["replay", run_id, "--verify"], ["audit", "verify", "--all"],
                  ["history", run_id, "--json"], ["report", "--definition", "long"]):
        done = _cli(settings, *check)
        assert done.returncode == 0, (check, done.stderr)


def test_an_unreadable_snapshot_is_rebuilt_from_the_events(sqlite_settings: Settings) -> None:
    """A snapshot whose topic no longer resolves (a class renamed since) is passed over."""
    saga = Saga(sqlite_settings)
    try:
        run_id = saga.run(saga.load(
            {"name": "chain", "steps": [{"id": f"s{i}", "tool": "noop"}
                                        for i in range(60)]})).run_id
        table = saga.app.snapshots.recorder.events_table_name  # type: ignore[union-attr]
    finally:
        saga.close()
    with sqlite3.connect(sqlite_settings.home / "saga.db") as db:
        assert db.execute(f"UPDATE {table} SET topic = 'saga.Run.Gone'").rowcount > 0
    again = Saga(sqlite_settings)
    try:
        assert again.status(run_id)["status"] == "completed"
    finally:
        again.close()
