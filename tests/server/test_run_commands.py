"""Pause, unpause and cancel over HTTP while the service's own worker runs a step (a real
``saga serve``, SQLite and PostgreSQL), counting the tools' calls."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from saga.config import Settings
from tests.server.conftest import Server, store_env


def phases(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [(c["step"], c["phase"]) for c in map(json.loads, log.read_text().splitlines())]


def wait_for(what: str, condition: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_pause_unpause_and_cancel_while_a_step_runs(settings: Settings, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    server = Server(settings, store_env(settings, SAGA_TEST_CALL_LOG=str(log))).start()
    try:
        with server.client() as c:
            flow = {"name": "lingers", "steps": [
                {"id": "slow", "tool": "linger", "args": {"seconds": 1.5}},
                {"id": "after", "tool": "linger_async", "args": {"seconds": 30},
                 "depends_on": ["slow"]}]}
            run_id = c.post("/api/v1/runs", json={"composition": flow}).json()["run_id"]
            wait_for("slow runs", lambda: ("slow", "began") in phases(log))
            assert c.post(f"/api/v1/runs/{run_id}/pause").json()["status"] == "paused"
            # The attempt in flight finishes and is recorded; nothing new starts.
            paused = server.wait_for(c, run_id, lambda r: r["steps"]["slow"]["status"]
                                     == "completed")
            assert paused["status"] == "paused" and "after" not in paused["steps"]
            assert c.post(f"/api/v1/runs/{run_id}/unpause").status_code == 200
            wait_for("after runs", lambda: ("after", "began") in phases(log))
            assert c.post(f"/api/v1/runs/{run_id}/cancel", json={"reason": "enough"}
                          ).status_code == 200
            # The 30 s call is cut short (an async tool stops), not waited for.
            done = server.wait_for(c, run_id, seconds=15)
            assert done["status"] == "cancelled"
            assert done["steps"]["after"]["error"]["type"] == "RunCancelled"
            assert "enough" in done["steps"]["after"]["error"]["message"]
            types = [e["type"] for e in c.get(f"/api/v1/runs/{run_id}/events").json()]
        assert phases(log) == [("slow", "began"), ("slow", "returned"), ("after", "began")]
        assert "RunTakenOver" not in types
    finally:
        server.stop()
