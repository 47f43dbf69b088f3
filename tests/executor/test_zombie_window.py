"""Break 7 again: a worker stopped (SIGSTOP) after its turn's lease check passed and its
StepStarted was appended, but before the tool was called, must not call it once
continued if another worker took the run meanwhile. The conformance simulator found
this (SIM-134:s10:0 called 1.31 s after the new holder recorded it Interrupted): the
check sat in the drive's turn, before the call's task was launched, and everything
between (the task's first step, resource slots, the tool thread's queue) ran unchecked.

Deterministic, in-process: the stop is made exactly there by advancing the lease's clock
past its expiry, and having another worker claim the lease, as the call is launched."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.errors import LeaseLostError
from saga.executor.drive import Drive
from saga.tools import Registry, Tool


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_lease_lapsed_between_the_start_and_its_call_calls_nothing(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """The turn appends b's StepStarted with a fresh lease; before b's tool is called
    the worker is 'stopped' past its lease and another worker claims the run. b's tool
    (a blocking one, run in a tool thread; or an async one) is not called, the drive
    raises LeaseLostError without recording b's attempt as failed, and the next holder
    finds b's attempt interrupted and calls b once."""
    calls: list[str] = []
    now = [time.time()]
    seconds = 30.0  # no renewal comes due in this test: only a fence can notice

    async def note_async(params: Any, ctx: Any) -> dict[str, Any]:
        calls.append(ctx.idempotency_key)
        return {}

    note = Tool("note", note_async) if kind == "async" else \
        Tool("note", lambda params, ctx: calls.append(ctx.idempotency_key) or {})
    with Saga(replace(settings, lease_seconds=seconds), registry=Registry([note])) as saga:
        saga.leases.clock = lambda: now[0]
        run = saga.submit(saga.load({"name": "window", "steps": [
            {"id": "a", "tool": "note"}, {"id": "b", "tool": "note"}]}))
        launch = Drive._launch
        stopped: list[str] = []

        def stop_then_launch(self: Drive, what: str, payload: Any) -> None:
            # b's StepStarted is appended and the turn's check passed: the worker is
            # stopped here, past its lease, and another worker takes the run.
            if what == "step" and payload.step_id == "b" and not stopped:
                assert self.run.steps["b"]["status"] == "running"
                now[0] += 2 * seconds
                assert saga.leases.claim(self.run.run_id, "other-worker", seconds)
                stopped.append(self.run.run_id)
            launch(self, what, payload)

        monkeypatch.setattr(Drive, "_launch", stop_then_launch)
        with pytest.raises(LeaseLostError):
            saga.resume(run.run_id)
        assert stopped == [run.run_id]
        assert calls == [f"{run.run_id}:a:0"], "a lapsed lease called b's tool"
        held = saga.get(run.run_id)
        assert held.steps["b"]["status"] == "running"  # no failure recorded for it
        monkeypatch.setattr(Drive, "_launch", launch)
        saga.leases.release(run.run_id, "other-worker")
        final = saga.resume(run.run_id)
        assert final.status == "completed"
        assert calls == [f"{run.run_id}:a:0", f"{run.run_id}:b:0"]
        assert [e["payload"]["error_type"] for e in saga.history(run.run_id)
                if e["type"] == "StepFailed"] == ["Interrupted"]
        assert saga.verify(run.run_id) is None
