"""Leases on both stores: claim, renew, release, and what commits without waiting."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from saga.api import Saga
from saga.config import Settings
from saga.domain import run_uuid
from saga.errors import ConcurrentWriteError, LeaseHeldError, RunNotFoundError
from saga.store.leases import Leases, lease_key
from saga.tools import Registry, Tool, ToolContext


def test_claim_renew_release_on_both_stores(saga: Saga) -> None:
    saga.leases  # noqa: B018 - creates the store and its side tables
    assert saga._db is not None
    now = [1000.0]
    leases = Leases(saga._db, clock=lambda: now[0])
    assert leases.claim("r1", "a", 10)
    assert not leases.claim("r1", "b", 10)  # held by a
    assert leases.renew("r1", "a", 30)
    assert leases.holder("r1") == ("a", 1030.0)
    assert not leases.renew("r1", "b", 30)  # not b's to renew
    leases.release("r1", "b")  # not b's to give up
    assert leases.holder("r1") == ("a", 1030.0)
    leases.release("r1", "a")
    assert leases.holder("r1") is None
    assert not leases.renew("r1", "a", 30)  # nothing left to renew
    assert leases.claim("r1", "b", 10)
    now[0] = 2000.0  # b's lease expired: a may take the run over
    assert leases.claim("r1", "a", 10)


def test_a_claim_takes_the_first_runs_nobody_else_holds_and_names_the_holders(
        saga: Saga) -> None:
    """``claim_first`` takes the first ``count`` of the runs offered, in their order,
    that no other worker holds (its own and expired leases count free) and returns the
    others' unexpired leases it met, with their expiry; on both stores."""
    saga.leases  # noqa: B018 - creates the store and its side tables
    assert saga._db is not None
    now = [1000.0]
    leases = Leases(saga._db, clock=lambda: now[0])
    assert leases.claim("r1", "b", 10) and leases.claim("r3", "b", 50)
    assert leases.claim("r2", "a", 10) and leases.claim("r4", "c", 1)
    now[0] = 1005.0  # c's lease on r4 has expired
    offered = ["r1", "r2", "r3", "r4", "r5", "r6"]
    assert leases.claim_first(offered, 2, "a", 30, ["q"] * 6) == (
        ["r2", "r4"], {"r1": 1010.0, "r3": 1050.0})
    assert leases.holder("r2") == ("a", 1035.0)  # its own: taken again, extended
    assert leases.holder("r4") == ("a", 1035.0)
    assert leases.holder("r5") is None  # beyond the two wanted: not taken
    assert leases.claim_first(offered, 4, "a", 30) == (
        ["r2", "r4", "r5", "r6"], {"r1": 1010.0, "r3": 1050.0})
    assert leases.claim_first(["r1", "r3"], 1, "a", 30) == ([], {"r1": 1010.0,
                                                                 "r3": 1050.0})
    assert leases.claim_first([], 1, "a", 30) == ([], {})


def test_renewals_commit_without_waiting_for_the_flush_and_releases_wait(
        pg_settings: Settings, registry: Registry) -> None:
    """A renewal is one autocommit statement whose transaction sets synchronous_commit
    off for itself (seen by running it inside a transaction of ours); the session keeps
    it on. A release, like a claim, waits for its flush (issue 44: one lost in a server
    crash left its run to wait a whole lease)."""
    s = Saga(pg_settings, registry=registry)
    try:
        leases = s.leases
        assert s._db is not None
        db = s._db
        assert leases.claim("r1", "a", 10)
        conn = db.conn
        for change, waits in ((lambda: leases.renew("r1", "a", 30), False),
                              (lambda: leases.release("r1", "a"), True)):
            with conn.transaction():
                change()
                row = conn.execute("SHOW synchronous_commit").fetchone()
                assert row is not None and row[0] == ("on" if waits else "off")
            row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None and row[0] == "on"
        assert leases.holder("r1") is None
        with conn.transaction():  # a claim waits for its flush
            assert leases.claim("r1", "a", 10)
            row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None and row[0] == "on"
    finally:
        s.close()


