"""Leases on runs: whoever holds a run's lease drives it.

A lease is a row in ``saga_leases`` (run id, worker, expiry). The holder renews it while
it drives; when a worker dies, its lease expires and any other worker may take the run
over. The lease keeps two live workers from driving one run; the run's version number is
the fence behind it: a stale worker's append is rejected and it backs off.

A lease also names its run's queue, so the leases held in a queue are the runs of it
being driven: :meth:`Leases.claim_queued` counts them, and the queue's recent starts
(``saga_queue_starts``), in the same transaction as the claim, under a lock per queue
(a transaction-scoped advisory lock in PostgreSQL; SQLite's ``BEGIN IMMEDIATE``
serialises every writer), so a queue's limits hold across every worker together.

A lease also ends with its holder's process when the holder registered its liveness
(a worker does; see :mod:`saga.store.liveness`): a claim takes an unexpired lease whose
holder's lock is gone, so a killed worker's runs move on in about a second, not a lease.

A claim is an ordinary (flushed) commit. A run never saved yet may instead be claimed by
the statement that appends its first events (:class:`LeaseClaim`, on PostgreSQL with
saga's recorder): the lease and the run appear in one commit, one round trip fewer. In
the same way, the append that ends a run may give its lease up (:class:`LeaseRelease`).
Releases wait for their WAL flush, as claims do: one lost in a server crash would leave
its run to wait for the lease to expire. Renewals commit without waiting for theirs
(PostgreSQL; see :meth:`Database.execute`): a server crash can only lose one that no
later commit flushed, and a renewal lost moves the lease's expiry back, so the run may
be taken over early, which the version fence already covers, as for any expired lease.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from saga.config import QueueLimit
from saga.domain import ENDINGS, TOPIC_PREFIX, run_uuid
from saga.errors import LeaseHeldError, StoreUnavailableError
from saga.store.liveness import WORKERS_DDL, beside, dead_sql, lock_folder, register_sqlite
from saga.store.side_tables import Database

log = logging.getLogger("saga.store")
#: The stored topics of the events that end a run.
_ENDING_TOPICS = sorted(TOPIC_PREFIX + name for name in ENDINGS)

LEASE_DDL = ("""CREATE TABLE IF NOT EXISTS saga_leases (
    run_id TEXT PRIMARY KEY, worker TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL,
    queue TEXT, prev_worker TEXT, prev_expires DOUBLE PRECISION)""",
             """CREATE TABLE IF NOT EXISTS saga_queue_starts (
    queue TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL)""",
             """CREATE INDEX IF NOT EXISTS saga_queue_starts_by_queue
    ON saga_queue_starts (queue, started_at)""")


#: When a claim takes a lease: nobody holds it, its holder's has expired, or it is ours
#: already, or (``{dead}``, when given) its holder's process is gone (``{now}``: the
#: parameter of the time now). Every claim is this upsert.
#: A claim taking the lease from another worker keeps that worker and its lease's expiry
#: (``prev_worker``, ``prev_expires``): its last renewal is the last sign of life a dead
#: worker left, which a takeover records (see :meth:`Leases.previous`).
_TAKE = ("ON CONFLICT (run_id) DO UPDATE SET worker = excluded.worker, "
         "expires_at = excluded.expires_at, queue = excluded.queue, "
         "prev_worker = CASE WHEN saga_leases.worker = excluded.worker "
         "THEN saga_leases.prev_worker ELSE saga_leases.worker END, "
         "prev_expires = CASE WHEN saga_leases.worker = excluded.worker "
         "THEN saga_leases.prev_expires ELSE saga_leases.expires_at END "
         "WHERE saga_leases.expires_at < {now} OR saga_leases.worker = excluded.worker"
         "{dead}")


def _take(now: str, dead: str = "") -> str:
    """:data:`_TAKE`, taking leases whose holders are ``dead`` (SQL, or none)."""
    return _TAKE.format(now=now, dead=f" OR {dead}" if dead else "")


def claim_sql(table: str = "saga_leases", mark: str = "?", dead: str = "") -> str:
    """The claim of one run's lease (parameters: run id, worker, expiry, queue, now) in
    ``table`` (``saga_leases``, schema-qualified or not), ``mark`` marking parameters;
    ``dead``: the condition (:func:`~saga.store.liveness.dead_sql` of
    ``saga_leases.worker``) under which an unexpired lease's holder is gone."""
    return (f"INSERT INTO {table} (run_id, worker, expires_at, queue) "
            f"VALUES ({mark}, {mark}, {mark}, {mark}) " + _take(mark, dead))


