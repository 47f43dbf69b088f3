"""The tool threads drives share: reused from run to run, retired when a call hangs."""

from __future__ import annotations

import threading
import time
from typing import Any

from saga.api import Saga
from saga.executor import Executor
from tests.standins import standins


def _blocks() -> list[dict[str, Any]]:
    return [c for c in standins.CALLS if c["tool"] == "block"]


def _one(seconds: float, timeout_ms: int | None = None) -> dict[str, Any]:
    step: dict[str, Any] = {"id": "b", "tool": "block", "args": {"seconds": seconds}}
    if timeout_ms is not None:
        step["timeout_ms"] = timeout_ms
    return {"name": "one-block", "steps": [step]}


def test_runs_driven_here_share_their_tool_threads(lite: Saga) -> None:
    standins.CALLS.clear()
    before = threading.active_count()
    for _ in range(6):
        assert lite.run(lite.load(_one(0.01))).status == "completed"
    # The runs reuse the pool's threads instead of starting one each (a second thread
    # may start if a run asks before the last call's thread has gone back to idle).
    assert len({c["thread"] for c in _blocks()}) <= 2
    assert threading.active_count() <= before + 2


def test_a_call_given_up_on_retires_the_threads(lite: Saga) -> None:
    """A timed-out call keeps its thread busy (a thread cannot be stopped): the next run
    gets fresh threads rather than a pool the hung call may fill."""
    standins.CALLS.clear()
    assert lite.run(lite.load(_one(0.01))).status == "completed"
    first = lite.threads.pool
    run = lite.run(lite.load(_one(0.5, timeout_ms=50)))
    assert run.status == "failed" and run.error is not None
    assert run.error["type"] == "timeout"
    assert lite.threads.pool is not first
    assert lite.run(lite.load(_one(0.01))).status == "completed"
    time.sleep(0.6)  # the hung call ends in its own time, on its own thread
    calls = _blocks()
    assert len(calls) == 3
    assert calls[1]["thread"] != calls[2]["thread"]


def test_a_worker_shares_its_threads_across_its_drives(lite: Saga) -> None:
    standins.CALLS.clear()
    for _ in range(5):
        lite.submit(lite.load(_one(0.01)))
    worker = lite.worker_loop(concurrency=1, poll_interval=0.05)
    assert worker.run(until_idle=True) == 5
    assert len({c["thread"] for c in _blocks()}) <= 2  # not one per drive (see above)
    assert worker.threads.max_threads == 16


def test_the_builtin_tools_that_wait_on_nothing_stay_on_the_loop(lite: Saga,
                                                                   monkeypatch: Any) -> None:
    """noop, echo and fail are coroutines, like shell, http and sleep: a step of theirs
    costs no hand-off to a tool thread, while a plain function's still gets one."""
    handed: list[Any] = []
    submit = Executor.submit
    monkeypatch.setattr(Executor, "submit",
                        lambda self, call: handed.append(call) or submit(self, call))
    flow = {"name": "on-the-loop", "steps": [
        {"id": "n", "tool": "noop"},
        {"id": "e", "tool": "echo", "args": {"x": 1}, "depends_on": ["n"]},
        {"id": "f", "tool": "fail", "args": {"times": 1}, "depends_on": ["e"],
         "retry": {"max_attempts": 2, "delay": 0.01}}]}
    run = lite.run(lite.load(flow))
    assert run.status == "completed"
    assert run.outputs["e"] == {"x": 1} and run.outputs["f"]["failed_before"] == 1
    assert handed == []
    standins.CALLS.clear()
    assert lite.run(lite.load(_one(0.01))).status == "completed"
    assert len(handed) == 1
