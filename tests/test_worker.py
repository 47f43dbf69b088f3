"""The worker's event loop keeps driving its runs while a look for work waits on the store
(as every store call does while it rides out an outage for up to reconnect_seconds)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import saga.worker as saga_worker
from saga import Saga
from saga.config import QueueLimit, Settings
from saga.errors import StoreUnavailableError
from saga.tools.base import Registry
from saga.worker import HELD_RECHECK, WORKER_HOLD, Worker
from tests.standins import standins


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
    given_up = sorted(r for batch in releases for r in batch)
    if saga.app.claims_with_append():  # a run whose last commit is its own gives it up
        assert set(given_up) <= set(quick)  # (see the next test)
    else:
        assert given_up == sorted(quick)

    slow = saga.submit(saga.load({"name": "slow", "steps": [
        {"id": "wait", "tool": "block", "args": {"seconds": 1.0}}]})).run_id
    started = time.monotonic()
    stopper = saga.worker_loop(concurrency=1, poll_interval=0.05, lease_seconds=60)
    stopper.run(stop=lambda: leases.holder(slow) is not None and
                time.monotonic() - started > 0.3)
    run = saga.get(slow)
    assert run.status == "running"  # stopped in the middle of its step, which finished
    assert run.steps["wait"]["status"] == "completed"
    assert leases.holder(slow) is None  # given up, not left to expire in 60 s


def test_a_run_that_ends_in_a_commit_of_its_own_gives_its_lease_up_with_it(
        saga: Saga) -> None:
    """Driving one run at a time, the append of a run's last events gives its lease up in
    the same statement (PostgreSQL), so the next look has nothing to release; where the
    store cannot (SQLite), the next look releases it as before."""
    plan = saga.load({"name": "quick", "steps": [{"id": "a", "tool": "noop"},
                                                 {"id": "b", "tool": "noop",
                                                  "depends_on": ["a"]}]})
    ids = [saga.submit(plan).run_id for _ in range(2)]
    released: list[str] = []
    release_many = saga.leases.release_many

    def counted(run_ids: Any, worker: str) -> None:
        released.extend(run_ids)
        release_many(run_ids, worker)

    saga.leases.release_many = counted  # type: ignore[method-assign]
    worker = saga.worker_loop(concurrency=1, poll_interval=0.05)
    assert worker.run(until_idle=True) == 2
    assert all(saga.get(r).status == "completed" for r in ids)
    assert all(saga.leases.holder(r) is None for r in ids)
    assert released == ([] if saga.app.claims_with_append() else ids)


def test_a_run_whose_drive_fails_is_not_driven_again_at_once(saga: Saga) -> None:
    """A drive that fails on an error of its own (a bug, not the store) leaves the run to
    be tried again after HELD_RECHECK seconds: the worker does not spin on it, claiming
    and failing it in a loop, and a worker draining until idle ends."""
    plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
    run_id = saga.submit(plan).run_id
    worker = saga.worker_loop(concurrency=1, poll_interval=0.05)
    attempts: list[str] = []
    make_executor = worker.make_executor

    def failing(*args: Any) -> Any:
        attempts.append(run_id)
        raise RuntimeError("a bug in the drive (test)")

    worker.make_executor = failing
    assert worker.run(until_idle=True, stop=lambda: len(attempts) >= 3) == 1
    assert attempts == [run_id]
    assert saga.leases.holder(run_id) is None  # given up: another worker may try it
    worker.make_executor = make_executor
    worker.index.held(run_id, datetime.now(UTC).isoformat())  # its time is up
    assert worker.run(until_idle=True) == 2  # drives counted since the worker began
    assert saga.get(run_id).status == "completed"


def _calls(tool: str, run_id: str) -> list[dict[str, Any]]:
    return [c for c in standins.CALLS if c["tool"] == tool and c["key"].startswith(run_id)]


def test_a_stopping_worker_finishes_the_calls_in_flight_and_starts_nothing(
        saga: Saga) -> None:
    """Told to stop mid-step, a worker lets the step's call finish, records it, starts
    no next step and gives the lease up; the next worker goes on from there, and no
    step is called twice. A retry's in-process wait does not hold the stop up."""
    plan = saga.load({"name": "drain", "steps": [
        {"id": "slow", "tool": "block", "args": {"seconds": 1.0}},
        {"id": "after", "tool": "noop", "depends_on": ["slow"]}]})
    run_id = saga.submit(plan).run_id
    stopper = saga.worker_loop(concurrency=2, poll_interval=0.05, lease_seconds=60)
    stopper.run(stop=lambda: saga.get(run_id).steps.get("slow", {}).get("status")
                == "running")
    run = saga.get(run_id)
    assert run.steps["slow"]["status"] == "completed"
    assert "after" not in run.steps or run.steps["after"]["status"] == "pending"
    assert saga.leases.holder(run_id) is None
    assert saga.worker_loop(poll_interval=0.05).run(until_idle=True) == 1
    run = saga.get(run_id)
    assert run.status == "completed"
    assert [c["attempt"] for c in _calls("block", run_id)] == [1]
    assert [(e["type"], e.get("step_id")) for e in saga.history(run_id)] == [
        ("RunStarted", None), ("StepStarted", "slow"), ("StepCompleted", "slow"),
        ("StepStarted", "after"), ("StepCompleted", "after"), ("RunCompleted", None)]

    retrying = saga.submit(saga.load({"name": "backoff", "steps": [
        {"id": "flaky", "tool": "fail", "args": {"times": 1},
         "retry": {"max_attempts": 2, "backoff": "fixed", "delay": 40, "jitter": 0}}]})
    ).run_id
    # Its executors wait up to a minute in-process, so the 40 s backoff is a timer.
    waiting = Worker(saga.app, saga.leases,
                     lambda w, threads: saga.executor(worker=w, hold=60, threads=threads),
                     poll_interval=0.05, lease_seconds=60)
    done = threading.Event()
    threading.Thread(target=lambda: (waiting.run(
        stop=lambda: saga.get(retrying).steps.get("flaky", {}).get("retry_at") is not None),
        done.set()), daemon=True).start()
    assert done.wait(20), "the stop waited for the retry's 40 s backoff"
    flaky = saga.get(retrying).steps["flaky"]
    assert flaky["attempt"] == 1 and flaky["retry_at"] is not None
    assert saga.leases.holder(retrying) is None


