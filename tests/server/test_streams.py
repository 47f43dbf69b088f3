"""Live events: Server-Sent Events per run and for the store, seed 002's WebSocket events,
and a run started over HTTP surviving the server's death."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
from websockets.sync.client import connect

from tests.server.conftest import Server

NAP = {"name": "nap", "steps": [
    {"id": "a", "tool": "echo", "args": {"x": 1}},
    {"id": "nap", "sleep": 1},
    {"id": "b", "tool": "echo", "args": {"y": 2}}]}


def read_sse(client: httpx.Client, url: str, headers: dict[str, str] | None = None,
             limit: int = 1000) -> list[dict[str, Any]]:
    """Every frame of a stream until the server closes it (or ``limit`` frames)."""
    frames: list[dict[str, Any]] = []
    frame: dict[str, Any] = {}
    with client.stream("GET", url, headers={"Accept": "text/event-stream",
                                            **(headers or {})}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if not line:
                if frame:
                    frames.append(frame)
                    frame = {}
                    if len(frames) >= limit:
                        break
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(": ")
            frame[field] = json.loads(value) if field == "data" else value
    return frames


def test_a_run_live_from_start_to_end_then_exactly_the_rest(any_server: Server) -> None:
    with any_server.client() as c:
        run_id = c.post("/api/v1/runs", json={"composition": NAP}).json()["run_id"]
        frames = read_sse(c, f"/api/v1/runs/{run_id}/events")
        ids = [int(f["id"]) for f in frames]
        assert ids == list(range(1, len(ids) + 1))  # strictly increasing, none missing
        assert frames[0]["event"] == "RunStarted" and frames[-1]["event"] == "RunCompleted"
        assert all(f["event"] == f["data"]["type"] for f in frames)
        assert any(f["event"] == "StepWaiting" for f in frames)  # it was live, not replayed
        rest = read_sse(c, f"/api/v1/runs/{run_id}/events", {"Last-Event-ID": "3"})
        assert [int(f["id"]) for f in rest] == ids[3:]
        assert [f["data"] for f in rest] == [f["data"] for f in frames[3:]]
        assert read_sse(c, f"/api/v1/runs/{run_id}/events", {"Last-Event-ID": str(ids[-1])}) \
            == []


def test_the_store_stream_is_positions_in_the_log(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        start = c.get("/api/v1/health").json()["position"]
        first = c.post("/api/v1/runs", json={"template": "quickstart"}).json()["run_id"]
        second = c.post("/api/v1/runs", json={"template": "quickstart"}).json()["run_id"]
        for run_id in (first, second):
            sqlite_server.wait_for(c, run_id)
        end = c.get("/api/v1/health").json()["position"]
        frames = read_sse(c, f"/api/v1/events?after={start}", limit=end - start)
        positions = [int(f["id"]) for f in frames]
        assert positions == list(range(start + 1, end + 1))
        per_run = Counter(f["data"]["run_id"] for f in frames)
        assert set(per_run) == {first, second}
        middle = positions[len(positions) // 2]
        again = read_sse(c, "/api/v1/events", {"Last-Event-ID": str(middle)},
                         limit=end - middle)
        assert [int(f["id"]) for f in again] == positions[positions.index(middle) + 1:]


def test_the_websocket_speaks_seed_002(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        run_id = c.post("/api/v1/runs", json={"template": "quickstart",
                                              "inputs": {"fail_at": "ship"}}).json()["run_id"]
        sqlite_server.wait_for(c, run_id)
    url = sqlite_server.url.replace("http", "ws") + f"/ws?run={run_id}"
    with connect(url, additional_headers=sqlite_server.auth) as ws:
        messages = []
        while True:
            try:
                messages.append(json.loads(ws.recv(timeout=10)))
            except Exception:  # the server closes the socket after the run's end
                break
    kinds = [m["type"] for m in messages]
    assert kinds[0] == "skill_started" and kinds[-1] == "skill_failed"
    assert {"step_started", "step_completed", "step_skipped"} <= set(kinds)
    started = messages[0]
    assert started["skill"] == "quickstart" and started["execution_id"] == run_id
    assert started["inputs"]["fail_at"] == "ship"
    done = next(m for m in messages if m["type"] == "step_completed" and m["success"])
    assert set(done) >= {"step_id", "success", "result", "duration"}
    assert messages[-1]["step_id"] == "ship" and messages[-1]["status"] == "compensated"


def test_confirmation_required_reaches_the_websocket(sqlite_server: Server) -> None:
    gated = {"name": "gated", "steps": [{"id": "ask", "tool": "echo", "confirm": "sure?"}]}
    with sqlite_server.client() as c:
        start = c.get("/api/v1/health").json()["position"]
        run_id = c.post("/api/v1/runs", json={"composition": gated}).json()["run_id"]
        url = sqlite_server.url.replace("http", "ws") + f"/ws?after={start}"
        with connect(url, additional_headers=sqlite_server.auth) as ws:
            seen = []
            while "confirmation_required" not in seen:
                seen.append(json.loads(ws.recv(timeout=10))["type"])
        assert seen[0] == "skill_started"
        c.post(f"/api/v1/runs/{run_id}/reject/ask")


def test_a_run_started_over_http_survives_the_server_dying(any_server: Server) -> None:
    slow = {"name": "slow", "steps": [
        {"id": "a", "tool": "echo", "args": {"x": 1}},
        {"id": "nap", "sleep": 2},
        {"id": "b", "tool": "echo", "args": {"y": 2}}]}
    with any_server.client() as c:
        run_id = c.post("/api/v1/runs", json={"composition": slow}).json()["run_id"]
        any_server.wait_for(c, run_id, lambda r: r["status"] == "waiting")
    any_server.kill()
    any_server.start()  # a new process on the same store (and port)
    with any_server.client() as c:
        run = any_server.wait_for(c, run_id)
        assert run["status"] == "completed"
        events = c.get(f"/api/v1/runs/{run_id}/events").json()
    completed = Counter(e["step_id"] for e in events if e["type"] == "StepCompleted")
    assert completed == {"a": 1, "nap": 1, "b": 1}


def test_a_stream_never_closes_on_events_it_has_not_sent() -> None:
    """The race the load test found: the run ends between the read of new events (none
    yet) and the look at its last event; the stream must read again, not close."""
    from saga.views import run_events_after

    class RunCompleted:  # the last event, committed just after the first read
        originator_version = 8

    class Store:
        def events_of(self, uid: Any, gt: int | None = None, desc: bool = False,
                      limit: int | None = None) -> list[Any]:
            return [RunCompleted()] if desc else []

    app = Store()
    assert run_events_after(app, "r-1", 6) == ([], False)  # type: ignore[arg-type]
    assert run_events_after(app, "r-1", 8) == ([], True)  # type: ignore[arg-type]
