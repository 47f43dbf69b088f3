"""The event-sourced application: the store of runs, and the only caller of ``save()``.

Built on ``eventsourcing.application.Application`` with the SQLite module by default and
the PostgreSQL module when a database URL is configured. Driver errors are turned into
:class:`StoreUnavailableError` where they enter, so users see one clear line; on
PostgreSQL every operation first rides out a lost connection (:mod:`saga.store.reconnect`;
the library's own blind retries are switched off, so that policy is the only one).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

from eventsourcing.application import AggregateNotFoundError, Application, ProcessingEvent
from eventsourcing.persistence import IntegrityError, PersistenceError
from eventsourcing.utils import TopicError

from saga.config import Settings
from saga.domain import TOPIC_PREFIX, Run, iso, run_uuid
from saga.errors import (
    ConcurrentWriteError,
    ConfigError,
    DoctoredSnapshotError,
    RunNotFoundError,
    StoreUnavailableError,
    first_line,
)
from saga.store.encryption import sealing_mapper
from saga.store.leases import LeaseClaim, LeaseRelease, Leases, claim_first_args
from saga.store.reads import load_run
from saga.store.reconnect import Reconnect, connection_lost
from saga.store.side_tables import (
    DDL_LOCK,
    check_place,
    connect_postgres,
    ddl_digest,
    record_ddl,
    recorded_ddl,
)

log = logging.getLogger("saga.store")
_SPARE = threading.Lock()
T = TypeVar("T")
_ENVELOPE = ("originator_id", "originator_version", "timestamp", "originator_topic",
             "prev_hash", "payload_hash", "mac")


@contextlib.contextmanager
def store_errors(where: str) -> Iterator[None]:
    """Turn database driver errors into StoreUnavailableError (integrity errors pass; a
    lost connection is marked ``lost``, for :class:`Reconnect` to try again)."""
    try:
        yield
    except IntegrityError:
        raise
    except (PersistenceError, sqlite3.Error, OSError) as e:
        raise StoreUnavailableError(
            f"cannot reach the event store ({where}): {first_line(e)}",
            lost=connection_lost(e)) from e


#: How many snapshots a run gets each time its length doubles, once it is long (see
#: :func:`snapshot_due`).
SNAPSHOTS_PER_DOUBLING = 16


def make_home(home: Path) -> None:
    """Create saga's home folder (the SQLite store) when it is missing, with a
    ``.gitignore`` of ``*`` in it, as pytest does for ``.pytest_cache``: a ``.saga/``
    made inside a git repository never shows as a change there (a clean-tree check, such
    as the release template's, would fail on saga's own files)."""
    if home.is_dir():
        return
    home.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):  # a read-only place still gets its store
        (home / ".gitignore").write_text("# created by saga\n*\n", encoding="utf-8")


def snapshot_due(version: int, interval: int) -> bool:
    """Whether a run's snapshot is taken at this version.

    Every ``interval`` events for the first ``32 * interval``; from then on the gap
    doubles each time the version does (``interval`` times a power of two, between a
    32nd and a 16th of the version). Each snapshot copies the whole run, so at a fixed
    interval a long run's snapshots cost the square of its length (a 10,000-step run
    would spend minutes on them); growing gaps keep their total proportional to the run,
    and loading folds at most a 16th of the run's events after its last snapshot."""
    if interval <= 0 or version <= 0:
        return False
    gap = interval
    while version >= 2 * gap * SNAPSHOTS_PER_DOUBLING:
        gap *= 2
    return version % gap == 0