def release_sql(table: str = "saga_leases", mark: str = "?", count: int = 1,
                ordered: bool = False) -> str:
    """The release of the leases one worker holds on ``count`` runs (parameters: the
    worker, then the run ids), as :func:`claim_sql` names the table and parameters.

    ``ordered`` (PostgreSQL) locks the rows in run id order first, as claims take them
    (:meth:`Leases.claim_first`): a claim of several runs and a release of several never
    deadlock (a claim locks a row another worker holds even when it does not take it)."""
    ids = ", ".join([mark] * count)
    if not ordered:
        return f"DELETE FROM {table} WHERE worker = {mark} AND run_id IN ({ids})"
    return (f"DELETE FROM {table} WHERE run_id IN (SELECT run_id FROM {table} "
            f"WHERE worker = {mark} AND run_id IN ({ids}) ORDER BY run_id FOR UPDATE)")


def claim_first_sql(*, versions: bool, leases: str = "saga_leases",
                    events: str = "saga_events", run_type: str = "uuid",
                    mark: str = "?", array_mark: str | None = None) -> str:
    """The claim of :meth:`Leases.claim_first` as the CTEs ``t`` (the runs claimed:
    ``run_id``) and ``h`` (those another worker holds: ``run_id``, ``expires_at``), for a
    statement to end with its own SELECT of them; its parameters are
    :func:`claim_first_args`. ``versions``: passing over the runs that have ended past the
    versions given; the tables, the events' id type and the parameter mark as
    :func:`claim_sql` takes them, and the mark of the arrays (psycopg's ``%b`` sends
    them in binary: a third of the client's CPU of text, which quotes each element)."""
    arrays = array_mark or mark
    workers = beside(leases, "saga_workers")  # a holder's liveness (PostgreSQL's)
    # Ended runs are looked for in claim order, only until enough others are found
    # (OFFSET 0 keeps the check above the sort), each by one probe of its primary key
    # (a scalar subquery: as NOT EXISTS the planner may join the table instead).
    ended = "" if not versions else (
        f"OFFSET 0) AS s WHERE (SELECT e.originator_version FROM {events} AS e "
        f"WHERE e.originator_id = s.r::{run_type} AND e.originator_version > s.v "
        f"AND e.topic = ANY({arrays}::text[]) LIMIT 1) IS NULL ORDER BY s.o ")
    return (
        f"WITH c AS (SELECT r, q, v, o FROM unnest({arrays}::text[], {arrays}::text[], "
        f"{arrays}::bigint[]) WITH ORDINALITY AS c(r, q, v, o)), "
        # as a claim sees a lease: another worker's, not expired, its holder alive (the
        # complement of _TAKE's condition)
        f"h AS (SELECT l.run_id, l.expires_at FROM {leases} AS l JOIN c "
        f"ON l.run_id = c.r WHERE l.expires_at >= {mark} AND l.worker <> {mark} "
        f"AND NOT {dead_sql('l.worker', True, workers)}), "
        f"t AS (INSERT INTO {leases} (run_id, worker, expires_at, queue) "
        f"SELECT r, {mark}, {mark}, q FROM (SELECT r, q FROM "
        + ("c " if not versions else "(SELECT r, q, v, o FROM c ") +
        "WHERE r NOT IN (SELECT run_id FROM h) ORDER BY o "
        + ended + f"LIMIT {mark}) AS p "
        # one order for every worker's claims: two can wait, but never deadlock
        "ORDER BY r " + _take(mark, dead_sql("saga_leases.worker", True, workers))
        + " RETURNING run_id) ")


def claim_first_args(run_ids: Sequence[str], count: int, worker: str, seconds: float,
                     queues: Sequence[str | None], versions: Sequence[int] | None,
                     now: float) -> tuple[Any, ...]:
    """The parameters of :func:`claim_first_sql`, claiming at ``now``."""
    return (list(run_ids), list(queues), list(versions or []), now, worker, worker,
            now + seconds, *(() if versions is None else (_ENDING_TOPICS,)), count, now)


#: A run's store key as text (a lowercase UUID), which needs no parsing.
_KEY = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def lease_key(run_id: str) -> str:
    """The key of a run's lease: its store key (the UUID its events are stored under),
    whether the run is named by it or by the name its caller chose (``ORDER-42``). Every
    process must claim one run under one key: a worker knows runs by their store key, so
    a command that claimed by name would hold a lease of its own beside the worker's, and
    two live processes would drive the run at once."""
    return run_id if _KEY.fullmatch(run_id) else str(run_uuid(run_id))


#: The advisory lock class of queue claims in PostgreSQL (the key is the queue's hash).
QUEUE_LOCK = 0x5A6A

