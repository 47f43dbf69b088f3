"""A plain SQL connection beside the event store, for saga's own tables.

The read model and the worker leases live in the same database as the events (the
SQLite file, or the configured PostgreSQL schema) but are written with a connection of
their own, never inside a library transaction. This is the one place the two dialects
differ: statements are written with ``?`` placeholders and upserts that both accept.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from saga.config import Settings
from saga.errors import StoreUnavailableError, first_line

Row = dict[str, Any]
# Concurrent CREATE TABLE IF NOT EXISTS can fail in PostgreSQL ("tuple concurrently
# updated"), so DDL runs under this transaction-scoped advisory lock.
DDL_LOCK = 0x5A6A_0001


class Database:
    """One connection to the store's database, with explicit transactions."""

    def __init__(self, settings: Settings) -> None:
        env = settings.store_env()
        self.pg = settings.is_postgres
        # One connection serves leases (renewed from threads), the cache and DDL: a lock
        # keeps one transaction at a time on it.
        self._lock = threading.RLock()
        try:
            if self.pg:
                self.conn = connect_postgres(env, settings.store_description)
                schema = env.get("POSTGRES_SCHEMA", "public")
                from psycopg import sql

                self.conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            else:
                # isolation_level=None: no implicit transactions; tx() issues BEGIN IMMEDIATE.
                self.conn = sqlite3.connect(env["SQLITE_DBNAME"], timeout=30.0,
                                            isolation_level=None, check_same_thread=False)
        except (sqlite3.Error, OSError) as e:
            raise StoreUnavailableError(
                f"cannot reach the event store ({settings.store_description}): {e}") from e

    def add_columns(self, table: str, columns: dict[str, str]) -> None:
        """Add the columns a table created by an older saga lacks (``name: SQL type``)."""
        if self.pg:
            have = {r["column_name"] for r in self.query(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ? "
                "AND table_schema = current_schema()", (table,))}
        else:
            have = {r["name"] for r in self.query(f"PRAGMA table_info({table})")}
        for name, kind in columns.items():
            if name not in have:
                exists = " IF NOT EXISTS" if self.pg else ""
                with contextlib.suppress(sqlite3.OperationalError):  # a racing process won
                    self.execute(f"ALTER TABLE {table} ADD COLUMN{exists} {name} {kind}")

    def sql(self, text: str) -> str:
        """The statement in this dialect (saga's SQL is written with ``?``)."""
        return text.replace("?", "%s") if self.pg else text

    @contextlib.contextmanager
    def tx(self) -> Iterator[Any]:
        """A cursor in one transaction: committed on success, rolled back on error."""
        with self._lock:
            if self.pg:
                with self.conn.transaction(), self.conn.cursor() as cur:
                    yield cur
                return
            yield from self._sqlite_tx()

    def _sqlite_tx(self) -> Iterator[Any]:
        cur = self.conn.cursor()
        # IMMEDIATE takes the write lock up front, so writers serialise here instead of
        # failing later on a lock upgrade.
        cur.execute("BEGIN IMMEDIATE")
        try:
            yield cur
        except BaseException:
            if self.conn.in_transaction:
                cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")

    def execute(self, text: str, args: Sequence[Any] = (), *, flush: bool = True) -> int:
        """Run one statement in its own transaction; returns the row count.

        ``flush=False`` (PostgreSQL) commits without waiting for the WAL flush
        (``synchronous_commit`` off for that transaction only). Only for rows a crash may
        roll back harmlessly: WAL is flushed in order, so the next ordinary commit of any
        session (a run's next append, before any tool runs) makes it durable too.
        """
        if not self.pg:
            with self.tx() as cur:
                cur.execute(self.sql(text), tuple(args))
                return int(cur.rowcount)
        with self._lock:
            if flush:  # one autocommit statement: atomic, one round trip
                return int(self.conn.execute(self.sql(text), tuple(args)).rowcount)
            with self.conn.pipeline(), self.conn.transaction():
                self.conn.execute("SET LOCAL synchronous_commit TO off")
                cur = self.conn.execute(self.sql(text), tuple(args))
            return int(cur.rowcount)

    def query(self, text: str, args: Sequence[Any] = ()) -> list[Row]:
        """Rows of a read-only statement as dicts."""
        with self._lock:
            cur = self.conn.cursor()
            try:
                cur.execute(self.sql(text), tuple(args))
                names = [d[0] for d in cur.description]
                return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
            finally:
                cur.close()

    def create(self, ddl: Sequence[str]) -> None:
        """Run idempotent DDL, safe when many processes start at once."""
        with self.tx() as cur:
            if self.pg:
                cur.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK,))
            for statement in ddl:
                cur.execute(statement)

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(Exception):
            self.conn.close()


def connect_postgres(env: dict[str, str], where: str) -> Any:
    """An autocommit psycopg connection from ``POSTGRES_*`` keys (transactions are
    explicit), or StoreUnavailableError saying where it could not connect."""
    try:
        import psycopg
    except ImportError as e:
        raise StoreUnavailableError("PostgreSQL needs psycopg: pip install 'saga[postgres]'") from e
    try:
        return psycopg.connect(
            host=env["POSTGRES_HOST"], port=int(env["POSTGRES_PORT"]),
            dbname=env["POSTGRES_DBNAME"], user=env["POSTGRES_USER"],
            password=env.get("POSTGRES_PASSWORD") or None, connect_timeout=5, autocommit=True)
    except psycopg.Error as e:
        raise StoreUnavailableError(
            f"cannot reach the event store ({where}): {first_line(e)}") from e