class SagaApplication(Application[UUID]):
    """Runs, stored as event-sourced ``Run`` aggregates."""

    name = "saga"
    #: The connection that opened the store and the DDL digests it read, until a side
    #: table's :class:`~saga.store.side_tables.Database` takes it (PostgreSQL only).
    _spare: tuple[Any, set[str]] | None = None

    def __init__(self, settings: Settings, partition: tuple[int, int] | None = None) -> None:
        """Open the store (``partition``: its index and the count of partitions, when it
        is one; see :mod:`saga.store.partitions`)."""
        if settings.partitions:  # one database here: saga.store.partitions spans several
            raise ConfigError(f"this reads one database, and the store has "
                              f"{len(settings.partitions)} partitions: not supported yet")
        self.settings = settings
        # The key signs each event's link; it lives in configuration, never in the store.
        Run.audit_key = settings.audit_key.encode() if settings.audit_key else None
        env = settings.store_env()
        if settings.snapshot_interval > 0:
            # Snapshots keep loading a long run cheap; the library takes them inside save().
            self.snapshotting_intervals = {Run: settings.snapshot_interval}  # type: ignore[misc]
            env["IS_SNAPSHOTTING_ENABLED"] = "y"
        self.reconnect = Reconnect(settings.reconnect_seconds, enabled=settings.is_postgres,
                                   on_lost=self._drop_dead_connections)
        if settings.is_postgres:
            # The library's DDL runs below, once per store (see _Setup), not on each open.
            env["CREATE_TABLE"] = "n"
            with _postgres_setup(settings) as setup, \
                    store_errors(settings.store_description):
                super().__init__(env=env)
                try:
                    setup.create([self.recorder, *([self.snapshots.recorder]
                                                   if self.snapshots else [])])
                    if partition is not None:  # a first open as one may write its place
                        setup.lock()
                    check_place(setup.conn, env.get("POSTGRES_SCHEMA", "public"), partition,
                                settings.store_description)
                except BaseException:
                    self.close()
                    raise
            if partition is None:
                self._spare = (setup.conn, setup.recorded)
            else:  # a partition's side tables are opened by the store over them all
                setup.conn.close()
            _without_blind_retries(self.recorder, getattr(self.snapshots, "recorder", None))
        else:
            make_home(settings.home)
            with store_errors(settings.store_description):
                super().__init__(env=env)

    def construct_mapper(self) -> Any:
        """The library's mapper, sealing payloads at rest with a data key per run when an
        encryption key is configured (:mod:`saga.store.encryption`)."""
        return sealing_mapper(self.settings, self.construct_transcoder())

    def save(self, *objs: Any, **kwargs: Any) -> Any:
        """The library's ``save``, less its protocol checks for a run: ``isinstance``
        against a runtime ``Protocol`` walks the protocol's members, three times a save
        on every step's path. A run is collected as the aggregate it is; anything else
        (events) as the library would."""
        processing_event: ProcessingEvent[Any] = ProcessingEvent()
        for obj in objs:
            if type(obj) is Run:
                processing_event.events.extend(obj.collect_events())
                processing_event.aggregates[obj.id] = obj
            else:
                processing_event.collect_events(obj)
        processing_event.saved_kwargs.update(kwargs)
        recordings = self._record(processing_event)
        self._take_snapshots(processing_event)
        self._notify(recordings)
        self.notify(processing_event.events)
        return recordings

    def _take_snapshots(self, processing_event: Any) -> None:
        """The library's snapshotting, at the versions :func:`snapshot_due` names."""
        for event in processing_event.events:
            aggregate = processing_event.aggregates.get(event.originator_id)
            interval = self.snapshotting_intervals.get(type(aggregate)) \
                if aggregate is not None and self.snapshotting_intervals else None
            if interval is not None and snapshot_due(event.originator_version, interval):
                try:
                    self.take_snapshot(event.originator_id, version=event.originator_version)
                except (DoctoredSnapshotError, TopicError) as e:  # it would build on a
                    # doctored one: this one is built from the events, which stand
                    log.warning("%s; snapshotting run %s from its events", e,
                                event.originator_id)
                    run = self._fold(event.originator_id, event.originator_version)
                    if run is not None and self.snapshots is not None:
                        self.snapshots.put([Run.Snapshot.take(run)])

    def start(self, plan: Any, inputs: dict[str, Any], context: dict[str, Any],
              options: dict[str, Any] | None = None, run_id: str | None = None) -> Run:
        """A new run of a compiled plan (not yet saved: the caller saves it with its first
        decisions)."""
        return Run.begin(definition=plan.record(), definition_hash=plan.digest(),
                         inputs=inputs, context=context, options=options or {}, run_id=run_id)

    def _drop_dead_connections(self) -> None:
        """Check the pool's idle connections now and replace the dead ones: psycopg_pool
        would find them one checkout at a time, waiting 1, 2, 4 s between."""
        pool = getattr(getattr(self.recorder, "datastore", None), "pool", None)
        if pool is not None:
            pool.check()

    def _io(self, where: str, operation: Callable[[], T]) -> T:
        """``operation()`` with driver errors as StoreUnavailableError, tried again while
        the connection is lost (only operations safe to repeat)."""
        def once() -> T:
            with store_errors(where):
                return operation()
        return self.reconnect.call(where, once)

    def get_run(self, run_id: str | UUID, version: int | None = None) -> Run:
        """The run as recorded (at ``version`` if given)."""
        uid = run_uuid(run_id)

        def read() -> Run | None:
            try:
                if version is None:
                    return self._load(uid)
                return self.repository.get(uid, version=version)
            except AggregateNotFoundError:
                return None
            except (DoctoredSnapshotError, TopicError) as e:  # a snapshot is only a cache:
                # never act on one that is doctored or unreadable; rebuild from the events
                log.warning("%s; rebuilding run %s from its events", e, run_id)
                return self._fold(uid, version)
        run = self._io("reading a run", read)
        if run is None:
            raise RunNotFoundError(str(run_id))
        return run

    def get_runs(self, run_ids: Sequence[str]) -> dict[str, Run]:
        """The runs as recorded, by id (a run not found is left out), read in one round
        trip with saga's PostgreSQL recorder: a worker loads the runs one look claimed
        together instead of one statement (and one thread hand-off) each."""
        if not hasattr(self.recorder, "select_runs"):
            runs: dict[str, Run] = {}
            for run_id in run_ids:
                with contextlib.suppress(RunNotFoundError):
                    runs[run_id] = self.get_run(run_id)
            return runs
        by_uid = {run_uuid(run_id): run_id for run_id in run_ids}
        return self._built(by_uid, self._io(
            "reading runs", lambda: self.recorder.select_runs(  # type: ignore[attr-defined]
                list(by_uid), self._snapshot_table())))

    def claim_runs(self, leases: Leases, run_ids: list[str], count: int, worker: str,
                   seconds: float, queues: list[str | None],
                   versions: list[int] | None = None
                   ) -> tuple[list[str], dict[str, float], dict[str, Run] | None]:
        """:meth:`Leases.claim_first` of these runs, and the runs claimed as read (by
        id), in one round trip on PostgreSQL with saga's recorder (a worker's look claims
        and reads its runs together); elsewhere the claim alone, and ``None`` for the
        runs (read them with :meth:`get_runs`)."""
        if not self.claims_with_append() or count <= 0 or not run_ids:
            claimed, held = leases.claim_first(run_ids, count, worker, seconds, queues,
                                               versions=versions)
            return claimed, held, None
        recorder: Any = self.recorder
        taken, held, loaded = self._io("claiming runs", lambda: recorder.claim_runs(
            # at each try: one after an outage counts from then
            claim_first_args(run_ids, count, worker, seconds, queues, versions,
                             leases.clock()),
            versions=versions is not None, snapshots=self._snapshot_table()))
        claimed = [r for r in run_ids if r in taken]
        try:
            return claimed, held, self._built({run_uuid(r): r for r in taken}, loaded)
        except Exception as e:  # the leases are taken: each drive reads its own run
            log.warning("could not read the %d runs claimed together (each drive reads "
                        "its own): %s", len(claimed), e)
            return claimed, held, None

    def _built(self, by_uid: dict[UUID, str],
               loaded: dict[Any, tuple[Any, list[Any]]]) -> dict[str, Run]:
        """The runs read (by the store key, as ``select_runs`` returns them) built, by
        the id their caller knows them by (``by_uid``)."""
        runs = {}
        for uid, (snapshot, events) in loaded.items():
            try:
                run = self._build(snapshot, events)
            except (DoctoredSnapshotError, TopicError):  # read again on its own: rebuilt
                run = self.get_run(by_uid[uid])
            if run is not None:
                runs[by_uid[uid]] = run
        return runs

    def _snapshot_table(self) -> str | None:
        snapshots = self.snapshots
        return None if snapshots is None else \
            snapshots.recorder.events_table_name  # type: ignore[attr-defined]

    def _load(self, uid: UUID) -> Run | None:
        """The run from its latest snapshot and the events after it (see :mod:`.reads`)."""
        return load_run(self, uid)

    def _build(self, snapshot: Any, events: Sequence[Any]) -> Run | None:
        """A run from its latest snapshot (or None) and the stored events after it."""
        run: Run | None = None
        if snapshot is not None:
            assert self.snapshots is not None
            run = self.snapshots.mapper.to_domain_event(snapshot).mutate(None)  # type: ignore[attr-defined]
        for stored in events:
            run = self.events.mapper.to_domain_event(stored).mutate(run)  # type: ignore[attr-defined]
        return run

    def rebuild(self, run_id: str | UUID, version: int | None = None) -> Run:
        """The run folded from its events alone, ignoring any snapshot."""
        run = self._io("reading a run", lambda: self._fold(run_uuid(run_id), version))
        if run is None:
            raise RunNotFoundError(str(run_id))
        return run

    def _fold(self, uid: UUID, version: int | None) -> Run | None:
        run: Run | None = None
        for event in self.repository.event_store.get(uid, lte=version):
            run = event.mutate(run)  # type: ignore[attr-defined]
        return run

    def claims_with_append(self) -> bool:
        """Whether a run's first append can claim its lease in the same statement
        (:class:`saga.store.leases.LeaseClaim`): PostgreSQL with saga's recorder."""
        return bool(getattr(self.recorder, "claims_with_append", False))

    def save_run(self, run: Run, claim: LeaseClaim | None = None,
                 release: LeaseRelease | None = None) -> None:
        """Append the run's pending events atomically; the version fence rejects a writer
        that is behind. ``claim``: the append claims the run's lease too (see
        :meth:`claims_with_append`), or stores nothing and raises LeaseHeldError.
        ``release``: the append gives the run's lease up too (the run ends with it).

        A lost connection is ridden out, and an append whose outcome it left unknown (the
        commit may or may not have happened) is resolved by reading the run's events at
        those versions back: ours there means it committed, another writer's means it
        lost the race (ConcurrentWriteError), none means it is tried again. It is never
        appended blindly a second time."""
        pending = list(run.pending_events)
        if not pending:
            return
        tries = 0
        lease: dict[str, Any] = {}  # passed down to the recorder
        if claim is not None:
            lease["lease"] = claim
        if release is not None:
            lease["release"] = release

        def append() -> None:
            nonlocal tries
            tries += 1
            try:
                if tries == 1:
                    self.save(run, **lease)  # collects the events (and takes due snapshots)
                    return
                stored = self._stored(pending)
                if stored is True:
                    return  # the commit we lost sight of went through
                if stored is False:
                    raise ConcurrentWriteError(run.run_id)
                self.save(*pending, **lease)  # it never landed: append the same again
            except IntegrityError:
                if tries > 1 and self._stored(pending) is True:
                    return
                raise ConcurrentWriteError(run.run_id) from None
        self._io("saving a run", append)

    def _stored(self, pending: Sequence[Any]) -> bool | None:
        """Whether the versions of ``pending`` hold these very events (True), another
        writer's (False), or nothing yet (None)."""
        first, last = pending[0], pending[-1]
        stored: list[Any] = list(self.repository.event_store.get(
            first.originator_id, gt=first.originator_version - 1, lte=last.originator_version))
        if not stored:
            return None
        return [e.link() for e in stored] == [e.link() for e in pending]

    def save_runs(self, runs: list[Run], release: LeaseRelease | None = None
                  ) -> list[Exception | None]:
        """Append the pending events of several runs in one transaction (group commit),
        each still fenced by its version. If the batch fails on a conflict, nothing of it
        was stored: each run is then saved on its own, so one stale run costs only its
        own events. Returns, per run, None or the error its save raised. ``release``
        (one run only): the append gives its lease up too, as :meth:`save_run`'s."""
        if release is not None and len(runs) != 1:
            raise ValueError("a group commit gives up one run's lease, of a batch of one")
        if len(runs) == 1:
            return [self._save_one(runs[0], release)]
        pending = [list(run._pending_events) for run in runs]
        try:
            with store_errors("saving runs"):
                self.save(*runs)
        except IntegrityError:
            for run, events in zip(runs, pending, strict=True):
                run._pending_events = events
            return [self._save_one(run) for run in runs]
        except StoreUnavailableError:
            # The connection went with the commit's outcome: settle each run on its own.
            return [self._settle_lost(run, events)
                    for run, events in zip(runs, pending, strict=True)]
        return [None for _ in runs]

    def _settle_lost(self, run: Run, events: list[Any]) -> Exception | None:
        """A run whose group commit lost its connection, resolved as :meth:`save_run`
        resolves its own: by reading its versions back, never by appending blindly."""
        def resolve() -> None:
            stored = self._stored(events)
            if stored is False:
                raise ConcurrentWriteError(run.run_id)
            if stored is None:
                try:
                    self.save(*events)
                except IntegrityError:
                    if self._stored(events) is not True:
                        raise ConcurrentWriteError(run.run_id) from None
        try:
            self._io("saving a run", resolve)
        except (ConcurrentWriteError, StoreUnavailableError) as e:
            return e
        return None

    def _save_one(self, run: Run, release: LeaseRelease | None = None) -> Exception | None:
        try:
            self.save_run(run, None, release)
        except (ConcurrentWriteError, StoreUnavailableError) as e:
            return e
        return None

    def domain_events(self, run_id: str | UUID) -> list[Any]:
        """Every event of a run, in order, as domain event objects."""
        run = self.get_run(run_id)
        return self._io("reading history", lambda: list(self.repository.event_store.get(run.id)))

    def events_of(self, run_id: str | UUID, *, gt: int | None = None, lte: int | None = None,
                  desc: bool = False, limit: int | None = None) -> list[Any]:
        """A run's events (after version ``gt``, up to ``lte``), without loading the run."""
        return self._io("reading history", lambda: list(self.repository.event_store.get(
            run_uuid(run_id), gt=gt, lte=lte, desc=desc, limit=limit)))

    def history(self, run_id: str | UUID) -> list[dict[str, Any]]:
        """Every event of a run, in order, as plain JSON objects."""
        return [event_json(e) for e in self.domain_events(run_id)]

    def run_ids(self, start: int = 1) -> Iterator[tuple[int, str]]:
        """(position, run id) of every run started at or after a log position, in order."""
        position = start
        while True:
            page = self.notifications(position, 500, topics=[TOPIC_PREFIX + "RunStarted"])
            if not page:
                return
            for n in page:
                yield n.id, str(n.originator_id)
            position = page[-1].id + 1

    def notifications(self, start: int, limit: int, *, stop: int | None = None,
                      topics: Sequence[str] = ()) -> list[Any]:
        """A page of the notification log (every event of every run, in commit order)
        from position ``start`` (inclusive) up to ``stop``."""
        return self._io("reading the log", lambda: list(self.recorder.select_notifications(
            start=start, limit=limit, stop=stop, topics=topics, inclusive_of_start=True)))

    def log_rows(self, start: int, limit: int) -> list[tuple[int, str, int, str, bytes]]:
        """A page of the log as a follower reads it: (position, run id, version, topic,
        state) rows from position ``start`` (inclusive), in commit order."""
        select_log = getattr(self.recorder, "select_log", None)
        if select_log is not None:  # the PostgreSQL recorder's: rows, without objects
            return list(self._io("reading the log", lambda: select_log(start, limit)))
        return [(n.id, str(n.originator_id), n.originator_version, n.topic, n.state)
                for n in self.notifications(start, limit)]

    def head(self) -> int:
        """The position of the last event in the log (0 if it is empty)."""
        return int(self._io("reading the log",
                            lambda: self.recorder.max_notification_id()) or 0)

    def probe(self) -> int:
        """:meth:`head`, tried once (a health check answers at once instead of riding out
        an outage): StoreUnavailableError, in one line, when the store is unreachable."""
        with store_errors("reading the log"):
            return int(self.recorder.max_notification_id() or 0)

    def take_connection(self) -> tuple[Any, set[str]] | None:
        """The connection this store was opened on and the DDL digests its setup read,
        once, for a :class:`~saga.store.side_tables.Database` to adopt: a ``saga run``
        then opens one backend fewer (and reads ``saga_schema`` once). ``None`` once
        taken, and on SQLite."""
        with _SPARE:  # two first users in two threads must not share it
            spare, self._spare = self._spare, None
        return spare

    def close(self) -> None:
        """Release the store's connections."""
        spare = self.take_connection()
        if spare is not None:
            with contextlib.suppress(Exception):
                spare[0].close()
        with contextlib.suppress(Exception):
            super().close()
        self.mapper.close()  # type: ignore[attr-defined]  # the key table's connection


