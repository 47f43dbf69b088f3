"""A store's DDL: made on its first open, extended for a table an older saga made, and on
PostgreSQL run once per store (its digest in ``saga_schema``), not on every open."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from typing import Any

import psycopg

from saga.api import Saga
from saga.config import Settings
from saga.store.leases import lease_key
from saga.tools import Registry

FLOW = {"name": "one", "steps": [{"id": "a", "tool": "noop"}]}


def _pg(settings: Settings) -> Any:
    """A connection whose search path is the test's schema."""
    assert settings.database_url
    conn = psycopg.connect(settings.database_url, autocommit=True)
    conn.execute(f'SET search_path TO "{settings.schema}"')
    return conn


def _columns(settings: Settings, table: str) -> set[str]:
    if settings.is_postgres:
        with _pg(settings) as conn:
            return {r[0] for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = %s", (settings.schema, table))}
    with sqlite3.connect(settings.home / "saga.db") as conn:
        return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


R0 = lease_key("r0")  # a run's lease is keyed by its store key


def test_a_table_an_older_saga_made_gets_the_columns_it_lacks(
        settings: Settings, registry: Registry) -> None:
    old = ("CREATE TABLE saga_leases (run_id TEXT PRIMARY KEY, worker TEXT NOT NULL, "
           "expires_at DOUBLE PRECISION NOT NULL)")
    if settings.is_postgres:
        with _pg(settings) as conn:
            conn.execute(f'CREATE SCHEMA "{settings.schema}"')
            conn.execute(old)
            conn.execute("INSERT INTO saga_leases VALUES (%s, 'w', 1.0)", (R0,))
    else:
        settings.home.mkdir(parents=True)
        with sqlite3.connect(settings.home / "saga.db") as conn:
            conn.execute(old)
            conn.execute("INSERT INTO saga_leases VALUES (?, 'w', 1.0)", (R0,))
    assert "queue" not in _columns(settings, "saga_leases")
    with Saga(settings, registry=registry) as s:
        assert s.run(s.load(FLOW), {}).status == "completed"
        assert s.leases.holder("r0") == ("w", 1.0)  # the old rows stay
    assert {"run_id", "worker", "expires_at", "queue"} <= _columns(settings, "saga_leases")


def _recorded(settings: Settings) -> set[str]:
    with _pg(settings) as conn:
        return {r[0] for r in conn.execute("SELECT digest FROM saga_schema")}


def test_postgres_runs_a_stores_ddl_once_and_again_when_it_is_not_recorded(
        pg_settings: Settings, registry: Registry) -> None:
    with Saga(pg_settings, registry=registry) as s:
        assert s.run(s.load(FLOW), {}).status == "completed"
        s.leases  # noqa: B018 - the lease tables
        s.cache  # noqa: B018 - the tool cache's table
    first = _recorded(pg_settings)
    assert len(first) >= 3  # the event store's, the leases', the cache's
    # A table dropped behind saga's back stays dropped while its DDL is recorded: a
    # later open runs none of the DDL it finds there ...
    with _pg(pg_settings) as conn:
        conn.execute("DROP TABLE saga_cache")
    with Saga(pg_settings, registry=registry) as s:
        s.cache  # noqa: B018
        assert s.run(s.load(FLOW), {}).status == "completed"
    assert "key" not in _columns(pg_settings, "saga_cache")
    assert _recorded(pg_settings) == first
    # ... and runs all of it again when the record is gone (a store from before it).
    with _pg(pg_settings) as conn:
        conn.execute("DROP TABLE saga_schema")
        conn.execute("DROP TABLE saga_events")
    with Saga(pg_settings, registry=registry) as s:
        s.cache  # noqa: B018
        run = s.run(s.load(FLOW), {})
        assert run.status == "completed"
        assert s.get(run.run_id).status == "completed"
    assert "key" in _columns(pg_settings, "saga_cache")
    assert _recorded(pg_settings) == first


def test_postgres_a_store_opened_with_snapshots_makes_their_table_then(
        pg_settings: Settings, registry: Registry) -> None:
    """The event store's digest covers the library's statements: switching snapshots on
    for a store opened without them creates their table."""
    plain = dataclasses.replace(pg_settings, snapshot_interval=0)
    with Saga(plain, registry=registry) as s:
        assert s.run(s.load(FLOW), {}).status == "completed"
    assert not _columns(pg_settings, "saga_snapshots")
    snapshots = dataclasses.replace(pg_settings, snapshot_interval=2)
    long = {"name": "long", "steps": [
        {"id": f"s{i}", "tool": "noop", "depends_on": [f"s{i - 1}"] if i else []}
        for i in range(4)]}
    with Saga(snapshots, registry=registry) as s:
        run = s.run(s.load(long), {})
        assert s.get(run.run_id).status == "completed"
    assert _columns(pg_settings, "saga_snapshots")
    with _pg(pg_settings) as conn:
        assert conn.execute("SELECT count(*) FROM saga_snapshots").fetchone()[0] > 0


def test_postgres_many_first_opens_at_once_make_the_store_once(
        pg_settings: Settings, registry: Registry) -> None:
    """Sagas opening a new store together (as a fleet of workers starts) all succeed."""
    starts = 4
    errors: list[BaseException] = []
    barrier = threading.Barrier(starts)

    def start() -> None:
        try:
            barrier.wait()
            with Saga(pg_settings, registry=registry) as s:
                s.leases  # noqa: B018
                assert s.run(s.load(FLOW), {}).status == "completed"
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(starts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert len(_recorded(pg_settings)) >= 2


def _backends(settings: Settings) -> int:
    """This test's other connections to the database (by application name)."""
    with _pg(settings) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND pid <> pg_backend_pid() AND "
                           "application_name = %s", (settings.schema,)).fetchone()
        return int(row[0]) if row else 0


def test_postgres_the_connection_that_opens_a_store_serves_its_side_tables(
        pg_settings: Settings, registry: Registry, monkeypatch: Any) -> None:
    """Opening a store sets it up on a connection of its own; the side tables (leases)
    then take that connection instead of opening another, so a one-run ``saga run``
    holds one backend fewer. A spare the server dropped meanwhile is replaced."""
    monkeypatch.setenv("PGAPPNAME", pg_settings.schema or "")
    with Saga(pg_settings, registry=registry) as s:
        spare = s.app._spare
        assert spare is not None
        pid = spare[0].info.backend_pid
        before = _backends(pg_settings)
        assert s.leases.holder("nobody") is None
        assert s._db is not None and s._db.conn.info.backend_pid == pid
        assert _backends(pg_settings) == before  # no new backend for the side tables
        assert s.app.take_connection() is None  # handed on once
    with Saga(pg_settings, registry=registry) as s:
        spare = s.app._spare
        assert spare is not None
        with _pg(pg_settings) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (spare[0].info.backend_pid,))
        assert s.leases.holder("nobody") is None  # a new connection instead
        assert s.run(s.load(FLOW), {}).status == "completed"
