"""Liveness: a worker's leases end with its process, not only when they expire.

A lease is the fence (see :mod:`saga.store.leases`), but waiting for a dead worker's
lease to expire stalls its runs for the lease's length (30 s by default). So each worker
also holds something that dies with its process, and registers it in ``saga_workers``:

- on PostgreSQL, a session-level advisory lock (class :data:`LIVE_LOCK`, key: a hash of
  the schema and the worker id) held by a connection of the worker's own, never a pooled
  one. The server releases it the moment that backend's socket closes (a kill, an OOM, a
  crash); TCP keepalives, on both ends, close it within seconds of a partition;
- on SQLite (one host), an exclusive ``flock`` on ``<home>/workers/<id>.lock``, which
  the kernel releases when the process dies.

A claim may then take a run whose lease is unexpired when its holder registered and its
lock is no longer held (:func:`dead_sql`, part of every claim's condition): such a
takeover is an interruption like one after expiry (``RunTakenOver`` records the dead
holder and its lease). A holder that never registered (a ``saga run`` driving in the
foreground) keeps its lease until it expires, as before.

A worker finds such runs by a sweep (:meth:`Liveness.sweep`, at most every
:data:`SWEEP_EVERY` seconds, on its look for work): one query on its own connection that
lists the leases whose holders are dead. PostgreSQL cannot notify anyone that a backend's
lock dropped, and a sweep on the connection that holds the worker's own lock doubles as
the check that the lock is still held: if that connection is lost, the worker's leases
stop counting as held (:meth:`Liveness.alive`) until it has the lock again, so its drives
start nothing more (a lapsed lease starts nothing), and the worker claims nothing.

The lock is taken again by the next sweep, or by a drive's renewal once the loss is
:data:`SWEEP_EVERY` old (:meth:`Liveness.revive`); a renewal then finds its lease still
its own unless another worker took the run meanwhile. A server restart drops every lock
at once: the worker is not dead, and its runs go on (a drive that found the loss before
the lock was back gives its run up, and takes it up again, at most once a loss).

A worker restarted with the same id takes its lock once the old process's is gone (it
waits up to a lease's length for that, then refuses: two live processes with one id
would drive the same runs), and takes its own runs back at once, their leases recorded
as taken from the worker that died (``prev_worker``: itself).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from saga.errors import ConfigError, StoreUnavailableError, first_line
from saga.store.side_tables import Database

log = logging.getLogger("saga.store")

#: The advisory lock class of workers' liveness in PostgreSQL (queue claims use 0x5A6A).
LIVE_LOCK = 0x5A6B
#: A worker sweeps for runs whose holders died at most this often (seconds).
SWEEP_EVERY = 0.25
#: libpq's keepalives on the worker's own connection: a server gone silent is noticed in
#: about idle + interval x count seconds (the worker's leases stop counting then).
KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2,
              "keepalives_count": 3}
#: The server's side of them (session settings): a worker gone silent (a partition) loses
#: its lock, and so its runs, within about 5 + 2 x 3 seconds instead of hours.
_SERVER_KEEPALIVES = ("SET tcp_keepalives_idle = 5", "SET tcp_keepalives_interval = 2",
                      "SET tcp_keepalives_count = 3")
WORKERS_DDL = ("""CREATE TABLE IF NOT EXISTS saga_workers (
    worker TEXT PRIMARY KEY, lock_key BIGINT NOT NULL, host TEXT, pid INTEGER,
    started_at DOUBLE PRECISION NOT NULL)""",)


def lock_key(place: str, worker: str) -> int:
    """A worker's liveness lock key: a stable 31-bit hash of where it works (the schema)
    and its id. Two ids that collide only make a dead one look alive: its leases then
    expire as before."""
    digest = hashlib.sha256(f"{place}\0{worker}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def dead_sql(holder: str, pg: bool, workers: str = "saga_workers") -> str:
    """SQL that is true when the lease holder ``holder`` (a column) registered its
    liveness in ``workers`` and its lock is no longer held: its process is gone."""
    alive = _held_sql("w.lock_key") if pg else "saga_alive(w.worker)"  # register_sqlite
    return f"EXISTS (SELECT 1 FROM {workers} AS w WHERE w.worker = {holder} AND NOT {alive})"


def _held_sql(key: str) -> str:
    """SQL that is true when the liveness lock ``key`` (a column or expression) is held
    on this PostgreSQL database. Uncorrelated, so read once per statement and hashed,
    however many rows it is asked about (pg_locks lists the whole server's locks)."""
    return (f"{key} IN (SELECT k.objid::int8 FROM pg_locks AS k WHERE "
            f"k.locktype = 'advisory' AND k.classid = {LIVE_LOCK} AND k.objsubid = 2 "
            "AND k.granted AND k.database = "
            "(SELECT oid FROM pg_database WHERE datname = current_database()))")


def dead_holder_sql(table: str, key: str, holder: str, pg: bool) -> str:
    """SQL that is true when a row of ``table`` held by a worker is held by a dead one:
    the worker's lock key kept on the row when it took it (column ``key``) names a lock
    no longer held, or (:func:`dead_sql`) its registration says so. The key on the row
    outlives the registration, which another worker's clean stop forgets when the dead
    worker holds no run's lease (its run taken over), while the row's claim stands."""
    alive = _held_sql(f"{table}.{key}") if pg else f"saga_alive({table}.{holder})"
    return (f"(({table}.{key} IS NOT NULL AND NOT {alive}) "
            f"OR {dead_sql(f'{table}.{holder}', pg)})")


def beside(table: str, name: str) -> str:
    """The table ``name`` in the schema of ``table`` (written as a claim's SQL names it:
    ``saga_leases`` or ``"schema"."saga_leases"``)."""
    head, found, tail = table.rpartition("saga_leases")
    return head + name + tail if found else name


def lock_folder(db: Database) -> Path:
    """Where a SQLite store's workers keep their lock files."""
    return db.settings.home / "workers"


def lock_path(folder: Path, worker: str) -> Path:
    """A worker's lock file (its id quoted: ids hold ``:`` and may hold ``/``)."""
    return folder / (urllib.parse.quote(worker, safe="") + ".lock")


def file_locked(path: Path) -> bool:
    """Whether a live process holds the lock on ``path`` (a shared lock of our own
    cannot be had while it does; one had is dropped at once)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def register_sqlite(conn: Any, folder: Path) -> None:
    """Give a SQLite connection ``saga_alive(worker)``, which :func:`dead_sql` calls."""
    conn.create_function("saga_alive", 1,
                         lambda worker: int(file_locked(lock_path(folder, str(worker)))))


class Liveness:
    """One worker's liveness: its lock, its row in ``saga_workers``, and its sweeps."""

    def __init__(self, db: Database, worker: str, bindings: dict[str, Any] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``bindings``: where this process's leases look up their worker's liveness
        (:attr:`saga.store.leases.Leases.bindings`): entered while it is started."""
        self.db = db
        self.worker = worker
        self.bindings = bindings if bindings is not None else {}
        self.clock = clock
        self.pg = db.pg
        env = db.settings.store_env()
        self._env = env
        self.key = lock_key(env.get("POSTGRES_SCHEMA", "public") if self.pg else
                            str(lock_folder(db)), worker)
        self._conn: Any = None  # PostgreSQL: the connection that holds the lock
        self._locked = False  # ... once it has taken it
        self._fd: int | None = None  # SQLite: the open lock file
        self._swept = float("-inf")  # when the last sweep ran (monotonic)
        self._tried = float("-inf")  # when the lock was last found lost or tried (monotonic)
        # A look's sweep and the drives' renewals (threads) may each find the lock lost
        # and take it again: one at a time, on one connection.
        self._guard = threading.RLock()
        self._dead_sql = ("SELECT run_id FROM saga_leases AS l WHERE l.worker <> {mark} AND "
                          + dead_sql("l.worker", self.pg))

    @property
    def alive(self) -> bool:
        """Whether this worker holds its lock (so its leases still count)."""
        return self._fd is not None or (self._locked and self._usable())

    @property
    def lost(self) -> bool:
        """Whether this worker, started, has lost its lock (and not taken it again)."""
        return self.bindings.get(self.worker) is self and not self.alive

    def _usable(self) -> bool:
        return self._conn is not None and not self._conn.closed and not self._conn.broken

    def start(self, wait: float) -> None:
        """Take the lock, waiting up to ``wait`` seconds for a process that had this id
        to be gone, register, and take this id's leases over from that process."""
        deadline = time.monotonic() + wait
        while not self._lock():
            if time.monotonic() >= deadline:
                raise ConfigError(f"worker id {self.worker!r} is in use by a live process "
                                  "on this store: give each worker its own --id")
            time.sleep(0.1)
        self._register()
        # Leases this id holds now are a dead process's: a takeover of those runs records
        # it as their previous holder (see Leases.previous), as another worker's would.
        self.db.execute("UPDATE saga_leases SET prev_worker = worker, "
                        "prev_expires = expires_at WHERE worker = ?", (self.worker,))
        self.bindings[self.worker] = self

    def _register(self) -> None:
        """This worker's row in ``saga_workers`` (again after a lost lock: a stopping
        worker may have forgotten it meanwhile, as a dead one holding no lease)."""
        self.db.execute("INSERT INTO saga_workers (worker, lock_key, host, pid, started_at) "
                        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (worker) DO UPDATE SET "
                        "lock_key = excluded.lock_key, host = excluded.host, "
                        "pid = excluded.pid, started_at = excluded.started_at",
                        (self.worker, self.key, socket.gethostname(), os.getpid(),
                         self.clock()))

    def _lock(self) -> bool:
        """Try once to take the lock; whether it is held now."""
        return self._lock_pg() if self.pg else self._lock_file()

    def _lock_file(self) -> bool:
        folder = lock_folder(self.db)
        folder.mkdir(parents=True, exist_ok=True)
        path = lock_path(folder, self.worker)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by tools
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # The file is still the one at the path (not one unlinked meanwhile).
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.worker}\n{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def _lock_pg(self) -> bool:
        if not self._usable():
            self._conn = self._connect()
        try:
            got = self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                                     (LIVE_LOCK, self.key)).fetchone()[0]
        except Exception as e:
            self._drop()
            raise StoreUnavailableError(f"cannot reach the event store "
                                        f"({self.db.settings.store_description}): "
                                        f"{first_line(e)}") from e
        self._locked = bool(got)
        return self._locked

    def _connect(self) -> Any:
        """A connection of the worker's own, with keepalives both ways."""
        import psycopg
        from psycopg import sql

        env = self._env
        try:
            conn = psycopg.connect(
                host=env["POSTGRES_HOST"], port=int(env["POSTGRES_PORT"]),
                dbname=env["POSTGRES_DBNAME"], user=env["POSTGRES_USER"],
                password=env.get("POSTGRES_PASSWORD") or None, connect_timeout=5,
                autocommit=True, application_name=f"saga worker {self.worker}"[:63],
                **KEEPALIVES)
            conn.execute(sql.SQL("SET search_path TO {}").format(
                sql.Identifier(env.get("POSTGRES_SCHEMA", "public"))))
            for setting in _SERVER_KEEPALIVES:
                conn.execute(setting)
        except psycopg.Error as e:
            raise StoreUnavailableError(f"cannot reach the event store "
                                        f"({self.db.settings.store_description}): "
                                        f"{first_line(e)}") from e
        return conn

    def _drop(self) -> None:
        self._locked = False
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()

    def sweep(self) -> list[str]:
        """The runs (store keys) whose leases other workers held when they died, at most
        every SWEEP_EVERY seconds (none in between). On PostgreSQL the sweep runs on the
        connection that holds this worker's lock: one found lost is made again, and the
        lock taken again, before anything else (until then :attr:`alive` is false)."""
        now = time.monotonic()
        if now - self._swept < SWEEP_EVERY:
            return []
        self._swept = now
        if self.pg:
            return self._sweep_pg()
        return [row["run_id"] for row in self.db.query(self._dead_sql.format(mark="?"),
                                                       (self.worker,))]

    def revive(self, *, now: bool = False) -> bool:
        """Whether this worker holds its lock, taking it again first if it was lost (and,
        unless ``now``, found lost or last tried at least SWEEP_EVERY ago: others had a
        moment to see it gone). Taking it again registers again (a stopping worker may
        have forgotten this one meanwhile). Only the lock is retaken: each lease is still
        this worker's only if nobody took it meanwhile, which its renewal checks."""
        if self.alive:
            return True
        if not self.pg:
            return False  # a lock file is held until the process dies
        with self._guard:
            if self.alive:  # another thread took it meanwhile
                return True
            if not now and time.monotonic() - self._tried < SWEEP_EVERY:
                return False
            self._tried = time.monotonic()
            try:
                if not self._lock():
                    return False
                self._register()
            except StoreUnavailableError as e:
                log.info("worker %s: its liveness lock is still lost: %s", self.worker, e)
                self._locked = False
                return False
        log.warning("worker %s: its liveness lock is held again", self.worker)
        return True

    def _sweep_pg(self) -> list[str]:
        with self._guard:
            if not self.revive(now=True):
                return []
            try:
                rows = self._conn.execute(self._dead_sql.format(mark="%s"),
                                          (self.worker,)).fetchall()
            except Exception as e:
                log.warning("worker %s: its liveness lock is lost: %s", self.worker,
                            first_line(e))
                self._tried = time.monotonic()
                self._drop()
                return []
        return [row[0] for row in rows]

    def stop(self) -> None:
        """Give the lock up (a clean stop: the leases left, if any, may be taken at
        once) and forget registrations of dead workers that hold no lease."""
        if self.bindings.get(self.worker) is self:
            del self.bindings[self.worker]
        with contextlib.suppress(Exception):
            self.db.execute("DELETE FROM saga_workers WHERE NOT EXISTS (SELECT 1 FROM "
                            "saga_leases AS l WHERE l.worker = saga_workers.worker) AND " +
                            dead_sql("saga_workers.worker", self.pg))
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # the lock goes with it; the file stays for the next of this id
        self._drop()
        self._conn = None