#: How a claim in a queue went: the lease is ours, another worker holds it, the queue
#: has as many runs driven as its concurrency allows, or as many starts as its rate.
Claim = Literal["claimed", "held", "full", "rate"]


def default_worker_id() -> str:
    """``host:pid:nonce``: containers that share a host name and pid 1 still differ, so
    two of them never both hold one lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Leases:
    """The ``saga_leases`` table of one store."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        #: The liveness each worker of this process holds, by worker id (see
        #: saga.store.liveness): its leases count only while it holds it.
        self.bindings: dict[str, Any] = {}
        if not db.pg:
            register_sqlite(db.conn, lock_folder(db))
        self._dead = dead_sql("saga_leases.worker", db.pg)
        self._claim = claim_sql(dead=self._dead)
        # "queue": a column a table from before queues lacks
        db.create(LEASE_DDL[:1], {"saga_leases": {"queue": "TEXT", "prev_worker": "TEXT",
                                                  "prev_expires": "DOUBLE PRECISION"}},
                  LEASE_DDL[1:] + WORKERS_DDL)

    def claim(self, run_id: str, worker: str, seconds: float,
              queue: str | None = None) -> bool:
        """Take (or extend) the lease unless another worker holds an unexpired one; the
        lease counts in ``queue`` (None: in none, as a child run's)."""
        now = self.clock()
        return self.db.execute(self._claim, (lease_key(run_id), worker, now + seconds,
                                             queue, now)) == 1

    def claim_queued(self, run_id: str, worker: str, seconds: float, queue: str,
                     limit: QueueLimit, *, start: bool) -> Claim:
        """Take the lease of a run of ``queue`` within the queue's limits, atomically with
        respect to them: unless ``concurrency`` unexpired leases of other runs of the queue
        are held, and (when the claim starts the run) unless ``rate`` starts were
        recorded in the last ``per`` seconds; a start is recorded with the claim."""
        now = self.clock()
        db = self.db
        run_id = lease_key(run_id)
        with db.tx() as cur:
            if db.pg:
                cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (QUEUE_LOCK, _key(queue)))
            if limit.concurrency is not None:
                cur.execute(db.sql("SELECT COUNT(*) FROM saga_leases WHERE queue = ? AND "
                                   "expires_at >= ? AND run_id <> ?"), (queue, now, run_id))
                if cur.fetchone()[0] >= limit.concurrency:
                    return "full"
            counted = start and limit.rate is not None and limit.per is not None
            if counted:
                cur.execute(db.sql("DELETE FROM saga_queue_starts WHERE queue = ? AND "
                                   "started_at <= ?"), (queue, now - (limit.per or 0)))
                cur.execute(db.sql("SELECT COUNT(*) FROM saga_queue_starts WHERE queue = ?"),
                            (queue,))
                if cur.fetchone()[0] >= (limit.rate or 0):
                    return "rate"
            cur.execute(db.sql(self._claim), (run_id, worker, now + seconds, queue, now))
            if cur.rowcount != 1:
                return "held"
            if counted:
                cur.execute(db.sql("INSERT INTO saga_queue_starts (queue, started_at) "
                                   "VALUES (?, ?)"), (queue, now))
        return "claimed"

    def claim_first(self, run_ids: list[str], count: int, worker: str, seconds: float,
                    queues: list[str | None] | None = None,
                    versions: list[int] | None = None
                    ) -> tuple[list[str], dict[str, float]]:
        """Claim the first ``count`` of these runs (in their order) that no other worker
        holds, in one statement and one commit (each lease counting in its queue, as
        :meth:`claim`): the ids this worker now holds, in order, and the expiry (POSIX
        time) of each other worker's unexpired lease among them, which the same
        statement reads. A run another worker claims meanwhile is neither: it is lost.

        ``versions`` (PostgreSQL): the version of each run's last event the caller has
        read. A run that has ended since (another worker has just finished it and given
        its lease up; the caller has not read that yet) is passed over, neither claimed
        nor held: a drive of it would only find it ended. The caller's next read of the
        log says. A run that only moved on otherwise is claimed as before: its drive
        reads it whole."""
        if not run_ids or count <= 0:
            return [], {}
        queues = queues if queues is not None else [None] * len(run_ids)
        if not self.db.pg:
            held = self.held_by_others(run_ids, worker)
            claimed: list[str] = []
            for r, q in zip(run_ids, queues, strict=True):
                if len(claimed) < count and r not in held \
                        and self.claim(r, worker, seconds, q):
                    claimed.append(r)
            return claimed, held

        names = {lease_key(r): r for r in run_ids}  # each run as the caller named it
        rows = self.db.query(
            claim_first_sql(versions=versions is not None) +
            "SELECT run_id, NULL AS expires_at FROM t UNION ALL SELECT run_id, expires_at FROM h",
            # at each try: one after an outage counts from then
            lambda: claim_first_args(list(names), count, worker, seconds, queues, versions,
                                     self.clock()),
            where="claiming runs")
        taken = {names[row["run_id"]] for row in rows if row["expires_at"] is None}
        return ([r for r in run_ids if r in taken],
                {names[row["run_id"]]: float(row["expires_at"]) for row in rows
                 if row["expires_at"] is not None})

    def holders(self, run_ids: list[str]) -> dict[str, tuple[str, float]]:
        """The holder and expiry (POSIX time) of each of these runs' leases, by run id
        (none for a run nobody holds)."""
        if not run_ids:
            return {}
        keys = {lease_key(r): r for r in run_ids}
        marks = ", ".join("?" * len(keys))
        rows = self.db.query("SELECT run_id, worker, expires_at FROM saga_leases "
                             f"WHERE run_id IN ({marks})", list(keys))
        return {keys[r["run_id"]]: (r["worker"], float(r["expires_at"])) for r in rows}

    def held_by_others(self, run_ids: list[str], worker: str) -> dict[str, float]:
        """The expiry (POSIX time) of each unexpired lease of these runs that a live
        worker other than ``worker`` holds, as a claim sees it (it could not take those)."""
        if not run_ids:
            return {}
        keys = {lease_key(r): r for r in run_ids}
        rows = self.db.query(
            "SELECT run_id, expires_at FROM saga_leases WHERE run_id IN "
            f"({', '.join('?' * len(keys))}) AND worker <> ? AND expires_at >= ? "
            f"AND NOT {self._dead}", [*keys, worker, self.clock()])
        return {keys[r["run_id"]]: float(r["expires_at"]) for r in rows}

    def renew(self, run_id: str, worker: str, seconds: float) -> bool:
        """Extend a lease this worker holds; False if it was taken over, or this worker
        lost its liveness (others may take its runs at any time until it has it again:
        :meth:`~saga.store.liveness.Liveness.revive` tries to, then this lease is still
        its own only if nobody took it meanwhile)."""
        binding = self.bindings.get(worker)
        if binding is not None and not binding.revive():
            return False
        return self.db.execute(
            "UPDATE saga_leases SET expires_at = ? WHERE run_id = ? AND worker = ?",
            (self.clock() + seconds, lease_key(run_id), worker), flush=False) == 1

    def release(self, run_id: str, worker: str) -> None:
        """Give the lease up."""
        self.release_many([run_id], worker)

    def release_many(self, run_ids: Sequence[str], worker: str) -> None:
        """Give up the leases this worker holds on these runs, in one statement that
        waits for its flush (see the module docs)."""
        if run_ids:
            self.db.execute(release_sql(count=len(run_ids),
                                        ordered=self.db.pg and len(run_ids) > 1),
                            (worker, *map(lease_key, run_ids)))

    def holder(self, run_id: str) -> tuple[str, float] | None:
        """(worker, expires_at) of the current lease, if any."""
        rows = self.db.query("SELECT worker, expires_at FROM saga_leases WHERE run_id = ?",
                             (lease_key(run_id),))
        return (rows[0]["worker"], rows[0]["expires_at"]) if rows else None

    def previous(self, run_id: str, worker: str) -> tuple[str, float] | None:
        """The worker ``worker`` took this run's lease from, and that lease's expiry
        (POSIX time), while ``worker`` holds it; None if it was free when taken."""
        rows = self.db.query("SELECT prev_worker, prev_expires FROM saga_leases "
                             "WHERE run_id = ? AND worker = ?", (lease_key(run_id), worker))
        if not rows or rows[0]["prev_worker"] is None or rows[0]["prev_expires"] is None:
            return None
        return rows[0]["prev_worker"], float(rows[0]["prev_expires"])

    def lease(self, run_id: str, worker: str, seconds: float) -> Lease:
        """A lease handle for the executor."""
        return Lease(self, lease_key(run_id), worker, seconds)