def test_a_halted_worker_keeps_the_lease_while_a_call_still_runs(saga: Saga) -> None:
    """Stopped at once (halt: a second signal), the drive is cancelled, but the tool's
    thread cannot be: the run's lease stays held, renewed, until the call returns, so
    no other worker calls the step again meanwhile; then it is given up."""
    run_id = saga.submit(saga.load({"name": "halt", "steps": [
        {"id": "slow", "tool": "block", "args": {"seconds": 2.0}}]})).run_id
    worker = saga.worker_loop(concurrency=1, poll_interval=0.05, lease_seconds=0.6)
    seen: list[tuple[str, float] | None] = []

    def watch() -> None:
        while not _calls("block", run_id) and len(seen) < 400:
            holder = saga.leases.holder(run_id)
            if holder is not None and saga.get(run_id).steps.get("slow", {}).get(
                    "status") == "running":
                if not seen:
                    worker.halt()
                seen.append(holder)
            time.sleep(0.05)
    watcher = threading.Thread(target=watch)
    watcher.start()
    worker.run()
    ended = time.monotonic()
    watcher.join()
    calls = _calls("block", run_id)
    assert calls and calls[0]["end"] <= ended, "the worker returned before the call did"
    # Held past several lease lengths while the call ran, by this worker, renewed.
    assert len(seen) > 20 and all(h is not None and h[0] == worker.worker_id for h in seen)
    assert seen[-1][1] > seen[0][1] + 0.6  # type: ignore[index]
    assert saga.leases.holder(run_id) is None
    assert saga.get(run_id).steps["slow"]["status"] == "running"  # cut short: interrupted