def _without_blind_retries(*recorders: Any) -> None:
    """Switch off the library's own retries of PostgreSQL calls (ten tries each, the
    append included): :class:`Reconnect` is the one policy, and an append after a lost
    commit must be resolved by reading, never repeated blindly."""
    for recorder in recorders:
        if recorder is None:
            continue
        for name in ("insert_events", "select_events", "select_notifications",
                     "max_notification_id"):
            inner = getattr(getattr(type(recorder), name, None), "__wrapped__", None)
            if inner is not None:
                setattr(recorder, name, types.MethodType(inner, recorder))


def event_json(e: Any) -> dict[str, Any]:
    """One event as ``{type, version, timestamp, step_id?, payload}``."""
    payload = {k: v for k, v in e.__dict__.items() if k not in _ENVELOPE}
    out: dict[str, Any] = {"type": type(e).__name__, "version": e.originator_version,
                           "timestamp": iso(e.timestamp)}
    if "step_id" in payload:
        out["step_id"] = payload["step_id"]
    out["payload"] = payload
    out["hash"], out["prev_hash"] = e.link(), e.prev_hash
    return out


class _Setup:
    """The opening of a PostgreSQL store, on a connection of its own: what DDL the store
    has run (``saga_schema``, one query), and the DDL lock, taken only when some must run.

    The lock is a session advisory lock held while the library runs its DDL: concurrent
    ``CREATE TABLE``/``TYPE`` in PostgreSQL fail with "tuple concurrently updated" when
    many workers start at once."""

    def __init__(self, conn: Any, schema: str | None) -> None:
        self.conn = conn
        self.schema = schema
        # The library's tables are in "public" when no schema is configured; saga's
        # record of them is beside them, whatever the connection's search path.
        self.recorded = recorded_ddl(conn, schema or "public")
        self.locked = False

    def lock(self) -> None:
        """Take the DDL lock, and create the configured schema (the library requires it
        to exist)."""
        if self.locked:
            return
        from psycopg import sql

        self.conn.execute("SELECT pg_advisory_lock(%s)", (DDL_LOCK,))
        self.locked = True
        if self.schema:
            self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                sql.Identifier(self.schema)))

    def create(self, recorders: Sequence[Any]) -> None:
        """Run the recorders' DDL unless this store has run the same before."""
        digest = ddl_digest([statement.as_string() for recorder in recorders
                             for statement in recorder.sql_create_statements])
        if digest in self.recorded:
            return
        self.lock()
        for recorder in recorders:
            recorder.create_table()
        record_ddl(self.conn, self.schema or "public", digest)
        self.recorded.add(digest)

    def unlock(self) -> None:
        if self.locked:
            self.conn.execute("SELECT pg_advisory_unlock(%s)", (DDL_LOCK,))


@contextlib.contextmanager
def _postgres_setup(settings: Settings) -> Iterator[_Setup]:
    """A store's :class:`_Setup`: a store opened for the first time is locked (and its
    schema made) before the library opens it. The connection stays open for the store to
    hand on (:meth:`SagaApplication.take_connection`), unless the setup failed."""
    env = settings.store_env()
    conn = connect_postgres(env, settings.store_description)
    try:
        setup = _Setup(conn, env.get("POSTGRES_SCHEMA"))
        try:
            if not setup.recorded:
                setup.lock()
            yield setup
        finally:
            setup.unlock()
    except BaseException:
        conn.close()
        raise


def open_app(settings: Settings) -> SagaApplication:
    """Open the configured store."""
    return SagaApplication(settings)
