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
from datetime import UTC, datetime, timedelta
from typing import Any

from saga.domain import DECISIONS, TERMINAL, RunStatus, event_name, status_after, step_key
from saga.errors import ConcurrentWriteError, LeaseLostError, SagaError, StoreUnavailableError
from saga.executor import Executor
from saga.store.application import SagaApplication
from saga.store.leases import Leases, default_worker_id
from saga.store.reconnect import backoff

log = logging.getLogger("saga.worker")

#: The longest wait a worker's drive waits out in process (seconds): a longer timer,
#: retry backoff or signal timeout releases the run, and any worker takes it up when due.
WORKER_HOLD = 1.0


@dataclass
class _Followed:
    """What the index knows of one unfinished run."""

    status: RunStatus = "running"
    approvals: int = 0  # requested and not yet decided
    waits: dict[str, str | None] = field(default_factory=dict)  # step key -> until
    retries: dict[str, str] = field(default_factory=dict)  # step key -> next retry time
    nudged: bool = True  # something happened that a driver should look at
    deadline: str | None = None  # when the run times out, if it has a timeout
    takeovers: int = 0  # attempts of it a dead worker left behind: a suspect if above 0


@dataclass
class RunIndex:
    """Unfinished runs, followed from the notification log: their status by topic, and
    (reading those events' payloads) when their timers and retries are due, so a run that
    only waits holds no worker and is not claimed before its time."""

    app: SagaApplication
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    position: int = 0
    runs: dict[str, _Followed] = field(default_factory=dict)
    children: set[str] = field(default_factory=set)

    def refresh(self) -> None:
        """Read the log since the last refresh."""
        while True:
            page = self.app.notifications(self.position + 1, 1000)
            for n in page:
                if event_name(n.topic) == "RunStarted" and _has_parent(n.state):
                    self.children.add(str(n.originator_id))
                    continue  # a child run is driven by its parent's step, never on its own
                self._apply(str(n.originator_id), n.topic, n.state)
            if page:
                self.position = page[-1].id
            if len(page) < 1000:
                return

    def _apply(self, run_id: str, topic: str, state: bytes) -> None:
        kind = event_name(topic)
        if kind == "RunStarted":
            self.runs[run_id] = _Followed(deadline=_deadline(_payload(state)))
        elif kind in _REOPENING and run_id not in self.runs and run_id not in self.children:
            self.runs[run_id] = _Followed(status="failed")  # a finished run taken up again
        run = self.runs.get(run_id)
        if run is None:
            return  # not a run this index follows (e.g. a child run)
        if kind in ("RunTimedOut", "CompensationStarted"):
            run.deadline = None
        if kind == "ApprovalRequested":
            run.approvals += 1
            until = _payload(state).get("until")
            if until:  # a confirmation with a timeout: its default applies then
                run.waits["approval:" + str(_payload(state).get("step_id"))] = str(until)
        elif kind in DECISIONS:
            run.approvals -= 1
            run.waits.pop("approval:" + str(_payload(state).get("step_id")), None)
        elif kind in ("StepWaiting", "StepFailed", "StepStarted", "StepCompleted",
                      "StepSkipped"):
            payload = _payload(state)
            key = step_key(str(payload.get("step_id")), int(payload.get("iteration") or 0))
            run.waits.pop(key, None)
            run.retries.pop(key, None)
            if kind == "StepWaiting":
                run.waits[key] = payload.get("until")
            elif kind == "StepFailed" and payload.get("next_retry_at"):
                run.retries[key] = str(payload["next_retry_at"])
        elif kind == "RunTakenOver":
            run.takeovers += 1
        elif kind in ("RunRetried", "CompensationStarted"):
            run.retries.clear()
        run.status = status_after(kind, run.status,
                                  still_waiting=run.approvals > 0 or bool(run.waits))
        run.nudged = run.nudged or kind not in _QUIET
        if run.status in TERMINAL:
            del self.runs[run_id]

    def runnable(self) -> list[str]:
        """Unfinished runs a driver can move on now, oldest first: not paused, and not
        only waiting (for a person, a signal, or a timer or retry still to come) unless
        something happened since a driver last looked (a signal, a decision, unpausing)."""
        now = self.clock().isoformat()
        ready = []
        for run_id, run in self.runs.items():
            if run.status == "paused":
                continue
            due = any(t is not None and t <= now
                      for t in [*run.waits.values(), *run.retries.values(), run.deadline])
            idle = run.status == "waiting" or bool(run.waits) or bool(run.retries)
            if due or run.nudged or not idle:
                ready.append(run_id)
        return ready

    def claimed(self, run_id: str) -> None:
        """A driver took the run: what happened so far is being looked at."""
        if run_id in self.runs:
            self.runs[run_id].nudged = False