@dataclass(frozen=True)
class LeaseClaim:
    """A lease claim the run's first append makes in its own statement (the claim of
    :meth:`Leases.claim`: unless another worker holds an unexpired lease; the append
    stores nothing then, and raises LeaseHeldError)."""

    run_id: str
    worker: str
    expires_at: float
    queue: str | None
    now: float


@dataclass(frozen=True)
class LeaseRelease:
    """A lease the append of its run's last events gives up in its own statement (the
    release of :meth:`Leases.release`), when the store can (see ``LeaseClaim``)."""

    run_id: str
    worker: str


@dataclass
class Lease:
    """One held lease, renewed by the executor every third of its length (``claim``: not
    claimed yet; the run's first append claims it. ``appends``: the store can claim and
    release it in the statements of the run's appends)."""

    leases: Leases
    run_id: str
    worker: str
    seconds: float
    claim: LeaseClaim | None = None
    appends: bool = False
    released: bool = False
    #: When the lease expires at the earliest, by this process's clock (POSIX time): the
    #: start of its last claim or renewal plus its length; 0 when not known.
    expires: float = 0.0

    @property
    def renew_every(self) -> float:
        """How often to renew."""
        return max(self.seconds / 3, 0.05)

    def take_claim(self) -> LeaseClaim | None:
        """The claim the next append is to make (once), if it is still to be made."""
        claim, self.claim = self.claim, None
        if claim is not None:
            self.expires = claim.expires_at
        return claim

    def renew(self) -> bool:
        """Extend the lease; False when another worker holds it now."""
        if self.claim is not None:
            return True  # not claimed yet: the first append claims it for a whole length
        started = self.leases.clock()
        if not self.leases.renew(self.run_id, self.worker, self.seconds):
            return False
        self.expires = started + self.seconds
        return True

    def fresh(self, margin: float) -> bool:
        """Whether the lease is surely held for ``margin`` seconds more, by this
        process's clock alone (no round trip): renewed recently enough, or still to be
        claimed by the run's first append; never while this worker has lost its
        liveness (a renewal then says the lease is lost)."""
        binding = self.leases.bindings.get(self.worker)
        if binding is not None and not binding.alive:
            return False
        return self.claim is not None or self.leases.clock() < self.expires - margin

    def previous(self) -> tuple[str, float] | None:
        """The worker this lease was taken from, and when its lease expired (POSIX
        time); None if the lease was free when taken (see :meth:`Leases.previous`)."""
        return self.leases.previous(self.run_id, self.worker)

    def ending(self) -> LeaseRelease | None:
        """The release the append that ends the run is to make, if the store can and the
        lease is claimed already; pass it to that append, then call :meth:`ended`."""
        return LeaseRelease(self.run_id, self.worker) \
            if self.appends and self.claim is None and not self.released else None

    def ended(self) -> None:
        """The run's last append gave the lease up: :meth:`release` has nothing to do."""
        self.released = True

    def release(self, quiet: bool = False) -> None:
        """Give the lease up (``quiet``: if the store cannot be reached, let the lease
        expire instead: nothing else waits for it)."""
        if self.released:
            return
        try:
            self.leases.release(self.run_id, self.worker)
        except StoreUnavailableError as e:
            if not quiet:
                raise
            log.info("could not release the lease on run %s: %s", self.run_id, e)


