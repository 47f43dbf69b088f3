"""The lock-free PostgreSQL recorder (saga.store.pg_recorder): the library's own recorder
test case, and concurrent writers against a following reader."""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from eventsourcing.persistence import (
    DataError,
    IntegrityError,
    ProgrammingError,
    StoredEvent,
)
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

from saga.api import Saga
from saga.config import load_settings
from saga.errors import ConcurrentWriteError, ConfigError
from saga.store.application import SagaApplication
from saga.store.leases import LEASE_DDL, LeaseClaim, LeaseRelease
from saga.store.pg_recorder import (
    ORDINAL_BITS,
    VALUES_UP_TO,
    NoWaitXidOrderedRecorder,
    XidOrderedRecorder,
)
from saga.tools import Registry
from tests.conftest import PG_URL, postgres_store

try:
    import eventsourcing.cipher  # noqa: F401
except ImportError:  # the library's test module imports its AES cipher (pycryptodome),
    # which no test here uses: a stand-in module lets the recorder tests import without it
    import sys
    import types

    _cipher = types.ModuleType("eventsourcing.cipher")
    _cipher.AESCipher = object  # type: ignore[attr-defined]
    sys.modules["eventsourcing.cipher"] = _cipher
from eventsourcing.tests.persistence import ApplicationRecorderTestCase


def _datastore(schema: str, pool: int = 4, overflow: int = 4) -> PostgresDatastore:
    info = psycopg.conninfo.conninfo_to_dict(PG_URL)
    return PostgresDatastore(dbname=str(info["dbname"]), host=str(info["host"]),
                             port=str(info.get("port", 5432)), user=str(info["user"]),
                             password="", schema=schema, pool_size=pool,
                             max_overflow=overflow)


def _new_schema() -> str:
    schema = f"t_rec_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def _drop(schema: str) -> None:
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _recorder(schema: str, pool: int = 4, *, overflow: int = 4,
              kind: type[XidOrderedRecorder] = XidOrderedRecorder) -> XidOrderedRecorder:
    recorder = kind(_datastore(schema, pool, overflow), events_table_name="saga_events")
    recorder.create_table()
    return recorder


class TestLibraryCase(ApplicationRecorderTestCase[XidOrderedRecorder]):
    """eventsourcing's ApplicationRecorderTestCase, run against this recorder."""

    EXPECT_CONTIGUOUS_NOTIFICATION_IDS = False  # ids follow transaction ids

    def setUp(self) -> None:
        self.schema = _new_schema()
        self.recorders: list[XidOrderedRecorder] = []

    def tearDown(self) -> None:
        for r in self.recorders:
            r.datastore.close()
        _drop(self.schema)

    def create_recorder(self) -> XidOrderedRecorder:
        r = _recorder(self.schema)
        self.recorders.append(r)
        return r

    def test_insert_select(self) -> None:
        """The library's version asserts the ids 1, 2, 3; ids here are xid-ordered, so the
        same checks are made on the ids the inserts returned."""
        recorder = self.create_recorder()
        assert recorder.select_notifications(start=None, limit=3) == []
        assert recorder.max_notification_id() is None
        a, b = uuid4(), uuid4()
        e1 = StoredEvent(a, 1, "topic1", b"state1")
        e2 = StoredEvent(a, 2, "topic2", b"state2")
        e3 = StoredEvent(b, 1, "topic3", b"state3")
        first = recorder.insert_events([e1, e2])
        assert first is not None and len(first) == 2 and first[0] < first[1]
        second = recorder.insert_events([e3])
        assert second is not None and second[0] > first[1]
        n1, n2, n3 = *first, second[0]
        with pytest.raises(IntegrityError):
            recorder.insert_events([e3])
        got = recorder.select_notifications(start=None, limit=10)
        assert [(n.id, n.originator_id, n.topic, n.state) for n in got] == [
            (n1, a, "topic1", b"state1"), (n2, a, "topic2", b"state2"),
            (n3, b, "topic3", b"state3")]
        ids = lambda **kw: [n.id for n in recorder.select_notifications(**kw)]  # noqa: E731
        assert ids(start=n1, limit=10) == [n1, n2, n3]
        assert ids(start=None, stop=n2, limit=10) == [n1, n2]
        assert ids(start=n1, limit=10, inclusive_of_start=False) == [n2, n3]
        assert ids(start=n2, limit=10, inclusive_of_start=False) == [n3]
        assert ids(start=None, limit=10, topics=["topic1", "topic3"]) == [n1, n3]
        assert ids(start=n1, limit=3, topics=["topic2"]) == [n2]
        assert ids(start=n2, limit=1) == [n2]
        assert ids(start=n3, limit=1, inclusive_of_start=False) == []
        assert ids(start=n1, limit=10, stop=n2, inclusive_of_start=False) == [n2]
        assert recorder.max_notification_id() == n3


