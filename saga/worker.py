"""Workers: find runnable runs in the log, claim their leases, and drive them.

A worker follows the store's notification log (:class:`RunIndex`) to know which runs are
unfinished and not waiting for a person, claims each one's lease
(:mod:`saga.store.leases`) and drives it with an executor. A run whose worker died is
taken over once its lease expires: the attempts it left ``running`` are interrupted (see
:func:`saga.scheduler.interrupted`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from saga.domain import TERMINAL, RunStatus, event_name, status_after
from saga.errors import ConcurrentWriteError, LeaseLostError, SagaError
from saga.executor import Executor
from saga.store.application import SagaApplication
from saga.store.leases import Leases, default_worker_id

log = logging.getLogger("saga.worker")


@dataclass
class RunIndex:
    """Unfinished runs, followed from the notification log by topic (cheap: payloads are
    read only for approvals)."""

    app: SagaApplication
    position: int = 0
    runs: dict[str, RunStatus] = field(default_factory=dict)  # run id -> status
    approvals: dict[str, int] = field(default_factory=dict)  # run id -> undecided count

    def refresh(self) -> None:
        """Read the log since the last refresh."""
        while True:
            page = self.app.recorder.select_notifications(start=self.position + 1, limit=1000)
            for n in page:
                if event_name(n.topic) == "RunStarted" and _has_parent(n.state):
                    continue  # a child run is driven by its parent's step, never on its own
                self._apply(str(n.originator_id), n.topic)
            if page:
                self.position = page[-1].id
            if len(page) < 1000:
                return

    def _apply(self, run_id: str, topic: str) -> None:
        kind = event_name(topic)
        if kind != "RunStarted" and run_id not in self.runs:
            return  # not a run this index follows (e.g. a child run)
        if kind == "ApprovalRequested":
            self.approvals[run_id] = self.approvals.get(run_id, 0) + 1
        elif kind in ("ApprovalGranted", "ApprovalRejected"):
            self.approvals[run_id] = self.approvals.get(run_id, 0) - 1
        self.runs[run_id] = status_after(kind, self.runs.get(run_id, "running"),
                                         still_waiting=self.approvals.get(run_id, 0) > 0)

    def runnable(self) -> list[str]:
        """Unfinished runs not waiting only for a person, oldest first."""
        return [run_id for run_id, status in self.runs.items()
                if status not in TERMINAL and status != "waiting"]


def _has_parent(state: bytes) -> bool:
    try:
        return bool(json.loads(state).get("context", {}).get("parent"))
    except (ValueError, AttributeError):
        return False


class Worker:
    """Claims runnable runs and drives up to ``concurrency`` of them at once."""

    def __init__(self, app: SagaApplication, leases: Leases,
                 executor: Callable[[str], Executor], *, worker_id: str | None = None,
                 lease_seconds: float = 30.0, concurrency: int = 4,
                 poll_interval: float = 0.5) -> None:
        """``executor(worker_id)`` makes the executor a drive uses (closed after it)."""
        self.app = app
        self.leases = leases
        self.make_executor = executor
        self.worker_id = worker_id or default_worker_id()
        self.lease_seconds = lease_seconds
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.index = RunIndex(app)
        self.driven = 0

    def run(self, *, until_idle: bool = False, stop: Callable[[], bool] | None = None) -> int:
        """Work until ``stop()`` says so (or, with ``until_idle``, nothing is runnable);
        returns how many drives ended."""
        return asyncio.run(self._run(until_idle, stop or (lambda: False)))

    async def _run(self, until_idle: bool, stop: Callable[[], bool]) -> int:
        leases = self.leases
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
        lease = self.leases.lease(run_id, self.worker_id, self.lease_seconds)
        try:
            run = self.app.get_run(run_id)
            if not run.is_finished:
                executor = self.make_executor(self.worker_id)
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