#: Events that take a finished run up again.
_REOPENING = frozenset({"RunRetried", "CompensationStarted"})
#: Events a driver records while it drives: they need no other driver's attention.
_QUIET = frozenset({"StepStarted", "StepWaiting", "StepFailed", "StepCompleted",
                    "StepSkipped", "HealStarted", "RemedyApplied", "StepCompensated",
                    "CompensationFailed", "ApprovalRequested"})


def _deadline(started: dict[str, Any]) -> str | None:
    """A run's deadline from its ``RunStarted`` payload (its ``timeout`` option)."""
    seconds = (started.get("options") or {}).get("timeout")
    stamp = started.get("timestamp")
    when = stamp.get("_data_") if isinstance(stamp, dict) else stamp
    if not seconds or not isinstance(when, str):
        return None
    return (datetime.fromisoformat(when) + timedelta(seconds=float(seconds))).isoformat()


def _payload(state: bytes) -> dict[str, Any]:
    try:
        value = json.loads(state)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


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
                 poll_interval: float = 0.5, tick: Callable[[], Any] | None = None) -> None:
        """``executor(worker_id)`` makes the executor a drive uses (closed after it);
        ``tick()`` runs each time the worker looks for work (firing due schedules)."""
        self.tick = tick
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
        active: dict[str, asyncio.Task[None]] = {}
        failures = 0  # rounds in a row that found the store unreachable
        while not stop():
            try:
                claimed = self._look(active)
            except StoreUnavailableError as e:
                # Each store call already rode out what it could; wait, then look again.
                failures += 1
                if failures == 1:
                    log.warning("worker %s: %s; retrying with backoff", self.worker_id, e)
                await self._pause(active, backoff(failures))
                continue
            if failures:
                log.warning("worker %s: the store is back", self.worker_id)
                failures = 0
            if until_idle and not active and not claimed:
                break
            await self._pause(active, self.poll_interval)
        for task in active.values():
            task.cancel()
        return self.driven

    def _look(self, active: dict[str, asyncio.Task[None]]) -> int:
        """One look for work: fire due schedules, follow the log, claim what is runnable
        (up to ``concurrency`` drives); how many runs were claimed."""
        if self.tick is not None:
            try:
                self.tick()
            except StoreUnavailableError:
                raise
            except Exception:  # a broken schedule must not stop the worker's runs
                log.exception("firing due schedules failed")
        self.index.refresh()
        for run_id, task in list(active.items()):
            if task.done():
                active.pop(run_id)
        claimed = 0
        for run_id in self.index.runnable():
            if len(active) >= self.concurrency or any(self._suspect(r) for r in active):
                break
            if self._suspect(run_id) and active:
                continue  # a run its workers died under is driven alone: if it kills
                # this worker too, no innocent run dies with it and counts a takeover
            if run_id in active or not self.leases.claim(run_id, self.worker_id,
                                                         self.lease_seconds):
                continue
            claimed += 1
            self.index.claimed(run_id)
            active[run_id] = asyncio.ensure_future(self._drive(run_id))
        return claimed

    @staticmethod
    async def _pause(active: dict[str, asyncio.Task[None]], seconds: float) -> None:
        """Wait ``seconds``, or less if a drive ends first."""
        if active:
            await asyncio.wait(list(active.values()), timeout=seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(seconds)

    def _suspect(self, run_id: str) -> bool:
        followed = self.index.runs.get(run_id)
        return followed is not None and followed.takeovers > 0

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
        except StoreUnavailableError as e:  # taken up again once the store is back
            log.warning("run %s: %s; it will be driven again", run_id, e)
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