def _holder_seen(saga: Saga, seen: list[Any]) -> Any:
    """A tool that records who holds its run's lease while it runs."""

    def look(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        seen.append(saga.leases.holder(ctx.run_id))
        return {}
    return look


def test_a_new_run_is_claimed_by_its_first_append(saga: Saga) -> None:
    """On PostgreSQL (saga's recorder) a run never saved is claimed by the statement of its
    first append, not by a commit of its own; on SQLite by a claim first. Either way the
    lease is held while its steps run, and given up after."""
    seen: list[Any] = []
    saga.registry.add(Tool("look_at_lease", _holder_seen(saga, seen)))
    claims: list[str] = []
    real_claim = saga.leases.claim

    def counted(run_id: str, *args: Any, **kwargs: Any) -> bool:
        claims.append(run_id)
        return real_claim(run_id, *args, **kwargs)
    saga.leases.claim = counted  # type: ignore[method-assign]
    run = saga.run(saga.load({"name": "lease", "steps": [
        {"id": "a", "tool": "look_at_lease"}, {"id": "b", "tool": "look_at_lease",
                                               "depends_on": ["a"]}]}))
    assert run.status == "completed"
    assert [h[0] if h else None for h in seen] == [saga.worker, saga.worker]
    assert saga.leases.holder(run.run_id) is None
    assert claims == ([] if saga.app.claims_with_append() else [run.run_id])
    assert saga.app.claims_with_append() == saga.settings.is_postgres


def test_the_append_that_ends_a_run_gives_its_lease_up(saga: Saga) -> None:
    """On PostgreSQL (saga's recorder) the statement that appends a run's last events
    releases its lease too, with no statement of its own; on SQLite a release follows.
    A run that does not end (it waits) keeps the lease to the end of the drive, and an
    ending append that fails releases nothing: the lease is given up afterwards."""
    releases: list[list[str]] = []
    real_release = saga.leases.release_many

    def counted(run_ids: Any, worker: str) -> None:
        releases.append(list(run_ids))
        real_release(run_ids, worker)
    saga.leases.release_many = counted  # type: ignore[method-assign]
    plan = saga.load({"name": "ends", "steps": [
        {"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop", "depends_on": ["a"]}]})
    run = saga.run(plan)
    assert run.status == "completed"
    assert saga.leases.holder(run.run_id) is None
    with_append = saga.app.claims_with_append()
    assert releases == ([] if with_append else [[run.run_id]])

    releases.clear()
    waits = saga.run(saga.load({"name": "waits", "steps": [
        {"id": "a", "tool": "noop", "confirm": "go on?"}]}))
    assert waits.status == "waiting"
    assert releases == [[waits.run_id]] and saga.leases.holder(waits.run_id) is None

    releases.clear()

    def interfere(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """A second driver appends while the last step runs: the ending append conflicts
        (a command, such as a pause, would be taken in instead: tests/executor/
        test_incoming.py)."""
        second = saga.get(ctx.run_id)
        second.take_over("a second driver")
        saga.app.save_run(second)
        return {}
    saga.registry.add(Tool("interfere", interfere))
    with pytest.raises(ConcurrentWriteError):
        saga.run(saga.load({"name": "loses", "steps": [{"id": "a", "tool": "interfere"}]}),
                 run_id="LOSER-1")
    loser = saga.get("LOSER-1")
    assert not loser.is_finished
    # a named run's lease is keyed by its UUID, as a worker claims it
    assert releases == [[lease_key("LOSER-1")]] and saga.leases.holder("LOSER-1") is None


def test_a_first_append_whose_lease_is_held_stores_nothing(saga: Saga) -> None:
    """Another process holds the lease of a run id not yet saved (it is starting the same
    run): the first append neither claims nor stores, and says who holds it."""
    key = str(run_uuid("ORDER-9"))  # a lease is keyed by the run's UUID, as workers claim
    assert saga.leases.claim(key, "someone-else", 30)
    plan = saga.load({"name": "held", "steps": [{"id": "a", "tool": "noop"}]})
    run = saga.start(plan, {}, run_id="ORDER-9")
    with pytest.raises(LeaseHeldError, match=r"run ORDER-9 .* 'someone-else'"):
        saga.drive(run, wait=0.2)
    with pytest.raises(RunNotFoundError):
        saga.get("ORDER-9")
    assert saga.leases.holder(key)[0] == "someone-else"  # type: ignore[index]


def test_a_release_locks_its_rows_in_the_order_claims_do(pg_settings: Settings,
                                                         registry: Registry) -> None:
    """A worker's release of several leases locks them in run id order, as a claim of
    several does, so the two never deadlock: while a claim holds the lowest row (as
    claiming a run another worker holds locks its row), the release waits for it
    holding nothing, and the claim can go on to the next row."""
    s = Saga(pg_settings, registry=registry)
    try:
        leases = s.leases
        assert leases.claim("r2", "a", 30) and leases.claim("r1", "a", 30)  # r2 stored first
        assert pg_settings.database_url
        with psycopg.connect(pg_settings.database_url) as claim:
            claim.execute(f'SET search_path TO "{pg_settings.schema}"')
            claim.execute("SELECT 1 FROM saga_leases WHERE run_id = 'r1' FOR UPDATE")
            release = threading.Thread(target=leases.release_many, args=(["r2", "r1"], "a"))
            release.start()
            time.sleep(0.5)  # the release is waiting for r1
            claim.execute("SELECT 1 FROM saga_leases WHERE run_id = 'r2' FOR UPDATE NOWAIT")
            claim.rollback()
            release.join(timeout=10)
        assert leases.holder("r1") is None and leases.holder("r2") is None
    finally:
        s.close()


def test_workers_claiming_the_same_runs_at_once_never_share_one(pg_settings: Settings,
                                                                 registry: Registry) -> None:
    """Four workers, each on its own connection, claim from the same runs at once (each
    wanting 3, offering all of them) and give some back, over and over: a run is never
    held by two, none deadlocks, and what one is told another holds is that other's."""
    sagas = [Saga(pg_settings, registry=registry) for _ in range(4)]
    try:
        runs = [f"r{i:02d}" for i in range(24)]
        holding: dict[str, str] = {}
        lock = threading.Lock()
        problems: list[str] = []

        def work(index: int) -> None:
            leases, me = sagas[index].leases, f"w{index}"
            mine: list[str] = []
            for _ in range(40):
                claimed, held = leases.claim_first(runs, 3, me, 30)
                with lock:
                    for r in claimed:
                        if holding.get(r, me) != me:
                            problems.append(f"{r} claimed by {me}, held by {holding[r]}")
                        holding[r] = me
                    problems.extend(f"{r} reported held by {me}'s own lease"
                                    for r in held if holding.get(r) == me)
                mine = sorted(set(mine) | set(claimed))
                give_back, mine = mine[:2], mine[2:]
                with lock:  # before the release commits: nobody can take them yet
                    for r in give_back:
                        del holding[r]
                leases.release_many(give_back, me)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert problems == []
        assert {r: h for r, (h, _) in sagas[0].leases.holders(runs).items()} == holding
    finally:
        for s in sagas:
            s.close()


def test_a_run_has_one_lease_whether_named_or_keyed(saga: Saga) -> None:
    """A run named by its caller is stored (and claimed by workers) under a UUID derived
    from the name: a claim by either is a claim of the one lease (issue 38: ``saga resume
    NAME`` once held a lease of its own beside a live worker's)."""
    key = str(run_uuid("ORDER-42"))
    assert lease_key("ORDER-42") == key and lease_key(key) == key
    assert saga.leases.claim(key, "worker", 30)
    assert not saga.leases.claim("ORDER-42", "resume", 30)  # held: not a second lease
    assert saga.leases.holder("ORDER-42") == saga.leases.holder(key)
    assert saga.leases.held_by_others(["ORDER-42"], "resume") == {
        "ORDER-42": saga.leases.holder(key)[1]}  # type: ignore[index]
    assert saga.leases.claim_first(["ORDER-42"], 1, "resume", 30) == (
        [], {"ORDER-42": saga.leases.holder(key)[1]})  # type: ignore[index]
    saga.leases.release("ORDER-42", "worker")
    assert saga.leases.holder(key) is None