class TestLibraryCaseNoWait(TestLibraryCase):
    """The same, against the recorder that does not wait for the WAL flush."""

    def create_recorder(self) -> XidOrderedRecorder:
        r = _recorder(self.schema, kind=NoWaitXidOrderedRecorder)
        self.recorders.append(r)
        return r


@pytest.fixture
def schema() -> Iterator[str]:
    s = _new_schema()
    try:
        yield s
    finally:
        _drop(s)


@pytest.mark.parametrize("kind", [XidOrderedRecorder, NoWaitXidOrderedRecorder])
@pytest.mark.parametrize("count", [3, VALUES_UP_TO, VALUES_UP_TO + 1, 40])
def test_ids_follow_the_inserting_transaction(schema: str, count: int,
                                              kind: type[XidOrderedRecorder]) -> None:
    """Both forms of the insert (a row of parameters per event, and arrays past
    VALUES_UP_TO) store the events as given, with ids in their order."""
    recorder = _recorder(schema, kind=kind)
    try:
        run = uuid4()
        events = [StoredEvent(run, v, f"t{v}", f"state {v}".encode())
                  for v in range(1, count + 1)]
        ids = recorder.insert_events(events)
        assert ids is not None
        xid = ids[0] >> ORDINAL_BITS
        assert ids == [(xid << ORDINAL_BITS) + n for n in range(1, count + 1)]
        stored = recorder.select_events(run)
        assert [(e.originator_version, e.topic, e.state) for e in stored] == \
            [(e.originator_version, e.topic, e.state) for e in events]
    finally:
        recorder.datastore.close()


@pytest.mark.parametrize("statement", ["DEALLOCATE ALL", "ROLLBACK"])
def test_a_small_insert_outlives_the_connection_dropping_its_statements(
        schema: str, statement: str) -> None:
    """A step's insert goes through a statement saga prepares on each connection. psycopg
    drops every prepared statement of a connection after a ROLLBACK or a DEALLOCATE ALL
    on it: the next insert on that connection prepares its statement again and stores
    its events once."""
    recorder = _recorder(schema, pool=1, overflow=0)  # one connection
    try:
        run = uuid4()
        first = recorder.insert_events([StoredEvent(run, 1, "t1", b"one")])
        ours = "SELECT count(*) AS n FROM pg_prepared_statements WHERE name LIKE 'saga_insert_%'"
        with recorder.datastore.get_connection() as conn:
            assert conn.execute(ours).fetchone() == {"n": 1}
            if statement == "ROLLBACK":  # psycopg then deallocates all, as it has one
                conn.execute("SELECT 1", prepare=True)
                conn.execute("BEGIN")
            conn.execute(statement)
            conn.execute("SELECT 1")  # psycopg's DEALLOCATE ALL goes before it
            assert conn.execute(ours).fetchone() == {"n": 0}
        second = recorder.insert_events([StoredEvent(run, 2, "t2", b"two"),
                                         StoredEvent(run, 3, "t3", b"three")])
        assert first is not None and second is not None and len(second) == 2
        assert [(e.originator_version, e.state) for e in recorder.select_events(run)] == [
            (1, b"one"), (2, b"two"), (3, b"three")]
        with pytest.raises(IntegrityError):  # a failed statement is the library's error
            recorder.insert_events([StoredEvent(run, 3, "t3", b"again")])
    finally:
        recorder.datastore.close()


