"""Resource slots: the limits of saga.toml's ``[resources.NAME]``, kept in the store so
they hold across every worker and host together.

Three tables beside the events, as :mod:`saga.store.leases` keeps a queue's limits:

- ``saga_resource_slots`` (resource, holder, run, step, expiry): one row per call in
  flight that counts against a resource. The holder (``RUN:STEP:ATTEMPT``) renews its
  slot while the call runs, like a run's lease. A slot lapses at its expiry, or at once
  when its ``worker`` registered its liveness and its lock is gone (its process died:
  :func:`~saga.store.liveness.dead_sql`, checked in the transaction that acquires), so a
  step taken over at once after a kill need not wait a lease for the dead call's slot.
  The row keeps the worker's lock key (``worker_key``) from when it took the slot: a
  clean stop of another worker forgets the registrations of dead workers that hold no
  run's lease (their runs taken over), and their slots must not wait out their expiry.
- ``saga_resource_waiters`` (resource, holder, ``seq``, run, step, since, expiry): the
  calls waiting for a slot, in arrival order (``seq``). A slot goes to the earliest
  waiters first: a call may take one only while fewer waiters came before it than there
  are slots free (fair, first come first served; a newcomer never passes a waiter). A
  waiter that stops asking (its run cancelled, its workers gone) lapses at its expiry.
- ``saga_resource_buckets`` (resource, tokens, updated_at): a token bucket per resource
  with a ``rate``: ``burst`` tokens at most, refilled at ``rate`` per ``per`` seconds, one
  taken by each call it lets start.

Each acquisition is one transaction that counts and takes, under a lock per resource (a
transaction-scoped advisory lock in PostgreSQL, taken in name order so two never
deadlock; SQLite's ``BEGIN IMMEDIATE`` serialises every writer): all of a call's
resources are taken together, or none (a call never holds one slot while it waits for
another). Times are the acquiring worker's clock, as for leases.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from saga.config import ResourceLimit
from saga.store.liveness import WORKERS_DDL, dead_holder_sql, lock_folder, register_sqlite
from saga.store.side_tables import Database

RESOURCE_DDL = (
    """CREATE TABLE IF NOT EXISTS saga_resource_slots (
    resource TEXT NOT NULL, holder TEXT NOT NULL, run_id TEXT NOT NULL, step TEXT NOT NULL,
    worker TEXT, acquired_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (resource, holder))""",
    """CREATE TABLE IF NOT EXISTS saga_resource_waiters (
    resource TEXT NOT NULL, holder TEXT NOT NULL, seq BIGINT NOT NULL, run_id TEXT NOT NULL,
    step TEXT NOT NULL, since DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (resource, holder))""",
    """CREATE TABLE IF NOT EXISTS saga_resource_buckets (
    resource TEXT PRIMARY KEY, tokens DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL)""",
)
#: The advisory lock class of resource acquisitions in PostgreSQL (the key: the name's hash).
RESOURCE_LOCK = 0x5A6A_0042


@dataclass(frozen=True)
class Admission:
    """How an acquisition went: ``granted`` (every slot is held now), else the resources
    it waits for (``blocked``), each with how many waiters came before it."""

    granted: bool
    blocked: tuple[str, ...] = ()
    ahead: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """One resource as the store holds it now: calls in flight, calls waiting, limits."""

    in_use: int
    waiting: int
    limit: ResourceLimit


class ResourceSlots:
    """The resource slots of one store, under the limits of saga.toml ``[resources]``."""

    def __init__(self, db: Database, limits: Mapping[str, ResourceLimit],
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.limits = dict(limits)
        self.clock = clock
        #: Runs whose drive ended with a step still waiting for a slot: a worker of this
        #: process holds them off until a slot may be theirs (see saga.worker.resources).
        self.released: deque[str] = deque()
        if not db.pg:  # saga_alive(worker), which a slot's liveness check calls
            register_sqlite(db.conn, lock_folder(db))
        #: A slot that counts no more: expired (parameter: now), or its worker's process
        #: gone (a worker that never registered, or none, keeps it until it expires).
        dead = dead_holder_sql("saga_resource_slots", "worker_key", "worker", db.pg)
        self._lapsed = f"(expires_at < ? OR {dead})"
        db.create(RESOURCE_DDL + WORKERS_DDL, {"saga_resource_slots": {"worker_key": "BIGINT"}})

    def limited(self, names: Sequence[str]) -> list[str]:
        """Those of ``names`` that saga.toml limits (the others cost nothing), sorted:
        the order every acquisition takes their locks in."""
        return sorted({n for n in names if n in self.limits})

    def acquire(self, names: Sequence[str], holder: str, run_id: str, step: str,
                worker: str | None, seconds: float, wait_seconds: float) -> Admission:
        """Take a slot of each of ``names`` for ``holder`` (``RUN:STEP:ATTEMPT``), all or
        none, for ``seconds`` (renewed by :meth:`renew`); when not granted, ``holder``
        waits in line for the resources it could not have (kept ``wait_seconds`` unless
        it asks again). Asking again while granted renews the slots."""
        names = self.limited(names)
        if not names:
            return Admission(True)

        def once() -> Admission:
            now = self.clock()
            with self.db.tx() as cur:
                blocked: dict[str, int] = {}
                for name in names:
                    self._lock(cur, name)
                    ahead = self._ahead(cur, name, holder, now)
                    if ahead is not None:
                        blocked[name] = ahead
                if blocked:
                    for name in blocked:
                        self._wait(cur, name, holder, run_id, step, now, wait_seconds)
                    return Admission(False, tuple(blocked), blocked)
                for name in names:
                    self._take(cur, name, holder, run_id, step, worker, now, seconds)
                return Admission(True)
        return self.db.retrying("acquiring resource slots", once)

    def _lock(self, cur: Any, name: str) -> None:
        if self.db.pg:
            cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (RESOURCE_LOCK, _key(name)))

    def _ahead(self, cur: Any, name: str, holder: str, now: float) -> int | None:
        """None when ``holder`` may take a slot of ``name`` now (or holds one); else how
        many waiters came before it (those it must not pass)."""
        sql = self.db.sql
        # Lapsed slots go, a dead worker's too: its call died with its process (a step
        # taken over at once is tried again, and takes a slot of its own).
        cur.execute(sql(f"DELETE FROM saga_resource_slots WHERE resource = ? AND {self._lapsed}"),
                    (name, now))
        cur.execute(sql("DELETE FROM saga_resource_waiters WHERE resource = ? "
                        "AND expires_at < ?"), (name, now))
        cur.execute(sql("SELECT holder FROM saga_resource_slots WHERE resource = ?"), (name,))
        holders = {row[0] for row in cur.fetchall()}
        if holder in holders:
            return None
        cur.execute(sql("SELECT seq FROM saga_resource_waiters WHERE resource = ? "
                        "AND holder = ?"), (name, holder))
        mine = cur.fetchone()
        if mine is None:
            cur.execute(sql("SELECT COUNT(*) FROM saga_resource_waiters WHERE resource = ?"),
                        (name,))
        else:
            cur.execute(sql("SELECT COUNT(*) FROM saga_resource_waiters WHERE resource = ? "
                            "AND seq < ?"), (name, mine[0]))
        ahead = int(cur.fetchone()[0])
        free = self._free(cur, name, len(holders), now)
        return None if ahead < free else ahead

    def _free(self, cur: Any, name: str, in_use: int, now: float) -> float:
        """How many calls may start on ``name`` now: its free slots and whole tokens."""
        limit = self.limits[name]
        free = math.inf if limit.concurrency is None else limit.concurrency - in_use
        if limit.rate is not None:
            free = min(free, math.floor(self._tokens(cur, name, now)))
        return free

    def _tokens(self, cur: Any, name: str, now: float) -> float:
        """The tokens of ``name``'s bucket now (full when it has never been used)."""
        limit = self.limits[name]
        burst = float(limit.burst or limit.rate or 1)
        cur.execute(self.db.sql("SELECT tokens, updated_at FROM saga_resource_buckets "
                                "WHERE resource = ?"), (name,))
        row = cur.fetchone()
        if row is None:
            return burst
        refill = max(0.0, now - float(row[1])) * (limit.rate or 0) / (limit.per or 1.0)
        return min(burst, float(row[0]) + refill)

    def _take(self, cur: Any, name: str, holder: str, run_id: str, step: str,
              worker: str | None, now: float, seconds: float) -> None:
        sql = self.db.sql
        cur.execute(sql("UPDATE saga_resource_slots SET expires_at = ? WHERE resource = ? "
                        "AND holder = ?"), (now + seconds, name, holder))
        if cur.rowcount:
            return  # held already: renewed
        cur.execute(sql("INSERT INTO saga_resource_slots (resource, holder, run_id, step, "
                        "worker, acquired_at, expires_at, worker_key) VALUES (?, ?, ?, ?, ?, "
                        "?, ?, (SELECT lock_key FROM saga_workers WHERE worker = ?))"),
                    (name, holder, run_id, step, worker, now, now + seconds, worker))
        cur.execute(sql("DELETE FROM saga_resource_waiters WHERE resource = ? AND holder = ?"),
                    (name, holder))
        if self.limits[name].rate is not None:
            tokens = self._tokens(cur, name, now) - 1
            cur.execute(sql("INSERT INTO saga_resource_buckets (resource, tokens, updated_at) "
                            "VALUES (?, ?, ?) ON CONFLICT (resource) DO UPDATE SET "
                            "tokens = excluded.tokens, updated_at = excluded.updated_at"),
                        (name, tokens, now))

    def _wait(self, cur: Any, name: str, holder: str, run_id: str, step: str, now: float,
              seconds: float) -> None:
        """Keep ``holder`` in line for ``name``: at its place if it has one (refreshed),
        else last."""
        sql = self.db.sql
        cur.execute(sql("UPDATE saga_resource_waiters SET expires_at = ? WHERE resource = ? "
                        "AND holder = ?"), (now + seconds, name, holder))
        if cur.rowcount:
            return
        cur.execute(sql("SELECT COALESCE(MAX(seq), 0) FROM saga_resource_waiters "
                        "WHERE resource = ?"), (name,))
        seq = int(cur.fetchone()[0]) + 1
        cur.execute(sql("INSERT INTO saga_resource_waiters (resource, holder, seq, run_id, "
                        "step, since, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?)"),
                    (name, holder, seq, run_id, step, now, now + seconds))

    def renew(self, holders: Sequence[str], seconds: float) -> int:
        """Extend the slots these holders hold (while their calls run); how many were
        still held (a slot that lapsed is not taken back: its call runs on uncounted)."""
        if not holders:
            return 0
        marks = ", ".join("?" * len(holders))
        return self.db.execute(f"UPDATE saga_resource_slots SET expires_at = ? "
                               f"WHERE holder IN ({marks})",
                               (self.clock() + seconds, *holders), flush=False)

    def release(self, holders: Sequence[str]) -> None:
        """Give up the slots (and places in line) of these holders: their calls ended."""
        if not holders:
            return
        marks = ", ".join("?" * len(holders))
        with self.db.tx() as cur:
            for table in ("saga_resource_slots", "saga_resource_waiters"):
                cur.execute(self.db.sql(f"DELETE FROM {table} WHERE holder IN ({marks})"),
                            tuple(holders))

    def leave(self, run_id: str) -> None:
        """Take a run's steps out of every line (the run ended, or stopped waiting)."""
        self.db.execute("DELETE FROM saga_resource_waiters WHERE run_id = ?", (run_id,))

    def usage(self) -> dict[str, Usage]:
        """Each limited resource now: slots in use and waiters (lapsed ones not counted)."""
        now = self.clock()
        counts: dict[str, list[int]] = {name: [0, 0] for name in self.limits}
        for column, table in enumerate(("saga_resource_slots", "saga_resource_waiters")):
            live = f"NOT {self._lapsed}" if column == 0 else "expires_at >= ?"
            for row in self.db.query(f"SELECT resource, COUNT(*) AS n FROM {table} "
                                     f"WHERE {live} GROUP BY resource", (now,)):
                counts.setdefault(row["resource"], [0, 0])[column] = int(row["n"])
        return {name: Usage(used, waiting, self.limits.get(name, ResourceLimit()))
                for name, (used, waiting) in counts.items()}

    def holders(self, name: str) -> list[dict[str, Any]]:
        """The calls holding a slot of ``name`` now (holder, run, step, worker, times): a
        dead worker's are not."""
        return self.db.query("SELECT holder, run_id, step, worker, acquired_at, expires_at "
                             f"FROM saga_resource_slots WHERE resource = ? AND NOT {self._lapsed} "
                             "ORDER BY acquired_at", (name, self.clock()))

    def waiters(self, name: str) -> list[dict[str, Any]]:
        """The calls waiting for ``name`` now, in arrival order."""
        return self.db.query("SELECT holder, seq, run_id, step, since FROM "
                             "saga_resource_waiters WHERE resource = ? AND expires_at >= ? "
                             "ORDER BY seq", (name, self.clock()))

    def servable(self) -> set[str]:
        """The runs whose waiting calls are first in line for a slot free now (of one of
        their resources, at least): a worker holding such a run off looks at it again."""
        now = self.clock()
        rows = self.db.query("SELECT resource, run_id FROM saga_resource_waiters "
                             "WHERE expires_at >= ? ORDER BY resource, seq", (now,))
        if not rows:
            return set()
        used = {name: u.in_use for name, u in self.usage().items()}
        buckets = {r["resource"]: r for r in self.db.query(
            "SELECT resource, tokens, updated_at FROM saga_resource_buckets")}
        lines: dict[str, list[str]] = {}
        for row in rows:
            lines.setdefault(row["resource"], []).append(row["run_id"])
        found: set[str] = set()
        for name, runs in lines.items():
            limit = self.limits.get(name)
            if limit is None:
                continue
            free = math.inf if limit.concurrency is None else limit.concurrency - used[name]
            if limit.rate is not None and name in buckets:
                b = buckets[name]
                refill = max(0.0, now - float(b["updated_at"])) * limit.rate / (limit.per or 1)
                free = min(free, math.floor(min(float(limit.burst or limit.rate),
                                                float(b["tokens"]) + refill)))
            found.update(runs[:max(0, int(min(free, len(runs))))])
        return found


def _key(name: str) -> int:
    """A resource's advisory lock key: a stable signed 32-bit hash of its name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big", signed=True)
