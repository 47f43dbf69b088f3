"""The worker's run index keeps its runnable runs in claim order as the log is applied (a
look costs what changed, not the backlog): after any sequence of events, claims and
clock ticks (and runs found held by other workers) it answers exactly what a scan of
every followed run answers."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from saga.domain import TOPIC_PREFIX
from saga.worker import RunIndex

BASE = datetime(2026, 1, 1, tzinfo=UTC)
RUNS = [f"r{i}" for i in range(6)]


def at(seconds: int) -> str:
    return (BASE + timedelta(seconds=seconds)).isoformat()


def scanned(index: RunIndex) -> list[str]:
    """The answer by brute force: every followed run, filtered, then sorted."""
    now = index.clock().isoformat()
    ready = []
    for run_id, run in index.runs.items():
        if run.status == "paused" or (run.held_until is not None and run.held_until > now):
            continue
        due = any(t is not None and t <= now
                  for t in [*run.waits.values(), *run.retries.values(), run.deadline])
        idle = run.status == "waiting" or bool(run.waits) or bool(run.retries)
        if due or run.nudged or not idle:
            ready.append(run_id)
    return sorted(ready, key=lambda r: (-index.runs[r].priority, index.runs[r].started))


class Index(RunIndex):
    """An index fed by hand: a reopened run's ``RunStarted`` comes from here."""

    started_payloads: dict[str, dict[str, Any]]

    def _started(self, run_id: str) -> dict[str, Any]:
        return self.started_payloads.get(run_id, {})


def event(kind: str, step: int, when: int | None, priority: int, started: int,
          timeout: int | None) -> tuple[str, dict[str, Any]]:
    """An event of this kind with the fields the index reads."""
    if kind == "RunStarted":
        options: dict[str, Any] = {"priority": priority}
        if timeout is not None:
            options["timeout"] = timeout
        return kind, {"options": options, "definition": {"name": "x"},
                      "timestamp": {"_type_": "datetime_iso", "_data_": at(started)}}
    payload: dict[str, Any] = {"step_id": f"s{step}", "iteration": 0}
    if kind == "StepWaiting":
        payload["until"] = None if when is None else at(when)
    elif kind == "StepFailed":
        payload["next_retry_at"] = None if when is None else at(when)
    elif kind == "ApprovalRequested":
        payload["until"] = None if when is None else at(when)
    return kind, payload


KINDS = ["RunStarted", "StepStarted", "StepCompleted", "StepFailed", "StepWaiting",
         "StepSkipped", "ApprovalRequested", "ApprovalGranted", "ApprovalRejected",
         "SignalReceived", "RunPaused", "RunUnpaused", "RunCompleted", "RunFailed",
         "RunRetried", "CompensationStarted", "RunTimedOut", "RunTakenOver"]

steps = st.lists(st.one_of(
    st.tuples(st.just("event"), st.sampled_from(RUNS), st.sampled_from(KINDS),
              st.integers(0, 2), st.one_of(st.none(), st.integers(0, 60)),
              st.integers(-1, 2), st.integers(0, 30), st.one_of(st.none(), st.integers(1, 60))),
    st.tuples(st.just("claim"), st.sampled_from(RUNS)),
    st.tuples(st.just("held"), st.sampled_from(RUNS), st.integers(0, 40)),
    st.tuples(st.just("tick"), st.integers(0, 20)),
), max_size=80)


@settings(max_examples=1000, deadline=None)
@given(steps)
@example([("event", "r0", "RunStarted", 0, None, 0, 0, None),  # nudged until claimed
          ("event", "r0", "StepWaiting", 0, 30, 0, 0, None), ("claim", "r0"),
          ("tick", 20), ("tick", 20)])
@example([("event", "r0", "RunStarted", 0, None, 0, 5, None),  # a tie: first seen first
          ("event", "r1", "RunStarted", 0, None, 0, 5, None),
          ("event", "r0", "RunCompleted", 0, None, 0, 0, None),
          ("event", "r0", "RunRetried", 0, None, 0, 0, None)])
@example([("event", "r0", "RunStarted", 0, None, 0, 0, None),  # held, then its lease is up
          ("held", "r0", 10), ("event", "r0", "StepStarted", 0, None, 0, 0, None),
          ("tick", 11)])
@example([("event", "r0", "RunStarted", 0, None, 0, 0, None),  # held, then signalled
          ("held", "r0", 10), ("event", "r0", "SignalReceived", 0, None, 0, 0, None)])
def test_the_kept_order_is_the_scanned_order(ops: list[tuple[Any, ...]]) -> None:
    now = [0]
    index = Index(app=None, clock=lambda: BASE + timedelta(seconds=now[0]))  # type: ignore[arg-type]
    index.started_payloads = {}
    for op in ops:
        if op[0] == "event":
            _, run_id, kind, step, when, priority, started, timeout = op
            name, payload = event(kind, step, when, priority, started, timeout)
            if name == "RunStarted":
                index.started_payloads.setdefault(run_id, payload)
            index._apply(run_id, TOPIC_PREFIX + name, json.dumps(payload).encode())
        elif op[0] == "claim":
            index.claimed(op[1])
        elif op[0] == "held":  # another worker's lease, up in op[2] seconds
            index.held(op[1], (index.clock() + timedelta(seconds=op[2])).isoformat())
        else:
            now[0] += op[1]
        assert index.runnable() == scanned(index)


