"""The worker's event loop keeps driving its runs while a look for work waits on the store
(as every store call does while it rides out an outage for up to reconnect_seconds)."""

from __future__ import annotations

import time
from typing import Any

from saga import Saga
from saga.errors import StoreUnavailableError
from saga.worker import WORKER_HOLD, Worker


def test_runs_in_flight_go_on_while_a_look_waits_on_the_store(lite: Saga) -> None:
    run = lite.submit(lite.load({"name": "slow", "steps": [
        {"id": "wait", "tool": "block", "args": {"seconds": 0.5}},
        {"id": "after", "tool": "noop"}]}))
    looks: list[str] = []

    def stalled_look() -> None:
        """The second look stalls (a store call reconnecting) until the run in flight is
        finished, or gives up: a loop blocked by the look can never finish it."""
        if not looks:
            looks.append("first")
            return
        if len(looks) > 1:
            return
        give_up = time.monotonic() + 30
        while time.monotonic() < give_up:
            if lite.get(str(run.id)).is_finished:
                looks.append("the run finished while the look waited")
                return
            time.sleep(0.05)
        looks.append("gave up: the loop was blocked")

    worker = Worker(lite.app, lite.leases,
                    lambda w, threads: lite.executor(worker=w, hold=WORKER_HOLD,
                                                     threads=threads),
                    tick=stalled_look, poll_interval=0.05)
    assert worker.run(until_idle=True) == 1
    assert looks == ["first", "the run finished while the look waited"]
    assert lite.get(str(run.id)).status == "completed"


def test_a_look_that_raises_leaves_the_runs_in_flight_alone(lite: Saga) -> None:
    """A store error in the look (in its thread) is the loop's to handle: the run it
    claimed before is still driven to the end."""
    run = lite.submit(lite.load({"name": "slow", "steps": [
        {"id": "wait", "tool": "block", "args": {"seconds": 0.3}}]}))

    calls: list[Any] = []

    def failing_look() -> None:
        calls.append(1)
        if len(calls) in (2, 3):
            raise StoreUnavailableError("cannot reach the event store (test)")

    worker = Worker(lite.app, lite.leases,
                    lambda w, threads: lite.executor(worker=w, hold=WORKER_HOLD,
                                                     threads=threads),
                    tick=failing_look, poll_interval=0.05)
    assert worker.run(until_idle=True) == 1
    assert len(calls) >= 3
    assert lite.get(str(run.id)).status == "completed"


def test_leases_are_given_up_together_when_drives_end_or_the_worker_stops(saga: Saga) -> None:
    """The leases of drives that ended go in one statement at the worker's next look (and
    when it stops); a worker told to stop mid-drive gives its runs' leases up too, so
    another worker takes them at once instead of after they expire."""
    plan = saga.load({"name": "quick", "steps": [{"id": "a", "tool": "noop"}]})
    quick = [saga.submit(plan).run_id for _ in range(3)]
    releases: list[list[str]] = []
    leases = saga.leases
    release_many = leases.release_many

    def counted(run_ids: Any, worker: str) -> None:
        releases.append(list(run_ids))
        release_many(run_ids, worker)

    leases.release_many = counted  # type: ignore[method-assign]
    worker = saga.worker_loop(concurrency=4, poll_interval=0.05, lease_seconds=60)
    assert worker.run(until_idle=True) == 3
    assert all(saga.get(r).status == "completed" for r in quick)
    assert all(leases.holder(r) is None for r in quick)
    assert sorted(r for batch in releases for r in batch) == sorted(quick)

    slow = saga.submit(saga.load({"name": "slow", "steps": [
        {"id": "wait", "tool": "block", "args": {"seconds": 1.0}}]})).run_id
    started = time.monotonic()
    stopper = saga.worker_loop(concurrency=1, poll_interval=0.05, lease_seconds=60)
    stopper.run(stop=lambda: leases.holder(slow) is not None and
                time.monotonic() - started > 0.3)
    assert saga.get(slow).status == "running"  # stopped in the middle of its step
    assert leases.holder(slow) is None  # given up, not left to expire in 60 s
