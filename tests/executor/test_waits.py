"""Durable timers, signals and pauses: a run that waits holds no process, and any worker
moves it on when it is due, signalled or unpaused."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from saga import Saga
from saga.errors import InputError, RunNotFoundError, RunStateError

FLOW = {"name": "waits", "steps": [
    {"id": "nap", "sleep": "2s"},
    {"id": "go", "signal": "go"},
    {"id": "pay", "tool": "echo", "parameters": {"amount": "{{ go.amount }}"}}]}


def drain(saga: Saga) -> None:
    saga.worker_loop(poll_interval=0.05, lease_seconds=2).run(until_idle=True)


def until(saga: Saga, run_id: str, key: str) -> datetime:
    return datetime.fromisoformat(saga.get(run_id).steps[key]["wait"]["until"])


def test_sleep_then_signal_then_the_next_step_sees_its_data(saga: Saga) -> None:
    run = saga.submit(saga.load(FLOW))
    drain(saga)  # starts the sleep and returns: nothing is runnable before it is due
    assert saga.get(run.run_id).status == "waiting"
    assert until(saga, run.run_id, "nap") > datetime.now(UTC)  # it did not wait it out
    time.sleep(max((until(saga, run.run_id, "nap") - datetime.now(UTC)).total_seconds(), 0))
    drain(saga)
    waiting = saga.get(run.run_id)
    assert (waiting.status, waiting.steps["nap"]["status"]) == ("waiting", "completed")
    assert waiting.waits == {"go": {"until": None, "signal": "go"}}
    saga.signal(run.run_id, "go", {"amount": 42}, actor="ops")
    drain(saga)
    done = saga.get(run.run_id)
    assert done.status == "completed"
    assert done.outputs["pay"] == {"amount": 42}
    with pytest.raises(RunStateError, match="unfinished run"):
        saga.signal(run.run_id, "go", {})
    with pytest.raises(RunNotFoundError):
        saga.signal("NO-SUCH-RUN", "go", {})
    with pytest.raises(InputError):
        saga.signal(run.run_id, "bad name!", {})


def test_signals_sent_before_anyone_waits_are_kept_and_taken_in_order(lite: Saga) -> None:
    flow = {"name": "two", "steps": [
        {"id": "hold", "signal": "start"},
        {"id": "first", "signal": "item"}, {"id": "second", "signal": "item"}]}
    run = lite.submit(lite.load(flow))
    lite.signal(run.run_id, "item", 1)
    lite.signal(run.run_id, "item", 2)
    lite.signal(run.run_id, "start", None)
    drain(lite)
    done = lite.get(run.run_id)
    assert done.status == "completed"
    assert (done.outputs["first"], done.outputs["second"]) == (1, 2)


def test_a_signal_timeout_is_a_failure_that_follows_on_error(lite: Saga) -> None:
    flow = {"name": "late", "steps": [
        {"id": "wait", "signal": "never", "timeout": 0.3, "on_error": "continue"},
        {"id": "after", "tool": "echo", "parameters": {"got": "{{ wait }}"}}]}
    run = lite.run(lite.load(flow))  # in process: a short wait is waited out here
    assert run.status == "completed"
    assert run.steps["wait"]["error"]["type"] == "SignalTimeout"


def test_a_signal_that_arrived_before_the_timeout_wins_however_late_a_worker_looks(
        saga: Saga) -> None:
    """The signal is recorded before the wait's timeout; no worker looks until after it
    (they were busy, or dead: see test_recovery_waits). The step takes the signal."""
    flow = {"name": "in-time", "steps": [
        {"id": "go", "signal": "go", "timeout": 1.2},
        {"id": "pay", "tool": "echo", "parameters": {"amount": "{{ go.amount }}"}}]}
    run = saga.submit(saga.load(flow))
    drain(saga)  # the wait is recorded; it is longer than a worker holds a run
    saga.signal(run.run_id, "go", {"amount": 7})
    due = until(saga, run.run_id, "go")
    time.sleep(max((due - datetime.now(UTC)).total_seconds(), 0) + 0.05)
    drain(saga)
    received = [e for e in saga.history(run.run_id) if e["type"] == "SignalReceived"]
    assert datetime.fromisoformat(received[0]["timestamp"]) < due
    done = saga.get(run.run_id)
    assert done.status == "completed", done.error
    assert (done.outputs["go"], done.outputs["pay"]) == ({"amount": 7}, {"amount": 7})


def test_pause_stops_new_steps_and_unpause_lets_a_worker_go_on(saga: Saga) -> None:
    flow: dict[str, Any] = {"name": "p", "steps": [{"id": "a", "tool": "noop"},
                                                   {"id": "b", "tool": "noop"}]}
    run = saga.submit(saga.load(flow))
    paused = saga.pause(run.run_id, actor="ops")
    assert paused.status == "paused"
    drain(saga)
    assert saga.get(run.run_id).steps == {}  # nothing started while paused
    with pytest.raises(RunStateError):
        saga.pause(run.run_id)
    saga.unpause(run.run_id, actor="ops")
    drain(saga)
    done = saga.get(run.run_id)
    assert done.status == "completed"
    kinds = [(e["type"], e["payload"].get("actor")) for e in saga.history(run.run_id)]
    assert ("RunPaused", "ops") in kinds and ("RunUnpaused", "ops") in kinds


def test_a_long_retry_backoff_releases_the_worker(lite: Saga) -> None:
    flow = {"name": "backoff", "steps": [
        {"id": "flaky", "tool": "fail", "parameters": {"times": 1},
         "retry": {"max_attempts": 2, "delay": 1.5, "jitter": 0}}]}
    run = lite.submit(lite.load(flow))
    drain(lite)  # the first attempt fails; the 1.5 s backoff is not waited out here
    first = lite.get(run.run_id)
    assert (first.status, first.steps["flaky"]["status"]) == ("running", "failed")
    due = datetime.fromisoformat(first.steps["flaky"]["retry_at"])
    assert due > datetime.now(UTC)
    time.sleep(max((due - datetime.now(UTC)).total_seconds(), 0))
    drain(lite)
    assert lite.get(run.run_id).status == "completed"


def test_a_run_past_its_timeout_is_undone_wherever_it_waits(saga: Saga) -> None:
    flow = {"name": "deadline", "timeout": "2.5s", "steps": [
        {"id": "made", "tool": "echo", "parameters": {"x": 1},
         "compensate": {"tool": "echo", "parameters": {"undo": "{{ output.x }}"}}},
        {"id": "nap", "sleep": "1h"}]}
    run = saga.submit(saga.load(flow))
    drain(saga)  # `made` completes, the nap waits: the worker is released
    assert saga.get(run.run_id).status == "waiting"
    deadline = datetime.fromisoformat(saga.get(run.run_id).deadline or "")
    time.sleep(max((deadline - datetime.now(UTC)).total_seconds(), 0))
    drain(saga)
    done = saga.get(run.run_id)
    assert done.status == "compensated"
    assert done.steps["made"]["status"] == "compensated"
    assert "deadline" in done.error["message"]
    assert "RunTimedOut" in [e["type"] for e in saga.history(run.run_id)]


def test_a_timeout_cuts_an_attempt_in_flight_short(lite: Saga) -> None:
    flow = {"name": "slow", "steps": [{"id": "s", "tool": "sleep",
                                       "parameters": {"seconds": 30}}]}
    run = lite.run(lite.load(flow), options={"timeout": 0.5})
    assert run.status == "failed"
    assert run.steps["s"]["error"]["type"] == "RunTimeout"
    assert run.error["type"] == "RunTimeout"


@pytest.mark.parametrize(("default", "status"), [(True, "completed"), (False, "failed")])
def test_a_confirmation_timeout_applies_its_default(saga: Saga, default: bool,
                                                    status: str) -> None:
    """Seed 002's confirmations[].default, applied when nobody decides in time, by any
    worker (the wait holds none)."""
    flow = {"name": "confirm", "steps": [{"id": "ship", "tool": "noop"}],
            "confirmations": [{"step": "ship", "message": "Ship it?", "default": default,
                               "timeout": "2s"}]}
    run = saga.submit(saga.load(flow))
    drain(saga)
    waiting = saga.get(run.run_id)
    assert waiting.status == "waiting"
    until_ = datetime.fromisoformat(waiting.approvals["ship"]["until"])
    time.sleep(max((until_ - datetime.now(UTC)).total_seconds(), 0))
    drain(saga)
    done = saga.get(run.run_id)
    assert done.status == status
    assert done.approvals["ship"]["actor"] == "timeout"