class Unscannable(dict[str, Any]):
    """The followed runs, refusing to be walked: a look must not scan them."""

    def items(self) -> Any:
        raise AssertionError("a look walked every followed run")

    def values(self) -> Any:
        raise AssertionError("a look walked every followed run")

    def __iter__(self) -> Any:
        raise AssertionError("a look walked every followed run")


def test_a_look_does_not_scan_the_backlog() -> None:
    """Ten thousand queued runs: a look returns them in claim order without walking or
    re-sorting them, and a run that finishes leaves the order at once."""
    index = Index(app=None, clock=lambda: BASE)  # type: ignore[arg-type]
    index.started_payloads = {}
    for i in range(10_000):
        name, payload = event("RunStarted", 0, None, i % 3, 10_000 - i, None)
        index._apply(f"q{i}", TOPIC_PREFIX + name, json.dumps(payload).encode())
    expected = scanned(index)
    index.runs = Unscannable(index.runs)
    order = index.runnable()
    assert order == expected
    assert order[0] == "q9998"  # highest priority (2), then the oldest start
    index._apply("q9998", TOPIC_PREFIX + "RunCompleted", b"{}")
    assert index.runnable()[0] == "q9995"
    assert len(index.runnable()) == 9_999


def test_a_run_another_worker_holds_waits_for_its_lease_or_news() -> None:
    """Held by another worker: not runnable while its driver's own events arrive, until
    the lease is up; runnable at once when something else happens to it (a signal)."""
    now = [0]
    index = Index(app=None, clock=lambda: BASE + timedelta(seconds=now[0]))  # type: ignore[arg-type]
    index.started_payloads = {}
    for run_id in ("r0", "r1"):
        _, payload = event("RunStarted", 0, None, 0, 0, None)
        index._apply(run_id, TOPIC_PREFIX + "RunStarted", json.dumps(payload).encode())
    assert index.runnable() == ["r0", "r1"]
    index.held("r0", at(10))
    index.held("r1", at(10))
    assert index.runnable() == []
    for kind in ("StepStarted", "StepCompleted"):  # its driver at work
        _, payload = event(kind, 0, None, 0, 0, None)
        index._apply("r0", TOPIC_PREFIX + kind, json.dumps(payload).encode())
    _, payload = event("SignalReceived", 0, None, 0, 0, None)
    index._apply("r1", TOPIC_PREFIX + "SignalReceived", json.dumps(payload).encode())
    assert index.runnable() == ["r1"]
    now[0] = 11
    assert index.runnable() == ["r0", "r1"]


def test_a_held_run_is_looked_at_again_when_its_own_timer_is_due() -> None:
    """A run that went waiting under another worker's lease is runnable when its timer
    is due, before that lease would be up (its holder may have let it go and stopped)."""
    now = [0]
    index = Index(app=None, clock=lambda: BASE + timedelta(seconds=now[0]))  # type: ignore[arg-type]
    index.started_payloads = {}
    _, payload = event("RunStarted", 0, None, 0, 0, None)
    index._apply("r0", TOPIC_PREFIX + "RunStarted", json.dumps(payload).encode())
    index.held("r0", at(30))
    _, payload = event("StepWaiting", 0, 5, 0, 0, None)
    index._apply("r0", TOPIC_PREFIX + "StepWaiting", json.dumps(payload).encode())
    assert index.runnable() == []
    now[0] = 6
    assert index.runnable() == ["r0"]


def test_a_held_run_whose_own_time_has_passed_stays_held_till_its_mark() -> None:
    """A time of the run's own already past when it is found held (a deadline passed
    while its holder was in a long call) does not make it runnable again at once: each
    claim round of a look would try it again, and claim nothing else."""
    now = [0]
    index = Index(app=None, clock=lambda: BASE + timedelta(seconds=now[0]))  # type: ignore[arg-type]
    index.started_payloads = {}
    for run_id, timeout in (("r0", 1), ("r1", None)):
        _, payload = event("RunStarted", 0, None, 0, 0, timeout)
        index._apply(run_id, TOPIC_PREFIX + "RunStarted", json.dumps(payload).encode())
    now[0] = 5  # r0's deadline (1 s) has passed
    assert index.runnable() == ["r0", "r1"]
    index.held("r0", at(10))
    assert index.runnable() == ["r1"]
    now[0] = 11
    assert index.runnable() == ["r0", "r1"]


def test_another_workers_steps_leave_a_run_where_it_is() -> None:
    """In a fleet each worker follows every other's steps: a step starting or completing
    in a run that waits for nothing, its status unchanged, leaves the run where it is (a
    held run gained a wake-up in the heap per event, and looked at the clock), and the
    answer is still the scanned one."""
    now = [0]
    index = Index(app=None, clock=lambda: BASE + timedelta(seconds=now[0]))  # type: ignore[arg-type]
    index.started_payloads = {}
    for run_id in ("mine", "theirs"):
        name, payload = event("RunStarted", 0, None, 0, 0, 60)
        index._apply(run_id, TOPIC_PREFIX + name, json.dumps(payload).encode())
    index.held("theirs", at(5))
    heap, order = len(index._due), index.runnable()
    for step in range(10):
        for kind in ("StepStarted", "StepCompleted"):
            name, payload = event(kind, step, None, 0, 0, None)
            for run_id in ("mine", "theirs"):
                index._apply(run_id, TOPIC_PREFIX + name, json.dumps(payload).encode())
    assert len(index._due) == heap
    assert index.runnable() == order == ["mine"] == scanned(index)
    now[0] = 6  # the holder's lease is up: the run is tried again
    assert index.runnable() == scanned(index) == ["mine", "theirs"]