def _key(queue: str) -> int:
    """A queue's advisory lock key: a stable signed 32-bit hash of its name."""
    return int.from_bytes(hashlib.sha256(queue.encode()).digest()[:4], "big", signed=True)


def wait_for_lease(leases: Leases, run_id: str, worker: str, seconds: float,
                   wait: float, queue: str | None = None, *,
                   with_first_append: bool = False, appends: bool = False) -> Lease:
    """Claim a run's lease, waiting up to ``wait`` seconds for another holder's to expire
    (the lease counts in ``queue``, but is not held back by its limits).

    ``appends``: the store can claim and release leases in the statements of a run's
    appends. ``with_first_append`` (then): the run was never saved, and the lease is
    returned unclaimed, carrying the claim its first append makes. Nothing waits then: a
    run not yet saved has a holder only if another process is starting the same run id,
    and that one's events would conflict anyway."""
    name, run_id = run_id, lease_key(run_id)  # a run's name: the key a worker claims it by
    if with_first_append and appends:
        now = leases.clock()
        return Lease(leases, run_id, worker, seconds,
                     LeaseClaim(run_id, worker, now + seconds, queue, now), appends=True)
    deadline = time.monotonic() + wait
    while True:
        claimed_at = leases.clock()  # the claim's own time is no earlier
        if leases.claim(run_id, worker, seconds, queue):
            break
        if time.monotonic() >= deadline:
            held = leases.holder(run_id)
            raise LeaseHeldError(name, held[0] if held else "unknown")
        time.sleep(0.1)
    return Lease(leases, run_id, worker, seconds, appends=appends,
                 expires=claimed_at + seconds)
