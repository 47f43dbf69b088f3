"""Loading a run from a snapshot at its last version reads what a short run's load reads,
however long the run (issue 44), counted in rows and pages, not timed: on PostgreSQL by
``EXPLAIN (ANALYZE, BUFFERS)`` of the very statements a load and a worker's
claim-and-read send, on SQLite by the virtual-machine instructions SQLite steps through
while the run loads. On both, by the events deserialised. And ``Saga.get`` loads once.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest

from saga.api import Saga
from saga.config import Settings
from saga.domain import Run, run_uuid
from saga.store.application import SagaApplication, snapshot_due
from saga.store.leases import claim_first_args

ONE_STEP: dict[str, Any] = {"name": "long", "steps": [{"id": "s0", "tool": "noop"}]}


def long_run(saga: Saga, events: int) -> str:
    """A run of ``events`` events (RunStarted, then failed attempts of one step), saved in
    pages of 1,000, with a snapshot at its last version."""
    run = saga.start(saga.load(ONE_STEP), {})
    attempt = 0
    while run.version < events:
        if run.version % 2:  # after RunStarted and each StepFailed: a new attempt
            attempt += 1
            run.start_step("s0", 0, attempt, {}, "test")
        else:
            run.fail_step("s0", 0, attempt, "Boom", "synthetic", True, None)
        if len(run.pending_events) >= 1000:
            saga.app.save_run(run)
    if run.pending_events:
        saga.app.save_run(run)
    interval = saga.settings.snapshot_interval
    if interval and not snapshot_due(events, interval):  # else taken with the save
        saga.app.take_snapshot(run.id, version=events)
    return run.run_id


@contextmanager
def events_deserialised(app: SagaApplication) -> Iterator[list[int]]:
    """Count the stored events the application turns into domain events (the count is
    the list's one item; a snapshot, which the same mapper reads, is not counted)."""
    mapper: Any = app.events.mapper
    real: Callable[..., Any] = mapper.to_domain_event
    count = [0]

    def counted(stored: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += not stored.topic.endswith("Snapshot")
        return real(stored, *args, **kwargs)

    mapper.to_domain_event = counted
    try:
        yield count
    finally:
        del mapper.to_domain_event


def sqlite_steps(app: SagaApplication, load: Callable[[], Run]) -> int:
    """Virtual-machine instructions SQLite steps through on the store's connections while
    ``load`` runs: a scan of the run's events would step through each row."""
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    conns: list[sqlite3.Connection] = []
    for recorder in (app.recorder, getattr(app.snapshots, "recorder", None)):
        pool: Any = recorder.datastore.pool  # type: ignore[union-attr]
        conns += [c._sqlite_conn for c in pool._pool]
    assert conns, "a load before this one left the store's connections in its pool"
    for conn in conns:
        conn.set_progress_handler(step, 1)
    try:
        load()
    finally:
        for conn in conns:
            conn.set_progress_handler(None, 1)
    return steps[0]


def explained(settings: Settings, statement: bytes, params: Any) -> tuple[int, int]:
    """Rows every scan node of ``statement``'s plan read (returned or filtered out) and
    the shared buffers it touched, from ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction
    that is rolled back (a claim's lease is not kept)."""
    import psycopg
    from psycopg.rows import tuple_row

    def rows_read(node: dict[str, Any]) -> int:
        own = 0
        if "Scan" in node["Node Type"] and node.get("Relation Name") == "saga_events":
            own = (node["Actual Rows"] + node.get("Rows Removed by Filter", 0) +
                   node.get("Rows Removed by Index Recheck", 0)) * node["Actual Loops"]
        return own + sum(rows_read(child) for child in node.get("Plans", []))

    assert settings.database_url
    with psycopg.connect(settings.database_url) as conn, \
            conn.cursor(row_factory=tuple_row) as curs:
        curs.execute(f'SET search_path TO "{settings.schema}"')
        curs.execute(b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params,
                     binary=True)
        plan = curs.fetchone()[0]  # type: ignore[index]
        conn.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return rows_read(top), top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def test_a_long_run_loads_from_its_snapshot_as_a_short_one_does(settings: Settings) -> None:
    with Saga(settings) as saga:
        app = saga.app
        runs = {n: long_run(saga, n) for n in (100, 10_000)}
        for run_id in runs.values():  # warm: prepared statements, pooled connections
            assert app.get_run(run_id).version in runs
        cost: dict[int, dict[str, int]] = {}
        for n, run_id in runs.items():
            with events_deserialised(app) as count:
                assert app.get_run(run_id).version == n
            cost[n] = {"events": count[0]}
            if settings.is_postgres:
                recorder: Any = app.recorder
                table = app._snapshot_table()
                cost[n]["rows"], cost[n]["buffers"] = explained(
                    settings, recorder._run_statements[table], {"ids": [run_uuid(run_id)]})
            else:
                cost[n]["steps"] = sqlite_steps(app, lambda r=run_id: app.get_run(r))  # type: ignore[misc]
        assert cost[10_000]["events"] == cost[100]["events"] == 0  # the snapshot alone
        for measure in cost[100]:
            assert cost[10_000][measure] <= 2 * max(cost[100][measure], 1), (measure, cost)


def test_a_claim_reads_a_long_run_from_its_snapshot(pg_settings: Settings) -> None:
    """The worker's claim-and-read statement reads a long run's events after its
    snapshot only (the same read as a load; EXPLAIN ANALYZE runs the claim and is rolled
    back, so the lease is not taken)."""
    with Saga(pg_settings) as saga:
        app = saga.app
        runs = {n: long_run(saga, n) for n in (10, 100, 10_000)}
        # a claim for real first (of another run): it prepares the statement explained
        claimed, _, loaded = app.claim_runs(saga.leases, [runs[10]], 1, "w1", 30, [None])
        assert claimed == [runs[10]] and loaded and loaded[runs[10]].version == 10
        statement = app.recorder._claim_statements[False, app._snapshot_table()]  # type: ignore[attr-defined]
        cost = {n: explained(pg_settings, statement, claim_first_args(
            [runs[n]], 1, "w2", 30, [None], None, saga.leases.clock()))
            for n in (100, 10_000)}
        rows, buffers = cost[10_000]
        assert rows <= 2 * max(cost[100][0], 1), cost
        assert buffers <= 2 * cost[100][1] + 8, cost  # the claim's own lease rows beside


@pytest.mark.parametrize("how", ["id", "name", "prefix"])
def test_get_loads_the_run_once(sqlite_settings: Settings, how: str) -> None:
    with Saga(sqlite_settings) as saga:
        run = saga.run(saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]}),
                       run_id="ORDER-42" if how == "name" else None)
        asked = {"id": run.run_id, "name": "ORDER-42", "prefix": run.run_id[:8]}[how]
        app = saga.app
        saga.projection.catch_up()  # a prefix is looked up in it: its own reads are apart
        real = app.get_run
        loads: list[str | UUID] = []

        def counted(run_id: str | UUID, version: int | None = None) -> Run:
            loaded = real(run_id, version)  # a miss raises and is not a load
            loads.append(run_id)
            return loaded

        app.get_run = counted  # type: ignore[method-assign]
        try:
            with events_deserialised(app) as count:
                assert saga.get(asked).run_id == run.run_id
        finally:
            del app.get_run
        assert loads == [run.run_id if how != "name" else "ORDER-42"]
        assert count[0] == run.version  # one fold of its events (no snapshot this short)


