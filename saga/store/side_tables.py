"""A plain SQL connection beside the event store, for saga's own tables.

The read model and the worker leases live in the same database as the events (the
SQLite file, or the configured PostgreSQL schema) but are written with a connection of
their own, never inside a library transaction. This is the one place the two dialects
differ: statements are written with ``?`` placeholders and upserts that both accept.
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from saga.config import Settings
from saga.errors import ConfigError, StoreUnavailableError, first_line
from saga.store.reconnect import Reconnect, connection_lost

Row = dict[str, Any]
T = TypeVar("T")
# Concurrent CREATE TABLE IF NOT EXISTS can fail in PostgreSQL ("tuple concurrently
# updated"), so DDL runs under this transaction-scoped advisory lock.
DDL_LOCK = 0x5A6A_0001
#: Ends an UPDATE's or DELETE's WHERE clause: its transaction commits without waiting for
#: the WAL flush (see :meth:`Database.execute`).
_NO_WAIT = " AND set_config('synchronous_commit', 'off', true) IS NOT NULL"
#: The digests of the DDL a PostgreSQL store has run (see :meth:`Database.create`).
SCHEMA_TABLE = "saga_schema"
SCHEMA_DDL = ("CREATE TABLE IF NOT EXISTS {} (digest TEXT PRIMARY KEY, "
              "recorded_at TIMESTAMPTZ NOT NULL DEFAULT now())")
#: PostgreSQL's SQLSTATEs for a table, and a schema, that does not exist.
UNDEFINED_TABLE, INVALID_SCHEMA = "42P01", "3F000"


def ddl_digest(statements: Sequence[str]) -> str:
    """What identifies a set of DDL statements in ``saga_schema``."""
    return hashlib.sha256("\n".join(statements).encode()).hexdigest()[:32]


class Database:
    """One connection to the store's database, with explicit transactions; on
    PostgreSQL it reconnects when the connection is lost (see :mod:`saga.store.reconnect`):
    :meth:`execute`, :meth:`query` and :meth:`create` are retried whole, and
    :meth:`retrying` retries a caller's transaction that is safe to repeat."""

    def __init__(self, settings: Settings,
                 adopt: tuple[Any, set[str]] | None = None) -> None:
        """Connect to the store's database, or ``adopt`` a connection to it and the DDL
        digests it read (:meth:`~saga.store.application.SagaApplication.take_connection`)."""
        self.settings = settings
        self._env = settings.store_env()
        self._where = settings.store_description
        self.pg = settings.is_postgres
        self.reconnect = Reconnect(settings.reconnect_seconds, enabled=self.pg)
        # One connection serves leases (renewed from threads), the cache and DDL: a lock
        # keeps one transaction at a time on it.
        self._lock = threading.RLock()
        self._recorded: set[str] | None = set(adopt[1]) if adopt else None
        self.conn = self._connect(adopt[0] if adopt else None)

    def _connect(self, adopted: Any = None) -> Any:
        try:
            if self.pg:
                from psycopg import sql

                schema = sql.SQL("SET search_path TO {}").format(
                    sql.Identifier(self._env.get("POSTGRES_SCHEMA", "public")))
                if adopted is not None:
                    try:
                        adopted.execute(schema)
                        return adopted
                    except Exception:  # dropped while it waited: a new one will do
                        with contextlib.suppress(Exception):
                            adopted.close()
                conn = connect_postgres(self._env, self._where)
                try:
                    conn.execute(schema)
                except Exception as e:
                    conn.close()
                    raise _unavailable(self._where, e) from e
                return conn
            # isolation_level=None: no implicit transactions; tx() issues BEGIN IMMEDIATE.
            return sqlite3.connect(self._env["SQLITE_DBNAME"], timeout=30.0,
                                   isolation_level=None, check_same_thread=False)
        except (sqlite3.Error, OSError) as e:
            raise StoreUnavailableError(
                f"cannot reach the event store ({self._where}): {e}") from e

    def _live(self) -> Any:
        """The connection, replaced first if the server dropped it."""
        if self.pg and (self.conn.closed or self.conn.broken):
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = self._connect()
        return self.conn

    def retrying(self, where: str, operation: Callable[[], T]) -> T:
        """``operation()`` (whole transactions, safe to repeat), reconnecting and trying
        again while the connection is lost."""
        return self.reconnect.call(where, operation)

    def sql(self, text: str) -> str:
        """The statement in this dialect (saga's SQL is written with ``?``)."""
        return text.replace("?", "%s") if self.pg else text

    @contextlib.contextmanager
    def tx(self) -> Iterator[Any]:
        """A cursor in one transaction: committed on success, rolled back on error (a lost
        connection is a StoreUnavailableError that :meth:`retrying` tries again)."""
        with self._lock:
            if not self.pg:
                yield from self._sqlite_tx()
                return
            with self._lost_as_unavailable():
                conn = self._live()
                with conn.transaction(), conn.cursor() as cur:
                    yield cur

    @contextlib.contextmanager
    def _lost_as_unavailable(self) -> Iterator[None]:
        try:
            yield
        except Exception as e:
            if self.pg and connection_lost(e) and not isinstance(e, StoreUnavailableError):
                raise _unavailable(self._where, e) from e
            raise

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
        """Run one statement in its own transaction (again after a reconnect: saga's
        statements are idempotent); returns the row count.

        ``flush=False`` (PostgreSQL) commits without waiting for the WAL flush
        (``synchronous_commit`` off for that transaction only). Only for rows a crash may
        roll back harmlessly: WAL is flushed in order, so the next ordinary commit of any
        session (a run's next append, before any tool runs) makes it durable too. The
        statement is an UPDATE or DELETE ending in its WHERE clause: the setting is made
        by a term added to that clause, which every row it changes passes through (a
        statement that changes nothing writes nothing, and has nothing to flush). It
        stays one autocommit statement, one round trip: a transaction with ``SET LOCAL``
        takes three times as long as the flushed commit it means to save.
        """
        def once() -> int:
            if not self.pg:
                with self.tx() as cur:
                    cur.execute(self.sql(text), tuple(args))
                    return int(cur.rowcount)
            with self._lock, self._lost_as_unavailable():
                conn = self._live()  # reconnected when the last one was lost
                statement = self.sql(text) if flush else self.sql(text) + _NO_WAIT
                return int(conn.execute(statement, tuple(args)).rowcount)
        return self.retrying("writing a side table", once)

    def query(self, text: str, args: Sequence[Any] | Callable[[], Sequence[Any]] = (), *,
              where: str = "reading a side table") -> list[Row]:
        """Rows of a statement as dicts: a read, or one autocommit statement that writes
        and returns rows (tried again after a reconnect, so it must be idempotent).
        ``args`` may be a function, called for each try (a claim reads the clock then,
        not before an outage it rode out)."""
        def once() -> list[Row]:
            with self._lock, self._lost_as_unavailable():
                cur = self._live().cursor()
                try:
                    cur.execute(self.sql(text), tuple(args() if callable(args) else args))
                    names = [d[0] for d in cur.description]
                    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
                finally:
                    cur.close()
        return self.retrying(where, once)

    def create(self, ddl: Sequence[str], columns: Mapping[str, Mapping[str, str]] | None = None,
               after: Sequence[str] = ()) -> None:
        """Run idempotent DDL, then add the ``columns`` (``{table: {name: SQL type}}``)
        that a table made by an older saga lacks, then the DDL ``after``: in one
        transaction, safe when many processes start at once.

        On PostgreSQL the whole is recorded by its digest in ``saga_schema``: a later
        open that finds its digest there runs none of it (one query, where the DDL takes
        a transaction of statements under a lock, on every start of a command or
        worker). A saga whose DDL differs has another digest, and runs its own."""
        digest = ddl_digest([*ddl, repr(sorted((t, sorted(c.items()))
                                               for t, c in (columns or {}).items())),
                             *after]) if self.pg else None
        if digest is not None and digest in self.recorded():
            return

        def once() -> None:
            with self.tx() as cur:
                if self.pg:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (DDL_LOCK,))
                for statement in ddl:
                    cur.execute(statement)
                for table, wanted in (columns or {}).items():
                    have = self._columns(cur, table)
                    for name, kind in wanted.items():
                        if name not in have:  # (a saga of another version may race)
                            exists = " IF NOT EXISTS" if self.pg else ""
                            cur.execute(f"ALTER TABLE {table} ADD COLUMN{exists} {name} {kind}")
                for statement in after:
                    cur.execute(statement)
                if digest is not None:
                    record_ddl(cur, None, digest)
        self.retrying("creating tables", once)
        if digest is not None:
            self.recorded().add(digest)

    def recorded(self) -> set[str]:
        """The digests of the DDL this PostgreSQL store has run (see :meth:`create`),
        read once per connection; none before its first."""
        if self._recorded is None:
            def once() -> set[str]:
                with self._lock, self._lost_as_unavailable():
                    return recorded_ddl(self._live(), None)
            self._recorded = self.retrying("reading a side table", once)
        return self._recorded

    def _columns(self, cur: Any, table: str) -> set[str]:
        """The names of a table's columns, read inside the creating transaction."""
        if self.pg:
            cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                        "AND attnum > 0 AND NOT attisdropped", (table,))
            return {name for (name,) in cur.fetchall()}
        cur.execute(f"PRAGMA table_info({table})")
        return {row[1] for row in cur.fetchall()}  # (cid, name, type, ...)

    def close(self) -> None:
        """Close the connection."""
        with contextlib.suppress(Exception):
            self.conn.close()