def test_workers_of_a_fleet_claim_different_runs_in_one_look(saga: Saga) -> None:
    """A worker whose first choices another worker holds claims the next runs in the
    order in the same look, skips the held ones for a while, and claims them once their
    leases are up (a fleet used to try the same oldest runs, all but one worker
    claiming nothing)."""
    plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
    ids = [str(saga.submit(plan, {}).id) for _ in range(6)]
    first = saga.worker_loop(concurrency=2, worker_id="first")
    second = saga.worker_loop(concurrency=2, worker_id="second")
    mine, _, _ = first._look(set())
    theirs, _, _ = second._look(set())
    assert mine == ids[:2]
    assert theirs == ids[2:4]  # the held two skipped, in the same look
    assert second.index.runnable() == ids[2:]  # its own two (driven), and the rest
    # HELD_RECHECK on, the second looks at the held runs again (their holder may have
    # given them up): still held, they are skipped again, and its own two are claimed.
    offset = [HELD_RECHECK + 1]
    second.index.clock = lambda: datetime.now(UTC) + timedelta(seconds=offset[0])
    second.leases.clock = lambda: time.time() + offset[0]
    assert second.index.runnable() == ids
    again, _, _ = second._look(set())  # as if its own two had ended
    assert again == ids[2:4]
    # The first worker's leases are up (it died): the second claims its runs.
    offset[0] += HELD_RECHECK + 1
    for run_id in mine:
        saga.leases.db.execute("UPDATE saga_leases SET expires_at = ? WHERE run_id = ?",
                               (time.time() + offset[0] - 1, run_id))
    again, _, _ = second._look(set())
    assert again == ids[:2]


def test_a_claim_offers_the_next_runs_for_those_others_hold_and_learns_who_holds_them(
        saga: Saga) -> None:
    """A worker that wants one run offers the next runs in the order with it, in one
    statement: it takes the first no other worker holds, and learns which the others
    hold (skipped till their leases are up) without a lost claim each. Another worker
    drives the first four runs here; this one, one at a time, ends having driven the
    other two."""
    plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
    ids = [str(saga.submit(plan, {}).id) for _ in range(6)]
    other = saga.worker_loop(concurrency=4, worker_id="other")
    assert other._look(set())[0] == ids[:4]
    me = saga.worker_loop(concurrency=1, poll_interval=0.05, worker_id="me")
    claims: list[tuple[list[str], int, list[str], set[str]]] = []
    claim_runs = saga.app.claim_runs

    def spied(leases: Any, run_ids: list[str], count: int, *args: Any, **kwargs: Any) -> Any:
        claimed, held, runs = claim_runs(leases, run_ids, count, *args, **kwargs)
        claims.append((list(run_ids), count, claimed, set(held)))
        return claimed, held, runs

    saga.app.claim_runs = spied  # type: ignore[method-assign]
    try:
        assert me.run(until_idle=True) == 2
    finally:
        del saga.app.claim_runs
    assert claims[0] == (ids, 1, [ids[4]], set(ids[:4]))
    assert all(set(c[0]).isdisjoint(ids[:4]) for c in claims[1:])  # held: not offered
    for run_id in ids[4:]:
        assert saga.get(run_id).status == "completed"
    for run_id in ids[:4]:
        assert saga.get(run_id).status == "running"  # the other worker's, not driven yet
        assert saga.leases.holder(run_id)[0] == "other"  # type: ignore[index]