def calls_during(load: Callable[[], Run]) -> int:
    """Python and C function calls made while ``load`` runs (``sys.setprofile``)."""
    calls = [0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            calls[0] += 1

    sys.setprofile(profile)
    try:
        load()
    finally:
        sys.setprofile(None)
    return calls[0]


def test_a_replay_without_snapshots_costs_the_same_calls_per_event_on_both_stores(
        tmp_path: Path, pg_settings: Settings) -> None:
    """A run folded from its events alone does the same work per event on either store:
    SQLite's load went through the library's repository, whose projector checks each
    event against a runtime Protocol (about 100 more calls an event, half the time of a
    long replay: the "SQLite replay regression" of issue 44)."""
    per_event = {}
    for name, settings in (("sqlite", Settings(home=tmp_path / ".saga", actor="t")),
                           ("postgres", pg_settings)):
        with Saga(replace(settings, snapshot_interval=0)) as saga:
            run_id = long_run(saga, 1000)
            assert saga.app.get_run(run_id).version == 1000  # warm
            per_event[name] = calls_during(lambda r=run_id, s=saga: s.app.get_run(r)) / 1000  # type: ignore[misc]
    assert per_event["sqlite"] <= 1.25 * per_event["postgres"], per_event
    assert per_event["sqlite"] < 110, per_event  # 73 now; 171 through the projector
