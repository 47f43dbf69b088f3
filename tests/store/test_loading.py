"""Loading a run on PostgreSQL in one round trip (its latest snapshot and the events after
it) builds exactly what the library's repository builds in two."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from saga.api import Saga
from saga.config import Settings
from saga.domain import run_uuid
from saga.store.application import SagaApplication
from saga.tools import Registry


def chain(n: int) -> dict[str, Any]:
    return {"name": f"chain-{n}", "steps": [
        {"id": f"s{i}", "tool": "noop", **({"depends_on": [f"s{i - 1}"]} if i else {})}
        for i in range(n)]}


def state(run: Any) -> dict[str, Any]:
    """What a run holds, without the indexes it derives on first use."""
    return {k: v for k, v in vars(run).items() if k not in ("_unsettled", "_touched",
                                                             "_derived")}


def test_one_round_trip_builds_what_the_repository_builds(pg_settings: Settings,
                                                           registry: Registry) -> None:
    settings = replace(pg_settings, snapshot_interval=3)
    with Saga(settings, registry=registry) as saga:
        app: SagaApplication = saga.app
        submitted = saga.submit(saga.load(chain(2)))  # one event: no snapshot yet
        finished = saga.run(saga.load(chain(7)))  # 16 events: snapshots at 3, 6, ... 15
        loaded = 0
        for run_id in (submitted.run_id, finished.run_id):
            uid = run_uuid(run_id)
            via_repository = app.repository.get(uid)
            snapshot, events = app.recorder.select_run(  # type: ignore[attr-defined]
                uid, app.snapshots.recorder.events_table_name)  # type: ignore[union-attr]
            one_trip = app.get_run(run_id)
            assert one_trip.version == via_repository.version
            assert state(one_trip) == state(via_repository)
            if run_id == finished.run_id:
                assert snapshot is not None and snapshot.originator_version == 15
                assert [e.originator_version for e in events] == [16]
            else:
                assert snapshot is None and [e.originator_version for e in events] == [1]
            loaded += 1
        assert loaded == 2
        # Without snapshots: the events alone, still one statement.
        assert app.recorder.select_run(  # type: ignore[attr-defined]
            run_uuid(finished.run_id), None)[0] is None
        assert [e.originator_version for e in app.recorder.select_run(  # type: ignore[attr-defined]
            run_uuid(finished.run_id), None)[1]] == list(range(1, 17))


def test_a_run_nobody_started_is_not_found(pg_settings: Settings, registry: Registry) -> None:
    with Saga(pg_settings, registry=registry) as saga:
        saga.submit(saga.load(chain(1)))
        assert saga.app._load(run_uuid("NOBODY")) is None


def test_runs_read_together_are_the_runs_read_one_by_one(settings: Settings,
                                                         registry: Registry) -> None:
    """``get_runs`` (a worker's look reads the runs it claimed with it) builds, for each
    run found, exactly what ``get_run`` builds: past a snapshot, with none yet, under a
    name its caller chose; a run nobody started is left out."""
    with Saga(replace(settings, snapshot_interval=3), registry=registry) as saga:
        submitted = saga.submit(saga.load(chain(2)))  # one event: no snapshot yet
        finished = saga.run(saga.load(chain(7)))  # snapshots at 3, 6, ... 15, then 16
        named = saga.submit(saga.load(chain(1)), run_id="ORDER-42")
        wanted = [finished.run_id, "NOBODY", submitted.run_id, named.run_id]
        together = saga.app.get_runs(wanted)
        assert sorted(together) == sorted([finished.run_id, submitted.run_id, "ORDER-42"])
        for run_id, run in together.items():
            alone = saga.app.get_run(run_id)
            assert (run.version, state(run)) == (alone.version, state(alone))
        assert together[finished.run_id].version == 16
        assert together[finished.run_id].status == "completed"
        assert saga.app.get_runs([]) == {}


def test_runs_read_together_take_one_statement_past_each_run_s_latest_snapshot(
        pg_settings: Settings, registry: Registry) -> None:
    with Saga(replace(pg_settings, snapshot_interval=3), registry=registry) as saga:
        app: SagaApplication = saga.app
        short = saga.run(saga.load(chain(1)))  # 4 events: a snapshot at 3
        long = saga.run(saga.load(chain(7)))  # 16 events
        table = app.snapshots.recorder.events_table_name  # type: ignore[union-attr]
        read = app.recorder.select_runs(  # type: ignore[attr-defined]
            [run_uuid(short.run_id), run_uuid(long.run_id), run_uuid("NOBODY")], table)
        assert set(read) == {run_uuid(short.run_id), run_uuid(long.run_id)}
        snapshot, events = read[run_uuid(long.run_id)]
        assert snapshot is not None and snapshot.originator_version == 15
        assert [e.originator_version for e in events] == [16]
        snapshot, events = read[run_uuid(short.run_id)]
        assert snapshot is not None and snapshot.originator_version == 3
        assert [e.originator_version for e in events] == [4]
        events_only = app.recorder.select_runs(  # type: ignore[attr-defined]
            [run_uuid(long.run_id)], None)[run_uuid(long.run_id)]
        assert events_only[0] is None
        assert [e.originator_version for e in events_only[1]] == list(range(1, 17))


def test_a_claim_reads_the_runs_it_claims_as_get_run_builds_them(
        settings: Settings, registry: Registry) -> None:
    """A worker's claim (``claim_runs``) takes the first runs nobody else holds and, on
    PostgreSQL, reads them in the same statement: each built exactly as ``get_run``
    builds it, past its latest snapshot. Another worker's lease is reported, not taken;
    a run that has ended past the version offered is passed over. Elsewhere the claim
    is made alone and the runs are left to ``get_runs``."""
    with Saga(replace(settings, snapshot_interval=3), registry=registry) as saga:
        app: SagaApplication = saga.app
        leases = saga.leases
        held = saga.submit(saga.load(chain(1))).run_id
        assert leases.claim(held, "other", 30)
        long = saga.run(saga.load(chain(7))).run_id  # ended: snapshots at 3, ... 15
        short = saga.submit(saga.load(chain(2))).run_id  # one event
        offered = [held, long, short]
        claimed, others, runs = app.claim_runs(leases, offered, 3, "me", 30, [None] * 3)
        assert claimed == [long, short]
        assert set(others) == {held}
        assert all(leases.holder(r)[0] == "me" for r in claimed)  # type: ignore[index]
        if not app.claims_with_append():
            assert runs is None
            return
        assert runs is not None and sorted(runs) == sorted(claimed)
        for run_id, run in runs.items():
            alone = app.get_run(run_id)
            assert (run.version, state(run)) == (alone.version, state(alone))
        assert runs[long].version == 16 and runs[long].status == "completed"
        leases.release_many(claimed, "me")
        claimed, others, runs = app.claim_runs(leases, offered, 2, "me", 30, [None] * 3,
                                               versions=[1, 1, 1])
        assert (claimed, set(others)) == ([short], {held})  # long ended past version 1
        assert runs is not None and list(runs) == [short] and runs[short].version == 1


def test_rows_of_a_union_are_put_in_the_order_runs_are_built_in() -> None:
    """The claim's statement reads runs in a union, which keeps no order: its rows are
    sorted by run, each run's snapshot first, then its events by version."""
    import random

    from saga.store.pg_recorder import _in_run_order

    a, b = run_uuid("A"), run_uuid("B")
    ordered = sorted([(True, a, 3, "s", b""), (False, a, 4, "e", b""), (False, a, 5, "e", b""),
                      (False, b, 1, "e", b""), (False, b, 2, "e", b"")],
                     key=lambda r: (str(r[1]), not r[0], r[2]))
    for seed in range(5):
        shuffled = list(ordered)
        random.Random(seed).shuffle(shuffled)
        assert _in_run_order(shuffled) == sorted(ordered, key=lambda r: (r[1], not r[0], r[2]))
    assert [r[:3] for r in _in_run_order(reversed(ordered)) if r[1] == a] == [
        (True, a, 3), (False, a, 4), (False, a, 5)]