def recorded_ddl(conn: Any, schema: str | None) -> set[str]:
    """The digests in a PostgreSQL store's ``saga_schema`` (``schema``: where, else the
    connection's search path), on an autocommit connection; none when there is no table
    (or no schema) yet."""
    from psycopg import Error, sql

    try:
        return {row[0] for row in conn.execute(
            sql.SQL("SELECT digest FROM {}").format(_schema_table(schema)))}
    except Error as e:
        if e.sqlstate in (UNDEFINED_TABLE, INVALID_SCHEMA):
            return set()
        raise


def record_ddl(cur: Any, schema: str | None, digest: str) -> None:
    """Record in ``saga_schema`` that the DDL ``digest`` names has run (on PostgreSQL,
    with the DDL lock held)."""
    from psycopg import sql

    table = _schema_table(schema)
    cur.execute(sql.SQL(SCHEMA_DDL).format(table))
    cur.execute(sql.SQL("INSERT INTO {} (digest) VALUES (%s) ON CONFLICT (digest) DO NOTHING"
                        ).format(table), (digest,))


def _schema_table(schema: str | None) -> Any:
    """``saga_schema``, in ``schema`` if given (else where the search path finds it)."""
    from psycopg import sql

    return sql.Identifier(*([schema] if schema else []), SCHEMA_TABLE)