def test_reader_waits_for_an_open_lower_transaction(schema: str) -> None:
    """A transaction that got its id first but commits last: the reader must not pass
    its rows while it is open, and must see them once it commits."""
    recorder = _recorder(schema)
    conn = psycopg.connect(PG_URL, autocommit=False)
    try:
        # T1: a lower transaction id, its insert not committed yet.
        conn.execute(f'LOCK TABLE "{schema}".saga_events IN ROW EXCLUSIVE MODE')
        conn.execute(
            f'INSERT INTO "{schema}".saga_events (originator_id, originator_version, topic, '
            f'state, notification_id) VALUES (%s, 1, %s, %s, '
            f'(pg_current_xact_id()::text::bigint << {ORDINAL_BITS}) + 1)',
            (uuid4(), "slow", b"x"))
        # T2: a higher transaction id, committed first.
        later = recorder.insert_events([StoredEvent(uuid4(), 1, "fast", b"y")])
        assert later is not None
        assert recorder.select_notifications(start=None, limit=10) == []
        assert recorder.max_notification_id() is None
        conn.commit()
        seen = recorder.select_notifications(start=None, limit=10)
        assert [n.topic for n in seen] == ["slow", "fast"]
        assert seen[1].id == later[0]
    finally:
        conn.close()
        recorder.datastore.close()


def test_a_transaction_that_only_reads_the_table_holds_no_reader_back(schema: str) -> None:
    """A worker's claim reads the events table (has the run ended?) in a transaction
    that has an id (it writes a lease): it cannot add events, so readers do not wait
    for it, as they still do for one holding a writer's lock (the test above)."""
    recorder = _recorder(schema)
    conn = psycopg.connect(PG_URL, autocommit=False)
    try:
        conn.execute("SELECT pg_current_xact_id()")  # an id, as a lease's write gives
        conn.execute(f'SELECT count(*) FROM "{schema}".saga_events')  # AccessShareLock
        later = recorder.insert_events([StoredEvent(uuid4(), 1, "after", b"y")])
        assert later is not None
        assert [n.topic for n in recorder.select_notifications(start=None, limit=10)] \
            == ["after"]
        conn.execute(f'LOCK TABLE "{schema}".saga_events IN ROW EXCLUSIVE MODE')
        more = recorder.insert_events([StoredEvent(uuid4(), 1, "held", b"z")])
        assert more is not None
        # a writer's lock, from a lower transaction id: readers stop below it, until it ends
        assert recorder.select_notifications(start=None, limit=10) == []
        conn.commit()
        assert [n.topic for n in recorder.select_notifications(start=None, limit=10)] \
            == ["after", "held"]
    finally:
        conn.close()
        recorder.datastore.close()


def test_the_horizon_refuses_a_connection_in_a_transaction(schema: str) -> None:
    """A page is read on the connection its horizon was computed on, in a second
    statement: in a transaction both would share one snapshot, and the read could pass
    over a row whose lower transaction commits after it (see the module docs)."""
    recorder = _recorder(schema)
    conn = psycopg.connect(PG_URL, autocommit=False)
    try:
        with pytest.raises(ProgrammingError, match="autocommit"):
            recorder._horizon_on(conn)
        conn.autocommit = True
        assert recorder._horizon_on(conn) > 0
    finally:
        conn.close()
        recorder.datastore.close()


