"""Leases on runs: whoever holds a run's lease drives it.

A lease is a row in ``saga_leases`` (run id, worker, expiry). The holder renews it while
it drives; when a worker dies, its lease expires and any other worker may take the run
over. The lease keeps two live workers from driving one run; the run's version number is
the fence behind it: a stale worker's append is rejected and it backs off.

A claim is an ordinary (flushed) commit. Renewals and releases commit without waiting
for their WAL flush (PostgreSQL; see :meth:`Database.execute`): a server crash can only
lose one that no later commit flushed, which moves the lease's expiry (a release lost:
the run waits for its lease to expire; a renewal lost: it may be taken over early, which
the version fence already covers, as for any expired lease).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from saga.errors import LeaseHeldError
from saga.store.side_tables import Database

LEASE_DDL = ("""CREATE TABLE IF NOT EXISTS saga_leases (
    run_id TEXT PRIMARY KEY, worker TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)""",)


_CLAIM = """INSERT INTO saga_leases (run_id, worker, expires_at) VALUES (?, ?, ?)
    ON CONFLICT (run_id) DO UPDATE SET worker = excluded.worker,
        expires_at = excluded.expires_at
    WHERE saga_leases.expires_at < ? OR saga_leases.worker = excluded.worker"""


def default_worker_id() -> str:
    """``host:pid:nonce``: containers that share a host name and pid 1 still differ, so
    two of them never both hold one lease."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Leases:
    """The ``saga_leases`` table of one store."""

    def __init__(self, db: Database, clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        db.create(LEASE_DDL)

    def claim(self, run_id: str, worker: str, seconds: float) -> bool:
        """Take (or extend) the lease unless another worker holds an unexpired one."""
        now = self.clock()
        return self.db.execute(_CLAIM, (run_id, worker, now + seconds, now)) == 1

    def claim_many(self, run_ids: list[str], worker: str, seconds: float) -> list[str]:
        """Claim several runs in one commit; the ids this worker now holds, in order."""
        if not run_ids:
            return []
        now = self.clock()
        if not self.db.pg:
            return [r for r in run_ids if self.claim(r, worker, seconds)]
        with self.db.tx() as cur:
            cur.execute(
                "INSERT INTO saga_leases (run_id, worker, expires_at) "
                "SELECT unnest(%s::text[]), %s, %s ON CONFLICT (run_id) DO UPDATE "
                "SET worker = excluded.worker, expires_at = excluded.expires_at "
                "WHERE saga_leases.expires_at < %s OR saga_leases.worker = excluded.worker "
                "RETURNING run_id", (list(run_ids), worker, now + seconds, now))
            held = {row[0] for row in cur.fetchall()}
        return [r for r in run_ids if r in held]

    def renew(self, run_id: str, worker: str, seconds: float) -> bool:
        """Extend a lease this worker holds; False if it was taken over."""
        return self.db.execute(
            "UPDATE saga_leases SET expires_at = ? WHERE run_id = ? AND worker = ?",
            (self.clock() + seconds, run_id, worker), flush=False) == 1

    def release(self, run_id: str, worker: str) -> None:
        """Give the lease up."""
        self.db.execute("DELETE FROM saga_leases WHERE run_id = ? AND worker = ?",
                        (run_id, worker), flush=False)

    def holder(self, run_id: str) -> tuple[str, float] | None:
        """(worker, expires_at) of the current lease, if any."""
        rows = self.db.query("SELECT worker, expires_at FROM saga_leases WHERE run_id = ?",
                             (run_id,))
        return (rows[0]["worker"], rows[0]["expires_at"]) if rows else None

    def lease(self, run_id: str, worker: str, seconds: float) -> Lease:
        """A lease handle for the executor."""
        return Lease(self, run_id, worker, seconds)


@dataclass
class Lease:
    """One held lease, renewed by the executor every third of its length."""

    leases: Leases
    run_id: str
    worker: str
    seconds: float

    @property
    def renew_every(self) -> float:
        """How often to renew."""
        return max(self.seconds / 3, 0.05)

    def renew(self) -> bool:
        """Extend the lease; False when another worker holds it now."""
        return self.leases.renew(self.run_id, self.worker, self.seconds)

    def release(self) -> None:
        """Give the lease up."""
        self.leases.release(self.run_id, self.worker)


def wait_for_lease(leases: Leases, run_id: str, worker: str, seconds: float,
                   wait: float) -> Lease:
    """Claim a run's lease, waiting up to ``wait`` seconds for another holder's to expire."""
    deadline = time.monotonic() + wait
    while not leases.claim(run_id, worker, seconds):
        if time.monotonic() >= deadline:
            held = leases.holder(run_id)
            raise LeaseHeldError(run_id, held[0] if held else "unknown")
        time.sleep(0.1)
    return leases.lease(run_id, worker, seconds)
