"""Group commit: several runs' appends in one transaction, a stale run failing alone."""

from __future__ import annotations

import asyncio
import threading

import pytest
from eventsourcing.application import ProcessingEvent

from saga.api import Saga
from saga.errors import ConcurrentWriteError, StoreUnavailableError
from saga.store.group_commit import GroupCommit

FLOW = {"name": "g", "steps": [{"id": "a", "tool": "noop"}]}


def test_appends_share_a_commit_and_a_stale_run_fails_alone(saga: Saga) -> None:
    plan = saga.load(FLOW)
    runs = [saga.submit(plan, {}) for _ in range(4)]
    fresh = [saga.app.get_run(r.run_id) for r in runs]
    stale = saga.app.get_run(runs[2].run_id)
    other = saga.app.get_run(runs[2].run_id)
    other.pause("tester", "ahead")  # another writer moves run 2 on first
    saga.app.save_run(other)
    stale.pause("tester", "behind")
    for run in fresh[:2] + fresh[3:]:
        run.pause("tester", "grouped")
    group = GroupCommit(saga.app)

    async def save_all() -> list[BaseException | None]:
        tasks = [group.save(r) for r in [fresh[0], fresh[1], stale, fresh[3]]]
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    results = asyncio.run(save_all())
    assert [type(r) for r in results] == [bool, bool, ConcurrentWriteError, bool]
    assert [r for r in results if isinstance(r, bool)] == [False] * 3  # no lease given up
    assert group.commits == 1  # one batch (retried one by one inside it after the conflict)
    for i in (0, 1, 3):
        assert saga.app.get_run(runs[i].run_id).paused
    assert saga.app.get_run(runs[2].run_id).version == other.version


@pytest.mark.parametrize("landed", [False, True])
def test_a_batch_whose_connection_is_lost_is_settled_run_by_run(
        saga: Saga, monkeypatch: pytest.MonkeyPatch, landed: bool) -> None:
    """A batch whose outcome a lost connection hid is settled run by run, by reading each
    run's versions back: a run found stored is left as it is, one not stored is appended
    again, and no run is appended twice."""
    plan = saga.load(FLOW)
    ids = [saga.submit(plan, {}).run_id for _ in range(2)]
    runs = [saga.app.get_run(run_id) for run_id in ids]
    for run in runs:
        run.pause("tester", "grouped")
    original, calls = saga.app.save, []

    def losing(*objs: object, **kw: object) -> object:
        calls.append(len(objs))
        if len(calls) == 1:
            if landed:
                original(*objs, **kw)  # type: ignore[arg-type]
            raise StoreUnavailableError("the connection went with the commit (test)")
        return original(*objs, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(saga.app, "save", losing)
    assert saga.app.save_runs(runs) == [None, None]
    assert calls == ([2] if landed else [2, 1, 1])
    for run_id in ids:
        run = saga.app.get_run(run_id)
        assert run.paused and run.version == 2  # paused once: appended once


def test_a_batch_without_conflict_is_one_transaction(saga: Saga,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    plan = saga.load(FLOW)
    runs = [saga.app.get_run(saga.submit(plan, {}).run_id) for _ in range(5)]
    for run in runs:
        run.pause("tester", "grouped")
    calls: list[int] = []
    original = saga.app.save

    def counting(*aggregates: object, **kw: object) -> object:
        calls.append(len(aggregates))
        return original(*aggregates, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(saga.app, "save", counting)

    async def save_all() -> None:
        await asyncio.gather(*(GroupCommit(saga.app).save(r) for r in runs[:1]))
        group = GroupCommit(saga.app)
        await asyncio.gather(*(group.save(r) for r in runs[1:]))

    asyncio.run(save_all())
    assert calls == [1, 4]
    assert all(saga.app.get_run(r.run_id).paused for r in runs)


def test_saving_a_run_collects_it_without_the_protocol_checks(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's save takes its events straight from it (the library's collecting checks
    each object against runtime protocols); saved events, as a retried append passes
    them, are still collected the library's way."""
    collected: list[object] = []
    library = ProcessingEvent.collect_events

    def counted(self: ProcessingEvent[object], *objs: object, **kwargs: object) -> None:
        collected.extend(objs)
        library(self, *objs, **kwargs)

    monkeypatch.setattr(ProcessingEvent, "collect_events", counted)
    run = saga.submit(saga.load(FLOW), {})
    assert collected == []
    again = saga.app.get_run(run.run_id)
    again.pause("tester")
    event = again.collect_events()[0]
    saga.app.save(event)
    assert collected == [event]
    assert saga.app.get_run(run.run_id).paused


def test_a_batch_of_every_drive_in_flight_commits_on_the_loop(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that every drive in flight waits for, none of them with anything else
    under way, is made on the event loop (nothing on it could move meanwhile, and the
    hand-off to a thread and back cost as much CPU as the commit); otherwise it goes to a
    thread: another drive could move, a drive of the batch has a step under way, or the
    group counts no drives (used outside a worker)."""
    plan = saga.load(FLOW)
    runs = [saga.app.get_run(saga.submit(plan, {}).run_id) for _ in range(6)]
    for run in runs:
        run.pause("tester", "grouped")
    made: list[tuple[int, int]] = []
    original = saga.app.save_runs

    def recording(batch: list[object], *release: object) -> object:
        made.append((len(batch), threading.get_ident()))
        return original(batch, *release)  # type: ignore[arg-type]

    monkeypatch.setattr(saga.app, "save_runs", recording)

    async def save_all() -> int:
        group = GroupCommit(saga.app)
        await group.save(runs[0], idle=True)  # no drives counted: a thread
        group.drives = 2
        await group.save(runs[1], idle=True)  # the other drive moves on meanwhile
        await asyncio.gather(group.save(runs[2], idle=True),
                             group.save(runs[3], idle=False))  # a step under way
        await asyncio.gather(group.save(runs[4], idle=True),
                             group.save(runs[5], idle=True))  # both wait: the loop
        return threading.get_ident()

    loop_thread = asyncio.run(save_all())
    assert [n for n, _ in made] == [1, 1, 2, 2]
    assert [thread == loop_thread for _, thread in made] == [False, False, False, True]
    assert all(saga.app.get_run(r.run_id).paused for r in runs)