def test_reader_stops_waiting_for_a_transaction_whose_backend_died(schema: str) -> None:
    """A lower transaction that never commits (its backend terminated, as a crash would
    leave it): readers wait for it while it is open, then pass it, and its row never
    appears."""
    recorder = _recorder(schema)
    conn = psycopg.connect(PG_URL, autocommit=False)
    try:
        conn.execute(
            f'INSERT INTO "{schema}".saga_events (originator_id, originator_version, topic, '
            f'state, notification_id) VALUES (%s, 1, %s, %s, '
            f'(pg_current_xact_id()::text::bigint << {ORDINAL_BITS}) + 1)',
            (uuid4(), "doomed", b"x"))
        pid = conn.info.backend_pid
        later = recorder.insert_events([StoredEvent(uuid4(), 1, "after", b"y")])
        assert later is not None
        assert recorder.select_notifications(start=None, limit=10) == []
        with psycopg.connect(PG_URL, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        seen = recorder.select_notifications(start=None, limit=10)
        assert [(n.id, n.topic) for n in seen] == [(later[0], "after")]
        assert recorder.max_notification_id() == later[0]
    finally:
        conn.close()
        recorder.datastore.close()


@pytest.mark.parametrize("count", [1, VALUES_UP_TO + 1])  # through libpq, and the cursor
def test_an_append_stores_a_leases_text_as_given_and_refuses_a_nul(schema: str,
                                                                    count: int) -> None:
    """Both forms of the insert store a claimed lease's worker and queue as given
    (non-ASCII text in the connection's encoding, the expiry exactly), and refuse a NUL
    in them rather than cutting the text there."""
    recorder = _recorder(schema)
    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            conn.execute(LEASE_DDL[0])
        now = time.time()
        oid = uuid4()
        events = [StoredEvent(oid, v, "t", b"s") for v in range(1, count + 1)]
        recorder.insert_events(events, lease=LeaseClaim(str(oid), "wörker", now + 30.25,
                                                        "qué", now))
        with psycopg.connect(PG_URL) as conn:
            row = conn.execute(f'SELECT worker, queue, expires_at FROM "{schema}".saga_leases'
                               " WHERE run_id = %s", (str(oid),)).fetchone()
        assert row == ("wörker", "qué", now + 30.25)
        other = uuid4()
        with pytest.raises(DataError):
            recorder.insert_events([StoredEvent(other, v, "t", b"s")
                                    for v in range(1, count + 1)],
                                   lease=LeaseClaim(str(other), "me\x00evil", now + 30,
                                                    None, now))
        assert recorder.select_events(other) == []
    finally:
        recorder.datastore.close()


def _writer(schema: str, writes: int, per_write: int, out: Any) -> None:
    """Inserts in the three shapes an append takes: plain, claiming a run's lease first
    (a new run's first append), and giving a run's lease up (the append that ends it)."""
    recorder = _recorder(schema, pool=1)
    written = []
    for i in range(writes):
        oid = uuid4()
        events = [StoredEvent(oid, v, "w", b"s") for v in range(1, per_write + 1)]
        if i % 3 == 1:
            now = time.time()
            ids = recorder.insert_events(events, lease=LeaseClaim(str(oid), "w", now + 30,
                                                                  None, now))
        elif i % 3 == 2:
            ids = recorder.insert_events(events, release=LeaseRelease(str(oid), "w"))
        else:
            ids = recorder.insert_events(events)
        assert ids is not None
        written += ids
    recorder.datastore.close()
    out.put(written)


@pytest.mark.parametrize("procs", [4])
def test_concurrent_writers_and_a_following_reader(schema: str, procs: int) -> None:
    """N processes insert while a reader follows with a position: it sees every
    notification exactly once, in increasing order, and never a lower id after a higher
    (whether an insert also claims or releases a lease in its statement)."""
    _recorder(schema).datastore.close()  # the tables exist before the writers start
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.execute(LEASE_DDL[0])
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    writes, per_write = 150, 3
    workers = [ctx.Process(target=_writer, args=(schema, writes, per_write, out))
               for _ in range(procs)]
    reader = _recorder(schema, pool=1)
    seen: list[int] = []
    position = 0
    stop = threading.Event()

    def follow() -> None:
        nonlocal position
        while True:
            done = stop.is_set()
            page = reader.select_notifications(start=position, limit=50,
                                               inclusive_of_start=False)
            for n in page:
                assert n.id > position, "went backwards"
                seen.append(n.id)
                position = n.id
            if done and not page:
                return

    follower = threading.Thread(target=follow)
    follower.start()
    for w in workers:
        w.start()
    written: list[int] = []
    try:
        deadline = time.monotonic() + 100
        while len(written) < procs * writes * per_write:
            try:
                written += out.get(timeout=1)
            except queue.Empty:
                # a writer that died says so now, not after the suite's timeout
                dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
                assert not dead, f"a writer process failed (exit codes {dead})"
                assert time.monotonic() < deadline, "the writers did not finish"
        for w in workers:
            w.join(timeout=60)
        time.sleep(0.05)
    finally:
        stop.set()
        follower.join(timeout=60)
        reader.datastore.close()
    assert len(written) == procs * writes * per_write
    assert seen == sorted(written), "a notification was missed, repeated or reordered"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        leases = conn.execute(f'SELECT count(*) FROM "{schema}".saga_leases').fetchone()
    assert leases == (procs * len(range(1, writes, 3)),)  # every claim was made


@pytest.mark.parametrize(("chosen", "expected"), [(None, XidOrderedRecorder),
                                                  ("library", PostgresApplicationRecorder)])
def test_the_xid_recorder_is_the_default_and_library_the_way_back(
        tmp_path: Path, chosen: str | None, expected: type) -> None:
    env = {"SAGA_DATABASE_URL": PG_URL, **({"SAGA_PG_RECORDER": chosen} if chosen else {})}
    with postgres_store() as pg:
        settings = load_settings(env=env, cwd=tmp_path, schema=pg.schema)
        app = SagaApplication(settings)
        try:
            assert type(app.recorder) is expected
        finally:
            app.close()
    (tmp_path / "saga.toml").write_text('[database]\nrecorder = "library"\n')
    assert load_settings(env={"SAGA_DATABASE_URL": PG_URL}, cwd=tmp_path).pg_recorder == \
        "library"
    with pytest.raises(ConfigError):
        load_settings(env={"SAGA_DATABASE_URL": PG_URL, "SAGA_PG_RECORDER": "serial"},
                      cwd=tmp_path)


@pytest.mark.parametrize("count", [1, VALUES_UP_TO + 1])  # a row per event; arrays
@pytest.mark.parametrize(("kind", "setting"), [(XidOrderedRecorder, "on"),
                                               (NoWaitXidOrderedRecorder, "off")])
def test_only_the_no_wait_recorder_commits_without_waiting(
        schema: str, kind: type[XidOrderedRecorder], setting: str, count: int) -> None:
    """Its insert sets synchronous_commit off for its own transaction (seen here by
    running the statement inside a transaction of ours), never for the session."""
    recorder = _recorder(schema, kind=kind)
    try:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            with conn.transaction():
                ids = [uuid4() for _ in range(count)]
                params: list[Any] = [ids, [1] * count, ["t"] * count, [b"x"] * count]
                if count <= VALUES_UP_TO:
                    params = [field for event in zip(*params, strict=True) for field in event]
                rows = conn.execute(recorder._insert_statement(count), params).fetchall()
                assert len(rows) == count
                row = conn.execute("SHOW synchronous_commit").fetchone()
                assert row is not None and row[0] == setting
            row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None and row[0] == "on"
    finally:
        recorder.datastore.close()


def test_the_no_wait_recorder_refuses_to_append_after_a_gap(schema: str) -> None:
    """What a crash of the server may leave: a writer holding versions the log lost.
    Its next append, past the gap, fails as a conflict and stores nothing."""
    recorder = _recorder(schema, kind=NoWaitXidOrderedRecorder)
    try:
        a, b = uuid4(), uuid4()
        recorder.insert_events([StoredEvent(a, 1, "t", b"1"), StoredEvent(a, 2, "t", b"2")])
        with pytest.raises(IntegrityError):
            recorder.insert_events([StoredEvent(a, 4, "t", b"4")])
        with pytest.raises(IntegrityError):  # one gap fails the whole insert
            recorder.insert_events([StoredEvent(b, 1, "t", b"1"),
                                    StoredEvent(a, 4, "t", b"4")])
        recorder.insert_events([StoredEvent(a, 3, "t", b"3"), StoredEvent(a, 4, "t", b"4")])
        got = recorder.select_notifications(start=None, limit=10)
        assert [(n.originator_id, n.originator_version) for n in got] == [
            (a, 1), (a, 2), (a, 3), (a, 4)]
    finally:
        recorder.datastore.close()


def test_the_no_wait_mode_runs_and_a_lost_tail_is_a_conflict(tmp_path: Path,
                                                             registry: Registry) -> None:
    """SAGA_PG_COMMIT=no-wait: runs complete; a worker holding events a crash of the
    server lost (deleted here) cannot append after them: a conflict, and the run as the
    log holds it loads and goes on."""
    plan = {"name": "two", "steps": [{"id": "a", "tool": "effect", "args": {"value": 1}},
                                     {"id": "b", "tool": "effect", "args": {"value": 2}}]}
    env = {"SAGA_DATABASE_URL": PG_URL, "SAGA_PG_COMMIT": "no-wait"}
    with postgres_store() as pg:
        settings = load_settings(env=env, cwd=tmp_path, schema=pg.schema, actor="tester")
        with Saga(settings, registry=registry) as saga:
            assert type(saga.app.recorder) is NoWaitXidOrderedRecorder
            assert saga.run(saga.load(plan)).status == "completed"
            held = saga.get(saga.submit(saga.load(plan)).run_id)
            held.pause("tester", "first")
            saga.app.save_run(held)
            held.unpause("tester")
            saga.app.save_run(held)
            with psycopg.connect(PG_URL, autocommit=True) as conn:
                conn.execute(f'DELETE FROM "{pg.schema}".{saga.app.recorder.events_table_name}'
                             " WHERE originator_id = %s AND originator_version = %s",
                             (held.id, held.version))
            held.pause("tester", "after the lost tail")
            with pytest.raises(ConcurrentWriteError):
                saga.app.save_run(held)
            fresh = saga.get(held.run_id)
            assert (fresh.version, fresh.status) == (held.version - 2, "paused")
            fresh.unpause("tester")
            saga.app.save_run(fresh)
            assert saga.resume(held.run_id).status == "completed"
    for bad in ({"SAGA_PG_COMMIT": "later"},
                {"SAGA_PG_COMMIT": "no-wait", "SAGA_PG_RECORDER": "library"}):
        with pytest.raises(ConfigError):
            load_settings(env={"SAGA_DATABASE_URL": PG_URL, **bad}, cwd=tmp_path)


def test_no_wait_readers_return_only_what_is_flushed(schema: str) -> None:
    """Inserts do not wait for the WAL flush, so a read that returns events waits for it
    (after the read, before returning): what a reader acts on survives a crash. An empty
    read waits for nothing."""
    recorder = _recorder(schema, kind=NoWaitXidOrderedRecorder)
    real = recorder.flushed
    flushes: list[tuple[str, str]] = []

    def spy() -> None:
        real()
        with psycopg.connect(PG_URL, autocommit=True) as c:
            row = c.execute("SELECT pg_current_wal_flush_lsn()::text").fetchone()
        assert row is not None
        flushes.append((str(row[0]), written))
    recorder.flushed = spy  # type: ignore[method-assign]
    try:
        written = ""
        assert recorder.select_notifications(start=None, limit=10) == []
        assert recorder.select_log(1, 10) == []  # a worker's index reads the log so
        assert recorder.max_notification_id() is None
        assert flushes == []
        run = uuid4()
        recorder.insert_events([StoredEvent(run, 1, "t", b"x")])
        with psycopg.connect(PG_URL, autocommit=True) as c:
            row = c.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
        assert row is not None
        written = str(row[0])
        assert len(recorder.select_notifications(start=None, limit=10)) == 1
        assert [row[1:] for row in recorder.select_log(1, 10)] == [(str(run), 1, "t", b"x")]
        assert recorder.max_notification_id() is not None
        assert len(flushes) == 3

        def lsn(text: str) -> int:
            high, low = text.split("/")
            return (int(high, 16) << 32) + int(low, 16)
        assert all(lsn(flushed) >= lsn(w) for flushed, w in flushes)
    finally:
        recorder.datastore.close()


@pytest.mark.parametrize("existing", [False, True])
def test_workers_starting_together_all_create_the_tables(existing: bool) -> None:
    """Several processes opening one store at once race in PostgreSQL's catalog ("tuple
    concurrently updated", "already exists"); each must open, not die of it."""
    schema = _new_schema()
    try:
        if existing:
            _recorder(schema).datastore.close()
        recorders = [XidOrderedRecorder(_datastore(schema, 1), events_table_name="saga_events")
                     for _ in range(6)]
        barrier = threading.Barrier(len(recorders))
        errors: list[BaseException] = []

        def create(recorder: XidOrderedRecorder) -> None:
            barrier.wait()
            try:
                recorder.create_table()
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=create, args=(r,)) for r in recorders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert recorders[0].insert_events([StoredEvent(uuid4(), 1, "t", b"s")])
    finally:
        for r in recorders:
            r.datastore.close()
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
