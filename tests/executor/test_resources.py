"""Resource limits driven in one process (``saga run``), on SQLite (the real processes of
test_resource_processes cover PostgreSQL too): parallel steps of one resource take
turns, a nested composition's step waits in its parent's drive past the hold, and the
``http`` tool counts against ``http:HOST`` by default."""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings, parse_resources
from saga.tools import Registry, Tool


@pytest.fixture
def limited(sqlite_settings: Settings, registry: Registry) -> Iterator[Saga]:
    s = Saga(dataclasses.replace(sqlite_settings, hold_seconds=1.0, resources=parse_resources(
        {"db": {"concurrency": 1}})), registry=registry.copy())
    yield s
    for _, run_id in s.app.run_ids():
        assert s.verify(run_id) is None
    s.close()


def starts_and_waits(s: Saga, run_id: str) -> list[tuple[str, str, list[str] | None]]:
    return [(e["type"], e["payload"]["step_id"], e["payload"].get("resources"))
            for e in s.history(run_id)
            if e["type"] in ("StepStarted", "StepCompleted", "StepWaitingForResource")]


class Overlap:
    """A tool that counts how many of its calls run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = self.calls = 0

    def __call__(self, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        with self.lock:
            self.now, self.calls = self.now + 1, self.calls + 1
            self.most = max(self.most, self.now)
        time.sleep(0.2)
        with self.lock:
            self.now -= 1
        return {}


def test_parallel_steps_of_one_resource_take_turns(limited: Saga) -> None:
    overlap = Overlap()
    limited.registry.add(Tool("overlap", overlap))
    plan = limited.load({"name": "turns", "steps": [
        {"id": k, "tool": "overlap", "resource": "db", "depends_on": []}
        for k in ("a", "b", "c")] + [
        {"id": "free", "tool": "echo", "args": {}, "resource": [], "depends_on": []}]})
    run = limited.run(plan)
    assert run.status == "completed"
    assert (overlap.calls, overlap.most) == (3, 1)  # one call of db at a time
    waits = {k for t, k, _ in starts_and_waits(limited, run.run_id)
             if t == "StepWaitingForResource"}
    assert len(waits) == 2 and waits < {"a", "b", "c"}
    assert "waiting_for_resources" not in limited.status(run.run_id)


def test_a_childs_step_waits_in_its_parents_drive_past_the_hold(limited: Saga,
                                                                tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text(
        "name: child\nsteps:\n  - {id: c, tool: echo, parameters: {x: 1}, resource: db}\n")
    assert limited.resources.acquire(["db"], "other:x:1", "other", "x", "w", 60, 60).granted
    freed = threading.Timer(2.0, limited.resources.release, [["other:x:1"]])
    freed.start()
    try:
        run = limited.run(limited.load({"name": "parent", "steps": [
            {"id": "p", "use": str(tmp_path / "child.yaml")}]}))
    finally:
        freed.cancel()
    assert run.status == "completed"  # waited 2 s, past its 1 s hold, and went on


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"ok": true}')

    def log_message(self, *_: object) -> None:
        pass


def test_the_http_tool_counts_against_its_host_by_default(limited: Saga) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"http:127.0.0.1:{server.server_address[1]}"
    s = Saga(dataclasses.replace(limited.settings, resources=parse_resources(
        {host: {"concurrency": 1}})), registry=limited.registry)
    try:
        plan = s.load({"name": "calls", "steps": [
            {"id": k, "tool": "http", "depends_on": [],
             "args": {"url": f"http://127.0.0.1:{server.server_address[1]}/x"}}
            for k in ("a", "b")]})
        assert s.resources.acquire([host], "other:x:1", "other", "x", "w", 60, 60).granted
        threading.Timer(0.5, s.resources.release, [["other:x:1"]]).start()
        run = s.run(plan)
        assert run.status == "completed"
        waits = [r for t, _, r in starts_and_waits(s, run.run_id)
                 if t == "StepWaitingForResource"]
        assert waits and all(r == [host] for r in waits)
    finally:
        server.shutdown()
        s.close()
