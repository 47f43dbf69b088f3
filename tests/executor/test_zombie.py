"""Zombie workers: a worker paused (SIGSTOP) past its lease and continued, or whose
clock passed its lease's expiry during a call, starts no call and no compensation once
another worker holds the lease (DESIGN promise 8)."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.domain import step_key
from saga.errors import LeaseLostError
from saga.tools import Registry, Tool
from tests.executor.test_churn import (
    TOOLS,
    entries,
    interrupted_attempts,
    stop,
    wait_for,
    work,
    worker,
)


def test_a_worker_paused_past_its_lease_starts_no_call_when_it_continues(
        settings: Settings, tmp_path: Path) -> None:
    """A worker SIGSTOPped while its steps run, past its lease; another worker has taken
    the runs' leases (it has not appended yet) when the first is SIGCONTed: the first
    starts no step and no compensation. A restarted worker then finishes the runs, and
    no call is made twice but the attempts the log records as interrupted."""
    log = tmp_path / "calls.jsonl"
    with Saga(settings, tools=[TOOLS]) as saga:
        done = saga.load({"name": "done", "steps": [work("a", 1.0), work("b", 0.2)]})
        undone = saga.load({"name": "undone", "steps": [
            work("a", 0.2), work("b", 1.0), {"id": "c", "tool": "refuse"}]})
        runs = [saga.submit(done).run_id for _ in range(3)] + \
            [saga.submit(undone).run_id for _ in range(3)]
        first = worker(settings, log, "--concurrency", "8")
        procs = [first]
        try:
            # Each run has its long step in flight in the first worker.
            wait_for(lambda: {(c["run"], c["step"]) for c in entries(log)} >=
                     {(r, "a") for r in runs[:3]} | {(r, "b") for r in runs[3:]},
                     30, "the long steps to start")
            first.send_signal(signal.SIGSTOP)
            wait_for(lambda: all(h is None or h[1] < time.time()
                                 for h in map(saga.leases.holder, runs)),
                     10, "the paused worker's leases to lapse")
            taken = [r for r in runs if saga.leases.claim(r, "other-worker", 30.0)]
            assert taken == runs
            with log.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"kind": "continued"}) + "\n")
            first.send_signal(signal.SIGCONT)
            # Its calls in flight return (their threads ran on); its drives see that.
            wait_for(lambda: Counter(c["kind"] for c in entries(log))["finished"]
                     == Counter(c["kind"] for c in entries(log))["call"],
                     30, "the paused calls to return")
            first.send_signal(signal.SIGTERM)
            first.wait(30)
            after = entries(log)
            after = after[next(i for i, c in enumerate(after) if c["kind"] == "continued"):]
            started = [c for c in after if c["kind"] in ("call", "undo")]
            assert started == [], "a worker whose lease lapsed started calls"
            # The other worker gives its leases up; a new one takes the runs over.
            saga.leases.release_many(runs, "other-worker")
            procs.append(worker(settings, log, "--concurrency", "8"))
            wait_for(lambda: all(saga.get(r).is_finished for r in runs), 40,
                     "the runs to finish")
        finally:
            if first.poll() is None:
                first.send_signal(signal.SIGCONT)
            stop(procs)
        assert [saga.get(r).status for r in runs] == ["completed"] * 3 + ["compensated"] * 3
        calls = entries(log)
        for run_id in runs:
            again = interrupted_attempts(saga, run_id)
            made = Counter(step_key(c["step"]) for c in calls
                           if c.get("run") == run_id and c["kind"] == "call")
            assert all(n <= 1 + again[k] for k, n in made.items()), (run_id, made, again)
            undos = Counter(c["step"] for c in calls
                            if c.get("run") == run_id and c["kind"] == "undo")
            assert all(n == 1 for n in undos.values()), (run_id, undos)
            assert saga.verify(run_id) is None


def test_a_lease_that_lapsed_during_a_call_starts_nothing_after_it(
        settings: Settings) -> None:
    """The worker's clock passes its lease's expiry while a call runs (it was paused),
    and another worker has taken the lease meanwhile (it appended nothing yet): when the
    call returns the drive records it, starts neither the next step nor a compensation,
    and stops. The new holder calls the next step, once."""
    calls: list[str] = []
    now = [time.time()]
    seconds = 30.0  # no renewal comes due in this test: only the fence can notice
    with Saga(replace(settings, lease_seconds=seconds), registry=Registry([
            Tool("pause", lambda params, ctx: pause(ctx)),
            Tool("note", lambda params, ctx: calls.append(ctx.idempotency_key) or {})])) \
            as saga:
        def pause(ctx: Any) -> dict[str, Any]:
            calls.append(ctx.idempotency_key)
            now[0] += 2 * seconds  # the worker slept past its lease
            assert saga.leases.claim(ctx.run_id, "other-worker", seconds)
            return {"paused": True}

        saga.leases.clock = lambda: now[0]
        run = saga.submit(saga.load({"name": "lapse", "steps": [
            {"id": "a", "tool": "pause", "compensate": {"tool": "note"}},
            {"id": "b", "tool": "note"}]}))
        with pytest.raises(LeaseLostError):
            saga.resume(run.run_id)
        assert calls == [f"{run.run_id}:a:0"]  # b was not called
        held = saga.get(run.run_id)
        assert held.steps["a"]["status"] == "completed"  # what it recorded stands
        saga.leases.release(run.run_id, "other-worker")
        final = saga.resume(run.run_id)  # the next holder: b's start was never called
        assert final.status == "completed"
        assert calls == [f"{run.run_id}:a:0", f"{run.run_id}:b:0"]
        assert [e["payload"]["error_type"] for e in saga.history(run.run_id)
                if e["type"] == "StepFailed"] == ["Interrupted"]
        assert saga.verify(run.run_id) is None