def test_a_claim_passes_over_a_run_that_moved_since_the_worker_read_the_log(
        pg_settings: Settings, registry: Registry) -> None:
    """In a fleet, a worker's index can be a moment behind: another worker has just
    finished a run and given its lease up, and this one has not read that yet. Its claim
    passes such a run over (it has events past what the worker has read) and takes the
    next, instead of driving a run only to find it ended; once it has read the log, the
    run is not offered at all. Without what the worker has read, the stale run is taken.
    A run that moved on without ending is claimed as before (its drive reads it whole)."""
    with Saga(pg_settings, registry=registry) as saga:
        plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
        ids = [str(saga.submit(plan, {}).id) for _ in range(3)]
        me = saga.worker_loop(concurrency=1, worker_id="me")
        me.index.refresh()
        assert saga.resume(ids[0]).status == "completed"  # elsewhere, its lease given up
        saga.pause(ids[1], actor="tester")  # moved on too, but not ended
        assert me.index.runnable()[:2] == ids[:2]  # neither read yet
        versions = me.index.versions(ids)
        assert versions == [1, 1, 1]
        assert me.leases.claim_first(ids, 1, "me", 30, versions=versions) == ([ids[1]], {})
        saga.unpause(ids[1], actor="tester")
        assert me.leases.claim_first([ids[0]], 1, "stale", 30) == ([ids[0]], {})
        me.leases.release_many([ids[0]], "stale")
        me.leases.release_many([ids[1]], "me")
        assert me._look(set())[0] == [ids[1]]  # the look reads the log first
        assert ids[0] not in me.index.runnable()


