"""A PostgreSQL application recorder whose writers do not serialise on a table lock.

The library's recorder takes ``LOCK TABLE … IN EXCLUSIVE MODE`` (and ``NOTIFY``) in every
insert so that notification ids (a ``bigserial``) are committed in id order: otherwise a
reader could pass over an id whose transaction commits later. That lock makes every
writer of the events table wait for every other one.

This recorder keeps the reader's promise (every notification seen exactly once, in an
order it can resume from, never passing over a lower id that appears later) another way:

* **Ids follow transaction ids.** An insert is one autocommit statement; each row's
  notification id is ``xid8 << 20 | n`` where ``xid8`` is the inserting transaction's id
  (``pg_current_xact_id()``) and ``n`` its 1-based position in the insert. Ids are
  increasing in the order of the events of one insert, and in transaction-id order
  between inserts; they are not contiguous.
* **Readers stop below the horizon.** Before it reads, a reader computes the lowest
  transaction id ``H`` that may still insert a row: the lowest id of a transaction that
  was in progress at its snapshot and holds a lock on the events table of a mode that
  writing takes, ``RowExclusiveLock`` or stronger (or, if there is
  none, the snapshot's ``xmax``, which every later transaction's id is at least). Then,
  in a second statement (a newer snapshot), it reads only ids below ``H << 20``.

Why no row is passed over: take a row with id below ``H << 20``, so its transaction T has
an id below ``H`` (assigned before the first snapshot). If T had finished by then, the
row is visible to the second statement (or T aborted and there is no row). Otherwise T
was in progress at the first snapshot; an insert takes the table's ``RowExclusiveLock``
before its statement assigns the transaction id (the insert is the transaction's only
statement; when it also claims or releases a run's lease, in a data-modifying ``WITH``,
every table the statement writes is locked as it is parsed, before any of it runs), so
T held that lock: either it still held it when the horizon query read
``pg_locks`` (then ``H`` would be at most T's id) or it had released it, i.e. finished,
before the second statement began, whose snapshot then sees the row.

Across a restart or a crash of the server the order holds: a transaction in flight when
the server went down is aborted by recovery, so it holds no lock and is in no snapshot
afterwards (readers do not wait for it, and its rows never appear); and recovery resumes
transaction ids above every one whose commit it replayed (with ``synchronous_commit``
on, every acknowledged commit), so ids given after the restart are above every id a
reader could have read before it, and a reader's position stays valid. (With
:class:`NoWaitXidOrderedRecorder` a crash may lose acknowledged inserts and give their
ids again; its readers return only what is flushed, so no reader holds such an id.)

The price: a transaction that keeps a writer's lock on the events table open delays
readers (not writers) until it ends (one that only reads the table, holding
``AccessShareLock``, does not); readers of a quiet table see every committed row. Every
writer of one events table must use this recorder (a library recorder's serial ids are
far below these ids): upgrade all workers of a database together. There is no ``NOTIFY``
(it takes a database-wide lock at commit), so :meth:`subscribe` is not supported: saga's
readers poll :meth:`select_notifications`.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from eventsourcing.persistence import (
    IntegrityError,
    InterfaceError,
    InternalError,
    Notification,
    OperationalError,
    ProgrammingError,
    StoredEvent,
    Subscription,
)
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore
from eventsourcing.utils import retry
from psycopg import errors
from psycopg.rows import tuple_row
from psycopg.sql import SQL, Composed, Identifier, Literal

from saga.errors import LeaseHeldError
from saga.lazy import lazy
from saga.store.leases import (
    LeaseClaim,
    LeaseRelease,
    claim_first_sql,
    claim_sql,
    release_sql,
)
from saga.store.prepared import PreparedStatements, numbered

if TYPE_CHECKING:
    import tenacity
else:
    tenacity = lazy("tenacity")  # only creating the tables needs it

#: Bits of a notification id below the transaction id: events per insert must fit.
ORDINAL_BITS = 20
MAX_EVENTS_PER_INSERT = (1 << ORDINAL_BITS) - 1
#: Inserts of up to this many events pass a row of parameters per event, larger ones arrays.
VALUES_UP_TO = 16
_INT8 = struct.Struct(">q")
_FLOAT8 = struct.Struct(">d")


def _catalog_race(e: BaseException) -> bool:
    """Whether creating the tables failed only because another process was creating the
    same objects at the same moment."""
    return isinstance(e, InternalError | IntegrityError) or (
        isinstance(e, ProgrammingError)
        and isinstance(e.__cause__, errors.DuplicateTable | errors.DuplicateObject))


class XidOrderedRecorder(PostgresApplicationRecorder):
    """An application recorder with transaction-id-ordered notification ids (see the
    module's documentation): inserts need no table lock, one round trip each."""

    #: Whether an insert returns only once its commit is flushed to the WAL.
    wait_for_flush = True

    def __init__(self, datastore: PostgresDatastore, *,
                 events_table_name: str = "stored_events") -> None:
        super().__init__(datastore, events_table_name=events_table_name)
        table = SQL("{0}.{1}").format(Identifier(self.datastore.schema),
                                      Identifier(self.events_table_name))
        self._table = table
        self._leases = SQL("{0}.saga_leases").format(Identifier(self.datastore.schema))
        self._id_type = "uuid" if self.datastore.originator_id_type == "uuid" else "text"
        self._statements: dict[tuple[int, bool, bool], bytes] = {}
        self._run_statements: dict[str | None, bytes] = {}
        self._page_statements: dict[tuple[bool, bool, bool, bool, bool], bytes] = {}
        self._claim_statements: dict[tuple[bool, str | None], bytes] = {}
        #: The small inserts' names and statements as libpq takes them (see _insert_few).
        self._raw_statements: dict[tuple[int, bool, bool], tuple[bytes, bytes]] = {}
        self._prepared = PreparedStatements()
        qualified = ".".join('"' + name.replace('"', '""') + '"'
                             for name in (self.datastore.schema, self.events_table_name))
        # The lowest transaction id that may still add a row (see the module docs):
        # in-progress xids of this snapshot whose backend holds a lock on the table of a
        # mode that writing takes (a reader's, such as a worker's claim checking that
        # its runs have not ended, holds no reader back).
        self._horizon = SQL(
            "WITH s AS (SELECT pg_current_snapshot() AS snap) "
            "SELECT COALESCE(("
            "  SELECT min(x.x) FROM s, pg_snapshot_xip(s.snap) AS x(x) "
            "  WHERE (x.x::text::bigint & 4294967295) IN ("
            "    SELECT t.transactionid::text::bigint FROM pg_locks r JOIN pg_locks t "
            "    ON t.virtualtransaction = r.virtualtransaction "
            "    AND t.locktype = 'transactionid' "
            "    WHERE r.locktype = 'relation' AND r.mode IN ('RowExclusiveLock', "
            "    'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock') "
            "    AND r.database = ("
            "      SELECT oid FROM pg_database WHERE datname = current_database()) "
            "    AND r.relation = {rel}::regclass)"
            "), (SELECT pg_snapshot_xmax(s.snap) FROM s))::text::bigint AS h"
        ).format(rel=Literal(qualified))

    def _insert_statement(self, count: int, claim: bool = False,
                          release: bool = False) -> bytes:
        """The insert of ``count`` events, rendered once per count: a few events (a step's
        save) are one row of parameters each, sent through libpq (see :meth:`_insert_few`);
        a larger batch (a group commit) passes arrays through psycopg's cursor. The events
        go in binary: psycopg adapts a batch's arrays in an eighth of the time text takes
        (128 events: 0.11 ms against 0.80 here), and a state is not escaped. ``claim``:
        the statement first claims a run's lease (as
        :meth:`saga.store.leases.Leases.claim` does), storing the events only if it was
        made; ``release``: it gives a run's lease up (as
        :meth:`saga.store.leases.Leases.release` does)."""
        statement = self._statements.get((count, claim, release))
        if statement is not None:
            return statement
        events: SQL | Composed
        if count <= VALUES_UP_TO:
            row = "(%b::{t}, %b::bigint, %b::text, %b::bytea, {o})"
            events = SQL("(VALUES " + ", ".join(row.format(t=self._id_type, o=n)
                                               for n in range(1, count + 1))
                         + ") AS e(i, v, t, s, o)")
        else:
            events = SQL("unnest(%b::{t}[], %b::bigint[], %b::text[], %b::bytea[]) "
                         "WITH ORDINALITY AS e(i, v, t, s, o)").format(t=SQL(self._id_type))
        new_id = SQL("(pg_current_xact_id()::text::bigint << {bits}) + e.o").format(
            bits=SQL(str(ORDINAL_BITS)))
        if claim and release:
            raise ProgrammingError("one append does not both claim and release a lease")
        if (claim or release) and not self.wait_for_flush:
            raise ProgrammingError("a lease is claimed or released with an append only "
                                   "when the append waits for its flush")
        if self.wait_for_flush:
            # A claim or a release of a run's lease goes first in the same statement, and
            # with a claim the events are stored only if it was made. Still one statement:
            # every table it writes is locked before it assigns its transaction id, so the
            # readers' horizon holds (see the module docs).
            leases = self._leases.as_string(None)
            lease = (f"WITH l AS ({claim_sql(leases, '%s')} RETURNING 1) " if claim else
                     f"WITH l AS ({release_sql(leases, '%s')}) " if release else "")
            query = SQL(
                "{lease}INSERT INTO {table} (originator_id, originator_version, topic, "
                "state, notification_id) SELECT e.i, e.v, e.t, e.s, {new_id} FROM {events} "
                "{only_claimed}ORDER BY e.o RETURNING notification_id").format(
                lease=SQL(lease), table=self._table, new_id=new_id, events=events,
                only_claimed=SQL("WHERE EXISTS (SELECT 1 FROM l) " if claim else ""))
        else:
            # Commit without waiting for the WAL flush (set for this statement's own
            # transaction), and append only after an event that is there: a crash of
            # the server may take the last acknowledged events with it, and a writer
            # still holding them must not append after a gap (the NULL id makes the
            # insert fail as a conflict, and the writer reloads the run).
            query = SQL(
                "WITH c AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', "
                "true)), e AS MATERIALIZED (SELECT * FROM {events}) "
                "INSERT INTO {table} (originator_id, originator_version, topic, state, "
                "notification_id) SELECT e.i, e.v, e.t, e.s, CASE WHEN e.v <= 1 "
                "OR EXISTS (SELECT 1 FROM e AS q WHERE q.i = e.i AND q.v = e.v - 1) "
                "OR EXISTS (SELECT 1 FROM {table} AS p WHERE p.originator_id = e.i "
                "AND p.originator_version = e.v - 1) THEN {new_id} END FROM c, e "
                "ORDER BY e.o RETURNING notification_id").format(
                table=self._table, new_id=new_id, events=events)
        statement = self._statements[count, claim, release] = query.as_bytes(None)
        return statement

    @property
    def claims_with_append(self) -> bool:
        """Whether an append can claim a run's lease in its own statement."""
        return self.wait_for_flush

    def create_table(self) -> None:
        """The library's, tried again when another process creates the same objects at
        the same moment: PostgreSQL's catalog refuses concurrent ``CREATE OR REPLACE
        FUNCTION`` ("tuple concurrently updated") and, for a new table, concurrent
        ``CREATE ... IF NOT EXISTS`` (a duplicate key in ``pg_type``, or "already
        exists" for an index or type), which a fleet of
        workers starting together would otherwise die of. Every statement is idempotent,
        and a failed attempt's transaction left nothing behind."""
        for attempt in tenacity.Retrying(
                retry=tenacity.retry_if_exception(_catalog_race),
                stop=tenacity.stop_after_attempt(8),
                wait=tenacity.wait_random(0.01, 0.2), reraise=True):
            with attempt:
                super().create_table()

    # -- writing ---------------------------------------------------------------------

    def insert_events(self, stored_events: Sequence[StoredEvent], *,
                      lease: LeaseClaim | None = None, release: LeaseRelease | None = None,
                      **kwargs: Any) -> Sequence[int] | None:
        """Insert the events in one autocommit statement (one round trip, atomic); with
        ``lease``, the same statement claims the run's lease first, and stores nothing
        (raising LeaseHeldError) if another worker holds it; with ``release``, it gives
        the run's lease up.

        Never tried again here (the library's recorder is): after a lost connection the
        statement may have committed, and only the caller can tell, by reading back."""
        if not stored_events:
            return []
        if len(stored_events) > MAX_EVENTS_PER_INSERT:
            raise ProgrammingError(f"at most {MAX_EVENTS_PER_INSERT} events per insert")
        count = len(stored_events)
        if count <= VALUES_UP_TO:
            return self._insert_few(stored_events, lease, release)
        params: Sequence[Any] = (
            [e.originator_id for e in stored_events],
            [e.originator_version for e in stored_events],
            [e.topic for e in stored_events], [e.state for e in stored_events])
        statement = self._insert_statement(count, claim=lease is not None,
                                           release=release is not None)
        if lease is not None:
            params = [lease.run_id, lease.worker, lease.expires_at, lease.queue, lease.now,
                      *params]
        elif release is not None:
            params = [release.worker, release.run_id, *params]
        with self.datastore.get_connection() as conn, \
                conn.cursor(row_factory=tuple_row) as curs:
            assert conn.autocommit
            curs.execute(statement, params, prepare=True, binary=True)
            ids = [row[0] for row in curs.fetchall()]
            if lease is not None and not ids:
                raise self._held(curs, lease)
            return ids

    def _insert_few(self, stored_events: Sequence[StoredEvent], lease: LeaseClaim | None,
                    release: LeaseRelease | None) -> list[int]:
        """:meth:`insert_events` of a step's few events (most appends), straight through
        libpq: psycopg's cursor layers (the query's conversion, its dumpers, the
        prepared-statement bookkeeping) cost about as much CPU as the rest of a step's
        append (one 2-event insert: 0.13 ms against 0.09 here). Every field goes in
        binary, text in the connection's encoding (as psycopg sends it)."""
        key = (len(stored_events), lease is not None, release is not None)
        raw = self._raw_statements.get(key)
        if raw is None:
            raw = self._raw_statements[key] = (b"saga_insert_%d_%d_%d" % key,
                                               numbered(self._insert_statement(*key)))
        uuids = self._id_type == "uuid"
        with self.datastore.get_connection() as conn:
            assert conn.autocommit
            code = conn.info.encoding  # as psycopg's dumpers encode text
            params: list[bytes | None] = []
            if lease is not None:  # the server types them text, text, float8, text, float8
                params += [lease.run_id.encode(code), lease.worker.encode(code),
                           _FLOAT8.pack(lease.expires_at),
                           None if lease.queue is None else lease.queue.encode(code),
                           _FLOAT8.pack(lease.now)]
            elif release is not None:
                params += [release.worker.encode(code), release.run_id.encode(code)]
            for e in stored_events:
                run = e.originator_id
                params += [(run if isinstance(run, UUID) else UUID(str(run))).bytes if uuids
                           else str(run).encode(code), _INT8.pack(e.originator_version),
                           e.topic.encode(code), bytes(e.state)]
            result = self._prepared.run(conn, *raw, params, [1] * len(params))
            ids = [_INT8.unpack(result.get_value(row, 0) or b"")[0]
                   for row in range(result.ntuples)]
            if lease is not None and not ids:
                with conn.cursor(row_factory=tuple_row) as curs:
                    raise self._held(curs, lease)
            return ids

    def _held(self, curs: Any, lease: LeaseClaim) -> LeaseHeldError:
        """The error of an append whose claim of ``lease`` another worker's lease
        refused, naming that worker."""
        curs.execute(SQL("SELECT worker FROM {0} WHERE run_id = %s").format(self._leases),
                     (lease.run_id,))
        row = curs.fetchone()
        return LeaseHeldError(lease.run_id, row[0] if row else "unknown")

    # -- reading ---------------------------------------------------------------------

    def select_run(self, originator_id: Any, snapshots: str | None
                   ) -> tuple[StoredEvent | None, list[StoredEvent]]:
        """An aggregate's latest snapshot (from the table ``snapshots`` of this schema,
        None: none kept) and its events after it, in one statement, where the library's
        repository reads them in two (each composed anew)."""
        return self.select_runs([originator_id], snapshots).get(originator_id, (None, []))

    def select_runs(self, originator_ids: Sequence[Any], snapshots: str | None
                    ) -> dict[Any, tuple[StoredEvent | None, list[StoredEvent]]]:
        """:meth:`select_run` of several aggregates in one statement (a worker loads the
        runs one look claimed together); the aggregates with no events are left out."""
        statement = self._run_statements.get(snapshots)
        if statement is None:
            ids = SQL("%(ids)s::{t}[]").format(t=SQL(self._id_type))
            statement = self._run_statements[snapshots] = \
                self._runs_query(snapshots, ids).as_bytes(None)
        with self.datastore.get_connection() as conn, \
                conn.cursor(row_factory=tuple_row) as curs:
            # Rows in binary, as tuples: a third of the CPU of text dictionaries for a
            # page of a few dozen events (no bytea to unescape, no dict per row).
            curs.execute(statement, {"ids": list(originator_ids)}, prepare=True, binary=True)
            return _runs_of(curs.fetchall())

    def _runs_query(self, snapshots: str | None, ids: SQL | Composed) -> Composed:
        """The select of :meth:`select_runs` (snapshot flag, originator id, version,
        topic, state; each run's snapshot first, then its events in order) of the runs
        whose ids ``ids`` (an array) names."""
        if snapshots is None:
            return SQL("SELECT false AS snap, originator_id, originator_version, topic, "
                       "state FROM {events} WHERE originator_id = ANY({ids}) "
                       "ORDER BY originator_id, originator_version").format(
                events=self._table, ids=ids)
        # Each aggregate's latest snapshot by its index, newest first (LIMIT 1): a long
        # run keeps many, and only one of their states is read. Then, per aggregate, its
        # events after that version by the same index (a range scan from the snapshot's
        # version): the rows read are the rows returned, however long the run. (Joining
        # the events to the snapshots and filtering by version after the join read every
        # event of the run and threw away all but the last few: issue 44.)
        return SQL(
            "WITH s AS MATERIALIZED (SELECT a.id, l.originator_id, l.originator_version, "
            "l.topic, l.state FROM (SELECT DISTINCT unnest({ids}) AS id) AS a "
            "LEFT JOIN LATERAL (SELECT originator_id, originator_version, topic, state "
            "FROM {snapshots} WHERE originator_id = a.id "
            "ORDER BY originator_version DESC LIMIT 1) AS l ON true) "
            "SELECT true AS snap, originator_id, originator_version, topic, state "
            "FROM s WHERE s.originator_id IS NOT NULL UNION ALL SELECT false, "
            "e.originator_id, e.originator_version, e.topic, e.state FROM s "
            "CROSS JOIN LATERAL (SELECT originator_id, originator_version, topic, state "
            "FROM {events} WHERE originator_id = s.id "
            "AND originator_version > COALESCE(s.originator_version, 0)) AS e "
            "ORDER BY originator_id, snap DESC, originator_version").format(
            snapshots=SQL("{0}.{1}").format(Identifier(self.datastore.schema),
                                            Identifier(snapshots)),
            events=self._table, ids=ids)

    def claim_runs(self, args: Sequence[Any], *, versions: bool, snapshots: str | None
                   ) -> tuple[set[str], dict[str, float],
                              dict[Any, tuple[StoredEvent | None, list[StoredEvent]]]]:
        """:meth:`saga.store.leases.Leases.claim_first` (``args``: its
        :func:`~saga.store.leases.claim_first_args`) and :meth:`select_runs` of the runs
        it claims, in one statement: the runs claimed, the expiry of each lease another
        worker holds among those offered, and the runs claimed as read. A worker's look
        claims and reads its runs in one round trip instead of two.

        The runs are read, and checked for an end past ``versions``, in the snapshot the
        statement starts with. A claim that waits for a lease row (a worker whose lease
        had expired is giving it up with its run's last events) takes the lease once
        that commits, and reads the run as it was before: its drive then decides on a
        stale copy, and its first append, before any tool is called, is refused by the
        version (the drive backs off and gives the lease up)."""
        statement = self._claim_statements.get((versions, snapshots))
        if statement is None:
            claimed = SQL("ARRAY(SELECT t.run_id::{t} FROM t)").format(t=SQL(self._id_type))
            null = SQL("NULL::{t}").format(t=SQL(self._id_type))
            statement = self._claim_statements[versions, snapshots] = SQL(
                claim_first_sql(versions=versions, leases=self._leases.as_string(None),
                                events=self._table.as_string(None), run_type=self._id_type,
                                mark="%s", array_mark="%b") +
                "SELECT t.run_id, NULL::float8, NULL::bool, {null}, NULL::bigint, "
                "NULL::text, NULL::bytea FROM t UNION ALL SELECT h.run_id, h.expires_at, "
                "NULL, NULL, NULL, NULL, NULL FROM h UNION ALL SELECT NULL, NULL, r.* "
                "FROM ({runs}) AS r").format(
                null=null, runs=self._runs_query(snapshots, claimed)).as_bytes(None)
        with self.datastore.get_connection() as conn, \
                conn.cursor(row_factory=tuple_row) as curs:
            assert conn.autocommit  # the claim is committed with the statement
            curs.execute(statement, args, prepare=True, binary=True)
            rows = curs.fetchall()
        taken: set[str] = set()
        held: dict[str, float] = {}
        for row in rows:
            if row[3] is None:  # a lease's row, not an event's
                if row[1] is None:
                    taken.add(row[0])
                else:
                    held[row[0]] = float(row[1])
        return taken, held, _runs_of(_in_run_order(row[2:] for row in rows
                                                   if row[3] is not None))

    def horizon(self) -> int:
        """The first notification id a reader may not pass yet (see the module docs)."""
        with self.datastore.get_connection() as conn:
            return self._horizon_on(conn)

    def _horizon_on(self, conn: Any) -> int:
        """:meth:`horizon` on a connection in autocommit (its own statement, so its own
        snapshot: a read after it on the same connection takes a newer one)."""
        if not conn.autocommit:  # else the read after it would share its snapshot
            raise ProgrammingError("the horizon needs a connection in autocommit")
        with conn.cursor(row_factory=tuple_row) as curs:
            curs.execute(self._horizon, prepare=True, binary=True)
            row = curs.fetchone()
            assert row is not None
            return int(row[0]) << ORDINAL_BITS

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *,
                             inclusive_of_start: bool = True) -> Sequence[Notification]:
        """Notifications from ``start`` (to ``stop``), below the horizon, in id order."""
        return [Notification(id=n, originator_id=i, originator_version=v, topic=t,
                             state=bytes(s))
                for n, i, v, t, s in self._page(start, limit, stop, topics,
                                                inclusive_of_start, follow=False)]

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def select_log(self, start: int, limit: int) -> list[tuple[int, str, int, str, bytes]]:
        """What a follower of the log reads of its notifications from ``start``, below
        the horizon, in id order: (id, originator id as text, originator version, topic,
        state) rows. A worker's index reads every event of every run: rows, with the
        id cast to text by the server, cost half the notifications' objects."""
        return self._page(start, limit, None, (), True, follow=True)

    def _page(self, start: int | None, limit: int, stop: int | None, topics: Sequence[str],
              inclusive_of_start: bool, *, follow: bool) -> list[Any]:
        shape = (start is not None, inclusive_of_start, stop is not None, bool(topics),
                 follow)
        statement = self._page_statements.get(shape)
        if statement is None:
            where: list[Composed | SQL] = [SQL("notification_id < %s")]
            if start is not None:
                where.append(SQL("notification_id >= %s" if inclusive_of_start
                                 else "notification_id > %s"))
            if stop is not None:
                where.append(SQL("notification_id <= %s"))
            if topics:
                where.append(SQL("topic = ANY(%s)"))
            run_id = "originator_id::text" if follow else "originator_id"
            columns = f"notification_id, {run_id}, originator_version, topic, state"
            statement = self._page_statements[shape] = SQL(
                "SELECT {columns} FROM {table} WHERE {where} ORDER BY notification_id "
                "LIMIT %s").format(columns=SQL(columns), table=self._table,
                                    where=SQL(" AND ").join(where)).as_bytes(None)
        params: list[Any] = []
        if start is not None:
            params.append(start)
        if stop is not None:
            params.append(stop)
        if topics:
            params.append(list(topics))
        with self.datastore.get_connection() as conn, \
                conn.cursor(row_factory=tuple_row) as curs:
            # The horizon first, in its own statement, before the read's snapshot; one
            # connection for both (a refresh of a worker's index is these two statements).
            params = [self._horizon_on(conn), *params, limit]
            curs.execute(statement, params, prepare=True, binary=True)  # as in select_runs
            page = curs.fetchall()
        if page:
            self.flushed()
        return page

    def flushed(self) -> None:
        """Return once every commit visible now is flushed to the WAL: nothing to do
        when inserts wait for their own flush (see :class:`NoWaitXidOrderedRecorder`)."""

    @retry((InterfaceError, OperationalError), max_attempts=10, wait=0.2)
    def max_notification_id(self) -> int | None:
        """The highest notification id a reader can read now (below the horizon)."""
        below = self.horizon()
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(SQL("SELECT MAX(notification_id) AS m FROM {table} "
                             "WHERE notification_id < %s").format(table=self._table),
                         (below,), prepare=True)
            row = curs.fetchone()
        if row is None or row["m"] is None:
            return None
        self.flushed()
        return int(row["m"])

    def count_notifications(self, after: int, upto: int) -> int:
        """How many notifications have ids in ``(after, upto]`` (ids are not contiguous)."""
        with self.datastore.get_connection() as conn, conn.cursor() as curs:
            curs.execute(SQL("SELECT count(*) AS n FROM {table} WHERE notification_id > %s "
                             "AND notification_id <= %s").format(table=self._table),
                         (after, upto), prepare=True)
            row = curs.fetchone()
            return 0 if row is None else int(row["n"])

    def subscribe(self, gt: int | None = None,
                  topics: Sequence[str] = ()) -> Subscription[Any]:
        """Not supported: inserts send no ``NOTIFY``; poll select_notifications."""
        raise NotImplementedError("XidOrderedRecorder sends no NOTIFY: poll "
                                  "select_notifications() instead of subscribing")


