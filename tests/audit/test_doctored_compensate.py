"""A doctored snapshot never stops a compensation half-way: another process's
``saga compensate`` undoes every step from the events and the run ends compensated."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from saga.api import Saga
from saga.config import Settings
from saga.store.side_tables import Database
from tests.audit.test_chain import snapshot_rows
from tests.server.conftest import store_env


def test_compensate_goes_on_from_the_events_past_a_doctored_snapshot(
        settings: Settings, tmp_path: Path) -> None:
    undo = tmp_path / "undone.txt"

    def step(name: str) -> dict[str, object]:
        return {"id": name, "tool": "echo", "args": {"v": name}, "compensate": {
            "tool": "file", "args": {"action": "append", "path": str(undo),
                                     "content": name + "\n"}}}
    keyed = replace(settings, audit_key="k3y", snapshot_interval=2)
    with Saga(keyed) as s:
        run_id = s.run(s.load({"name": "undoable", "steps": [
            step("a"), step("b"), step("c")]})).run_id
    db: Database
    db, table, key = snapshot_rows(keyed, run_id)
    try:  # every snapshot edited, its seal left as it was
        for row in db.query(f"SELECT originator_version, state FROM {table} "
                            "WHERE originator_id = ?", (key,)):
            state = json.loads(bytes(row["state"]))
            state["state"]["steps"]["a"]["parameters"] = {"v": "attacker"}
            db.execute(f"UPDATE {table} SET state = ? WHERE originator_id = ? AND "
                       "originator_version = ?", (json.dumps(state).encode(), key,
                                                  row["originator_version"]))
    finally:
        db.close()
    env = store_env(keyed, SAGA_AUDIT_KEY="k3y", SAGA_SNAPSHOT_INTERVAL="2")
    done = subprocess.run([sys.executable, "-m", "saga.cli", "compensate", run_id],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert "does not match its seal" not in done.stderr.splitlines()[-1], done.stderr
    status = subprocess.run([sys.executable, "-m", "saga.cli", "status", run_id, "--json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert json.loads(status.stdout)["status"] == "compensated", status.stdout
    assert undo.read_text(encoding="utf-8").split() == ["c", "b", "a"]  # each once