def test_a_worker_that_lost_every_claim_of_a_look_does_not_stop_while_runs_remain(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker draining until idle whose look lost each of its claims to other workers
    (no runs offered in their stead here) looks again at once instead of stopping (it
    stopped, leaving the backlog to the others)."""
    monkeypatch.setattr(saga_worker, "LOOK_AHEAD", 0)
    plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
    ids = [str(saga.submit(plan, {}).id) for _ in range(6)]
    other = saga.worker_loop(concurrency=4, worker_id="other")
    assert other._look(set())[0] == ids[:4]
    me = saga.worker_loop(concurrency=1, poll_interval=0.05, worker_id="me")
    looks: list[Any] = []
    look = me._look
    me._look = lambda driving: looks.append(look(driving)) or looks[-1]  # type: ignore[method-assign]
    assert me.run(until_idle=True) == 2
    assert looks[0] == ([], {}, True)  # 4 rounds, each lost: runs remain
    for run_id in ids[4:]:
        assert saga.get(run_id).status == "completed"


def test_a_fleet_drains_a_backlog_together(saga: Saga) -> None:
    """Three workers draining one backlog (until idle) each drive some of it, and every
    step runs once (a worker may still claim a run another has just finished, before
    its log shows it: it reads the run and ends)."""
    plan = saga.load({"name": "two", "steps": [{"id": "a", "tool": "noop"},
                                               {"id": "b", "tool": "noop",
                                                "depends_on": ["a"]}]})
    ids = [str(saga.submit(plan, {}).id) for _ in range(24)]
    workers = [saga.worker_loop(concurrency=4, poll_interval=0.05, worker_id=f"w{i}")
               for i in range(3)]
    for w in workers:
        w.index.refresh()
    barrier = threading.Barrier(len(workers))

    def drain(w: Worker) -> None:
        barrier.wait()
        w.run(until_idle=True)

    threads = [threading.Thread(target=drain, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert all(w.driven > 0 for w in workers), [w.driven for w in workers]
    for run_id in ids:
        assert [type(e).__name__ for e in saga.events(run_id)] == [
            "RunStarted", "StepStarted", "StepCompleted", "StepStarted", "StepCompleted",
            "RunCompleted"]


def test_a_look_reads_the_runs_it_claimed_in_one_read(saga: Saga,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The runs one look claims are read together, and their drives read nothing more:
    on PostgreSQL by the statement that claims them (one round trip), elsewhere by one
    read after the claim. If that read fails (or the runs it read cannot be built), each
    drive reads its own."""
    plan = saga.load({"name": "two", "steps": [
        {"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop", "depends_on": ["a"]}]})
    app = saga.app
    with_claim = app.claims_with_append()
    reads: list[tuple[str, Any]] = []
    together, alone, claim_runs, built = app.get_runs, app.get_run, app.claim_runs, app._built
    failing: list[bool] = []
    inside = threading.local()  # SQLite reads them together one by one, in get_runs

    def get_runs(run_ids: Any) -> Any:
        reads.append(("together", list(run_ids)))
        if failing:
            raise StoreUnavailableError("the store went away")
        inside.on = True
        try:
            return together(run_ids)
        finally:
            inside.on = False

    def claimed(*args: Any, **kwargs: Any) -> Any:
        taken, held, runs = claim_runs(*args, **kwargs)
        if runs is not None:
            reads.append(("claimed", sorted(runs)))
        return taken, held, runs

    def build(*args: Any) -> Any:
        if failing:
            raise ValueError("an event nobody knows")
        return built(*args)

    def get_run(run_id: Any, version: Any = None) -> Any:
        if not getattr(inside, "on", False):
            reads.append(("alone", run_id))
        return alone(run_id, version)

    first = [saga.submit(plan, {}).run_id for _ in range(3)]
    app.get_runs, app.get_run = get_runs, get_run  # type: ignore[method-assign]
    app.claim_runs, app._built = claimed, build  # type: ignore[method-assign]
    try:
        worker = saga.worker_loop(concurrency=8, worker_id="w1", poll_interval=0.01)
        assert worker.run(until_idle=True) == 3
        assert reads == [("claimed", sorted(first)) if with_claim else ("together", first)]
        second = [saga.submit(plan, {}).run_id for _ in range(2)]
        reads.clear()
        failing.append(True)
        assert worker.run(until_idle=True) == 5
        if not with_claim:
            assert reads[0] == ("together", second)
        assert "claimed" not in {kind for kind, _ in reads}
        assert sorted(r for kind, r in reads if kind == "alone") == sorted(second)
        assert any(r.levelname == "WARNING" and "could not read the 2 runs claimed "
                   "together" in r.getMessage() for r in caplog.records)
    finally:
        for name in ("get_runs", "get_run", "claim_runs", "_built"):
            delattr(app, name)
    for run_id in first + second:
        assert saga.get(run_id).status == "completed"


def test_a_worker_looks_and_commits_on_its_loop_when_nothing_else_could_move(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no run in flight a look runs on the worker's event loop, and so does a commit
    that every drive in flight waits for with nothing else under way (a hand-off to a
    thread and back cost about as much CPU as a claim); a look beside a drive in flight
    goes to a thread."""
    plan = saga.load({"name": "two", "steps": [{"id": "a", "tool": "noop"},
                                               {"id": "b", "tool": "block",
                                                "args": {"seconds": 0.3},
                                                "depends_on": ["a"]}]})
    ids = [str(saga.submit(plan, {}).id) for _ in range(2)]
    w = saga.worker_loop(concurrency=2, poll_interval=0.05)
    looks: list[tuple[bool, int]] = []
    commits: list[tuple[int, int]] = []
    look, save_runs = w._look, saga.app.save_runs

    def looking(driving: set[str]) -> Any:
        looks.append((bool(driving), threading.get_ident()))
        return look(driving)

    def saving(batch: list[Any], *release: Any) -> Any:
        commits.append((len(batch), threading.get_ident()))
        return save_runs(batch, *release)

    monkeypatch.setattr(w, "_look", looking)
    monkeypatch.setattr(saga.app, "save_runs", saving)
    assert w.run(until_idle=True) == 2
    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread
    assert looks[0] == (False, loop_thread)
    beside = [thread for driving, thread in looks if driving]
    assert beside and loop_thread not in beside  # the block step holds a drive 0.3 s
    # The two drives start in step: the commits both wait for are made on the loop (the
    # last ones, which may come apart, are covered in tests/store/test_group_commit.py).
    together = [thread for batch, thread in commits if batch == 2]
    assert together and set(together) == {loop_thread}
    for run_id in ids:
        assert saga.get(run_id).status == "completed"


def test_a_commit_goes_to_a_thread_while_a_step_or_a_child_run_is_under_way(
        saga: Saga, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A commit on the event loop stops everything on it while it lasts (through an
    outage, the whole reconnect wait): a drive whose other step is still running (an
    async tool on the loop) commits in a thread, and so does a child run, whose parent's
    drive is under way beside it."""
    child = tmp_path / "child.yaml"
    child.write_text("name: child\nsteps:\n  - {id: c, tool: noop}\n", encoding="utf-8")
    parent = saga.submit(saga.load({"name": "parent", "steps": [
        {"id": "c1", "use": str(child), "parallel_group": "g"},
        {"id": "c2", "use": str(child), "parallel_group": "g"}]}), {})
    both = saga.submit(saga.load({"name": "both", "steps": [
        {"id": "a", "tool": "noop", "parallel_group": "g"},
        {"id": "s", "tool": "sleep", "args": {"seconds": 0.3}, "parallel_group": "g"}]}), {})
    w = saga.worker_loop(concurrency=1, poll_interval=0.05)
    commits: list[tuple[list[tuple[str, str]], bool]] = []
    save_runs, loop_thread = saga.app.save_runs, threading.get_ident()

    def saving(batch: list[Any], *release: Any) -> Any:
        recorded = [(run.name, type(e).__name__ + ":" + str(getattr(e, "step_id", "")))
                    for run in batch for e in run.pending_events]
        commits.append((recorded, threading.get_ident() == loop_thread))
        return save_runs(batch, *release)

    monkeypatch.setattr(saga.app, "save_runs", saving)
    assert w.run(until_idle=True) == 2
    on_loop = {event for recorded, loop in commits if loop for event in recorded}
    assert ("both", "StepCompleted:a") not in on_loop  # the sleep step was under way
    assert not {name for name, _ in on_loop} & {"child"}
    assert ("both", "StepCompleted:a") in {e for recorded, _ in commits for e in recorded}
    assert any(name == "child" for recorded, _ in commits for name, _ in recorded)
    assert on_loop  # the commits with nothing else under way still are made on the loop
    for run_id in (parent.run_id, both.run_id):
        assert saga.get(run_id).status == "completed"


def test_between_reads_of_the_log_a_look_claims_from_what_the_worker_has_read(
        pg_settings: Settings, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """On PostgreSQL a look reads the log at most every FOLLOW_EVERY seconds: in between
    it claims from its index (the claim passes over the runs that ended meanwhile), a run
    whose drive just ended here is not offered again before the log says what the drive
    did (here: it waits for an approval, and would be driven again and again), and a
    look that finds nothing reads the log and tries again, so nothing is missed. With a
    queue that limits its drives or starts, every look reads the log (the limits count
    what it says)."""
    monkeypatch.setattr(saga_worker, "FOLLOW_EVERY", 3600.0)  # never, but when needed
    counts = {"reads": 0, "looks": 0}

    def counted(worker: Worker) -> Worker:
        refresh, look = worker.index.refresh, worker._look

        def counted_refresh() -> None:
            counts["reads"] += 1
            refresh()

        def counted_look(driving: set[str]) -> Any:
            # A look while every drive is taken claims nothing and reads nothing.
            counts["looks"] += len(driving) < worker.concurrency
            return look(driving)

        worker.index.refresh = counted_refresh  # type: ignore[method-assign]
        worker._look = counted_look  # type: ignore[method-assign]
        return worker

    limited = replace(pg_settings, queues={"default": QueueLimit(concurrency=50)})
    with Saga(limited, registry=registry) as saga:
        plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
        ids = [saga.submit(plan, {}).run_id for _ in range(4)]
        worker = counted(saga.worker_loop(concurrency=1, poll_interval=0.01))
        assert worker.run(until_idle=True) == 4
        assert counts["looks"] >= 5 and counts["reads"] == counts["looks"]
        assert all(saga.get(r).status == "completed" for r in ids)
    counts.update(reads=0, looks=0)
    with Saga(pg_settings, registry=registry) as saga:
        asking = saga.load({"name": "ask", "steps": [
            {"id": "a", "tool": "noop", "confirm": "Go on?"}]})
        ids = [saga.submit(plan if i % 3 else asking, {}).run_id for i in range(12)]
        worker = counted(saga.worker_loop(concurrency=1, poll_interval=0.01))
        assert worker.run(until_idle=True, stop=lambda: worker.driven > 24) == 12
        assert counts["looks"] >= 13 and counts["reads"] <= 3  # the first look, the last
        statuses = [saga.get(r).status for r in ids]
        assert statuses == ["waiting" if i % 3 == 0 else "completed" for i in range(12)]
        late = saga.submit(plan, {}).run_id  # a look that finds nothing reads the log
        assert worker.run(until_idle=True) == 13 and saga.get(late).status == "completed"


def test_a_run_parked_in_the_index_is_runnable_again_once_the_log_is_read(
        saga: Saga) -> None:
    plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
    ids = [saga.submit(plan, {}).run_id for _ in range(2)]
    worker = saga.worker_loop(concurrency=1)
    worker.index.refresh()
    worker.index.park(ids[0])
    assert worker.index.runnable() == ids[1:]
    worker.index.refresh()
    assert worker.index.runnable() == ids


def test_a_look_between_reads_passes_over_runs_that_ended_and_learns_of_takeovers(
        pg_settings: Settings, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between reads of the log a worker's index can be behind. Its claim passes over
    the runs that ended elsewhere meanwhile (taking the next in one statement) and does
    not offer them again in that look; a run its read shows another worker died under
    is given up at once when claimed beside others, to be claimed alone."""
    monkeypatch.setattr(saga_worker, "FOLLOW_EVERY", 3600.0)
    with Saga(pg_settings, registry=registry) as saga:
        plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
        ids = [saga.submit(plan, {}).run_id for _ in range(5)]
        me = saga.worker_loop(concurrency=1, worker_id="me")
        me.index.refresh()
        me._followed = time.monotonic()  # as a look has just read the log
        for run_id in ids[:2]:
            assert saga.resume(run_id).status == "completed"  # ended elsewhere
        claims: list[list[str]] = []
        claim_runs = saga.app.claim_runs

        def spied(leases: Any, run_ids: list[str], *args: Any, **kwargs: Any) -> Any:
            claims.append(list(run_ids))
            return claim_runs(leases, run_ids, *args, **kwargs)

        saga.app.claim_runs = spied  # type: ignore[method-assign]
        try:
            assert me._look(set())[0] == [ids[2]]  # ids[0], ids[1]: passed over
            assert claims == [ids]
            me.leases.release_many([ids[2]], "me")
            claims.clear()
            wide = saga.worker_loop(concurrency=2, worker_id="wide")
            wide.index.refresh()
            wide._followed = time.monotonic()
            for run_id in ids[2:4]:
                assert saga.resume(run_id).status == "completed"
            assert wide._look(set())[0] == [ids[4]]
            assert len(claims) == 1  # the ended two are not offered again in rounds
            wide.leases.release_many([ids[4]], "wide")
        finally:
            del saga.app.claim_runs
        assert saga.resume(ids[4]).status == "completed"
        suspect, other = [saga.submit(plan, {}).run_id for _ in range(2)]
        pair = saga.worker_loop(concurrency=2, worker_id="pair")
        pair.index.refresh()
        pair._followed = time.monotonic()
        run = saga.app.get_run(suspect)
        run.take_over("a worker that died")
        saga.app.save_run(run)
        assert pair._look(set())[0] == [other]
        assert pair.index.runs[suspect].takeovers == 1
        assert saga.leases.holder(suspect) is None  # given up, to be claimed alone
        pair.leases.release_many([other], "pair")
        assert pair._look(set())[0] == [suspect]