def _in_run_order(rows: Iterable[Any]) -> list[Any]:
    """Rows of runs' snapshots and events in the order of
    :meth:`XidOrderedRecorder.select_runs` (a union keeps no order): by run, each run's
    snapshot first, then its events by version."""
    return sorted(rows, key=lambda r: (r[1], not r[0], r[2]))


def _runs_of(rows: Sequence[Any]) -> dict[Any, tuple[StoredEvent | None, list[StoredEvent]]]:
    """Runs by originator id, as :meth:`XidOrderedRecorder.select_runs` returns them,
    from its rows (each run's snapshot, if any, then its events in order)."""
    found: dict[Any, tuple[StoredEvent | None, list[StoredEvent]]] = {}
    for snap, originator_id, version, topic, state in rows:
        stored = StoredEvent(originator_id=originator_id, originator_version=version,
                             topic=topic, state=bytes(state))
        events = found.setdefault(originator_id, (None, []))[1]
        if snap:
            found[originator_id] = (stored, events)
        else:
            events.append(stored)
    return found


class NoWaitXidOrderedRecorder(XidOrderedRecorder):
    """The same recorder, but an insert does not wait for its commit's WAL flush
    (``synchronous_commit`` off for the insert's transaction only): a crash of the
    database server may lose the last acknowledged inserts (up to about three times
    ``wal_writer_delay``); a crash of the writer loses nothing. An insert whose events
    (past an aggregate's first, version 0 or 1) do not follow an event already stored
    (or one of the same insert) fails with an integrity error, so a writer cannot
    append after a lost tail. Readers of notifications wait for the flush instead
    (:meth:`flushed`), so what they read survives a crash."""

    wait_for_flush = False

    def flushed(self) -> None:
        """Commit a transaction of our own that waits for its flush: the WAL is flushed
        in order, so every commit that was visible before it is durable after it. A
        reader calls this after it read and before it returns, so no reader (the
        projection, a worker's run index) acts on an event a crash could take back,
        nor holds a position among ids a recovered server could give again; one
        flush per read pays for every insert it read."""
        with self.datastore.get_connection() as conn:
            assert conn.autocommit  # one statement, its own transaction, one round trip
            # A commit waits for its flush only if its transaction wrote WAL (an xid
            # alone does not): a transactional logical message is the smallest write
            # (logical decoding sees it, prefix "saga.flush"; nothing else does).
            conn.execute("SELECT set_config('synchronous_commit', 'on', true), "
                         "pg_logical_emit_message(true, 'saga.flush', '')", prepare=True)