def check_place(conn: Any, schema: str, place: tuple[int, int] | None, where: str) -> None:
    """Check a PostgreSQL store's place among partitions (``place``: its index and the
    count; None when it is opened alone), on ``conn`` while the DDL lock is held.

    A partition records its place the first time (``saga_partition``) and is refused
    anywhere else: a run's partition is its id's hash modulo the count, so another count
    or order would look for runs where they are not. A database that holds runs recorded
    without partitions cannot become one, and a partition cannot be opened alone."""
    from psycopg import sql

    table = sql.Identifier(schema, "saga_partition")
    if place is None:
        exists = conn.execute("SELECT to_regclass(%s)", (f'"{schema}".saga_partition',))
        if exists.fetchone()[0] is None:
            return
    else:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id INTEGER PRIMARY KEY CHECK "
                             "(id = 1), partition_index INTEGER NOT NULL, partition_count "
                             "INTEGER NOT NULL)").format(table))
    select = sql.SQL("SELECT partition_index, partition_count FROM {}").format(table)
    row = conn.execute(select).fetchone()
    if place is None:
        if row is not None:
            raise ConfigError(f"{where} is partition {row[0] + 1} of {row[1]}: configure "
                              "every partition ([database] partitions), not one database")
        return
    if row is None:
        events = sql.Identifier(schema, "saga_events")
        if conn.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(events)
                        ).fetchone()[0]:
            raise ConfigError(f"{where} holds runs recorded without partitions: it cannot "
                              "become a partition (its runs would be looked for by their "
                              "id's hash in other partitions)")
        conn.execute(sql.SQL("INSERT INTO {} VALUES (1, %s, %s)").format(table), place)
        row = place
    if tuple(row) != tuple(place):
        raise ConfigError(f"{where} is partition {row[0] + 1} of {row[1]}, but the "
                          f"configuration makes it partition {place[0] + 1} of {place[1]}: "
                          "changing the partitions of a store is not supported (its runs "
                          "would move)")


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
        raise _unavailable(where, e) from e


def _unavailable(where: str, error: BaseException) -> StoreUnavailableError:
    """A driver error as one line; ``lost`` when a new connection may cure it."""
    return StoreUnavailableError(f"cannot reach the event store ({where}): {first_line(error)}",
                                 lost=connection_lost(error))
