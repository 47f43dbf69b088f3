"""Workers: leases on runs, finding runnable runs in the log, and driving them.

A run is driven by whoever holds its lease (a row in ``saga_leases``: run id, worker,
expiry). The holder renews it while it drives; when a worker dies, its lease expires and
any other worker may take the run over, treating the attempts it left ``running`` as
interrupted (see :func:`saga.scheduler.interrupted`). The lease keeps two live workers
from driving one run; the run's version number is the fence behind it: a stale worker's
append is rejected and it backs off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from saga.database import Database
from saga.domain import TERMINAL
from saga.errors import ConcurrentWriteError, LeaseHeldError, LeaseLostError, SagaError

if TYPE_CHECKING:
    from saga.api import Saga
    from saga.application import SagaApplication

log = logging.getLogger("saga.worker")

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

    def renew(self, run_id: str, worker: str, seconds: float) -> bool:
        """Extend a lease this worker holds; False if it was taken over."""
        return self.db.execute(
            "UPDATE saga_leases SET expires_at = ? WHERE run_id = ? AND worker = ?",
            (self.clock() + seconds, run_id, worker)) == 1

    def release(self, run_id: str, worker: str) -> None:
        """Give the lease up."""
        self.db.execute("DELETE FROM saga_leases WHERE run_id = ? AND worker = ?",
                        (run_id, worker))

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


@dataclass
class RunIndex:
    """Unfinished runs, followed from the notification log by topic (cheap: payloads are
    read only for approvals)."""

    app: SagaApplication
    position: int = 0
    runs: dict[str, str] = field(default_factory=dict)  # run id -> status
    approvals: dict[str, int] = field(default_factory=dict)  # run id -> undecided count

    def refresh(self) -> None:
        """Read the log since the last refresh."""
        while True:
            page = self.app.recorder.select_notifications(start=self.position + 1, limit=1000)
            for n in page:
                if n.topic == "saga.RunStarted" and _has_parent(n.state):
                    continue  # a child run is driven by its parent's step, never on its own
                self._apply(str(n.originator_id), n.topic)
            if page:
                self.position = page[-1].id
            if len(page) < 1000:
                return

    def _apply(self, run_id: str, topic: str) -> None:
        kind = topic.removeprefix("saga.")
        if kind != "RunStarted" and run_id not in self.runs:
            return  # not a run this index follows (e.g. a child run)
        if kind == "RunStarted":
            self.runs[run_id] = "running"
        elif kind in ("RunCompleted", "RunFailed", "RunCompensated", "RunCancelled"):
            status = kind.removeprefix("Run").lower()
            self.runs[run_id] = status
        elif kind in ("CompensationStarted", "RunRetried"):
            self.runs[run_id] = "running"
        elif kind == "ApprovalRequested":
            self.approvals[run_id] = self.approvals.get(run_id, 0) + 1
        elif kind in ("ApprovalGranted", "ApprovalRejected"):
            self.approvals[run_id] = self.approvals.get(run_id, 0) - 1

    def runnable(self) -> list[str]:
        """Unfinished runs not waiting only for a person, oldest first."""
        return [run_id for run_id, status in self.runs.items()
                if status not in TERMINAL and self.approvals.get(run_id, 0) <= 0]


def _has_parent(state: bytes) -> bool:
    try:
        return bool(json.loads(state).get("context", {}).get("parent"))
    except (ValueError, AttributeError):
        return False


class Worker:
    """Claims runnable runs and drives up to ``concurrency`` of them at once."""

    def __init__(self, saga: Saga, *, worker_id: str | None = None, lease_seconds: float = 30.0,
                 concurrency: int = 4, poll_interval: float = 0.5) -> None:
        self.saga = saga
        self.worker_id = worker_id or default_worker_id()
        self.lease_seconds = lease_seconds
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.index = RunIndex(saga.app)
        self.driven = 0

    def run(self, *, until_idle: bool = False, stop: Callable[[], bool] | None = None) -> int:
        """Work until ``stop()`` says so (or, with ``until_idle``, nothing is runnable);
        returns how many drives ended."""
        return asyncio.run(self._run(until_idle, stop or (lambda: False)))

    async def _run(self, until_idle: bool, stop: Callable[[], bool]) -> int:
        leases = self.saga.leases
        active: dict[str, asyncio.Task[None]] = {}
        while not stop():
            self.index.refresh()
            for run_id, task in list(active.items()):
                if task.done():
                    active.pop(run_id)
            claimed = 0
            for run_id in self.index.runnable():
                if len(active) >= self.concurrency:
                    break
                if run_id in active or not leases.claim(run_id, self.worker_id,
                                                        self.lease_seconds):
                    continue
                claimed += 1
                active[run_id] = asyncio.ensure_future(self._drive(run_id))
            if until_idle and not active and not claimed:
                break
            waiting = list(active.values())
            if waiting:
                await asyncio.wait(waiting, timeout=self.poll_interval,
                                   return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(self.poll_interval)
        for task in active.values():
            task.cancel()
        return self.driven

    async def _drive(self, run_id: str) -> None:
        lease = self.saga.leases.lease(run_id, self.worker_id, self.lease_seconds)
        try:
            run = self.saga.get(run_id)
            if not run.is_finished:
                executor = self.saga.executor(worker=self.worker_id)
                try:
                    await executor.drive_async(run, lease)
                finally:
                    executor.close()
        except (ConcurrentWriteError, LeaseLostError) as e:
            log.info("backing off run %s: %s", run_id, e)
        except SagaError as e:
            log.error("run %s: %s", run_id, e)
        except Exception:
            log.exception("run %s failed in the worker", run_id)
        finally:
            self.driven += 1
            try:
                lease.release()
            except Exception:  # the lease expires anyway
                log.warning("could not release the lease on %s", run_id)


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
