"""Workers: find runnable runs in the log, claim their leases, and drive them.

A worker follows the store's notification log (:class:`RunIndex`) to know which runs are
unfinished and not waiting for a person, claims each one's lease
(:mod:`saga.store.leases`) and drives it with an executor. A run whose worker died is
taken over once its lease expires: the attempts it left ``running`` are interrupted (see
:func:`saga.scheduler.interrupted`).

Runs are claimed by priority (highest first), then age (oldest first), each from the
queue its ``RunStarted`` names and within that queue's limits (saga.toml
``[queues.NAME]``), which :meth:`~saga.store.leases.Leases.claim_queued` keeps across
every worker together. A run whose queue is at a limit is left for a later look.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import Any

from saga.config import QueueLimit
from saga.domain import (
    DECISIONS,
    DEFAULT_QUEUE,
    TERMINAL,
    Run,
    RunStatus,
    event_name,
    priority_of,
    queue_of,
    run_uuid,
    status_after,
    step_key,
)
from saga.errors import ConcurrentWriteError, LeaseLostError, SagaError, StoreUnavailableError
from saga.executor import TOOL_THREADS, Executor, ToolThreads
from saga.store.application import SagaApplication
from saga.store.group_commit import GroupCommit
from saga.store.leases import Claim, Leases, default_worker_id
from saga.store.partitions import part_for, parts_of
from saga.store.reconnect import backoff
from saga.telemetry import metrics

log = logging.getLogger("saga.worker")

#: The longest wait a worker's drive waits out in process (seconds): a longer timer,
#: retry backoff or signal timeout releases the run, and any worker takes it up when due.
WORKER_HOLD = 1.0
#: A run another worker holds is tried again after this long at the latest (seconds),
#: though its lease runs longer: a worker that stops gives its runs up before then.
HELD_RECHECK = 5.0
#: Claims a look makes at most: after the first, only if other workers held some of the
#: runs it wanted (the next runs in the order are tried instead).
CLAIM_ROUNDS = 4
#: After a lost claim, how many of the next runs in the order a look asks the holders of
#: too: a fleet's workers all start from the same oldest runs, and one question skips
#: those the others drive where a lost claim each would (see ``Worker._look``).
LOOK_AHEAD = 32


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
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    started: float = 0.0  # when it was started (POSIX time): older runs are claimed first
    begun: bool = False  # a driver recorded something: claiming it again starts nothing
    seen: int = 0  # when the index first saw it: the last tie-break of the claim order
    #: Another worker holds its lease: not claimed here before then (ISO; the lease's
    #: expiry or HELD_RECHECK on, whichever is sooner), unless something other than its
    #: driving happens to it, or its own time comes.
    held_until: str | None = None


def _times(run: _Followed) -> list[str]:
    """When the run's own waits, retries and deadline come due (ISO)."""
    return [t for t in [*run.waits.values(), *run.retries.values(), run.deadline]
            if t is not None]


def _followed(started: dict[str, Any], **kwargs: Any) -> _Followed:
    """What the index follows of a run, from its ``RunStarted`` payload."""
    options = started.get("options") or {}
    when = _stamp(started)
    return _Followed(deadline=_deadline(started), queue=queue_of(options,
                                                                  started.get("definition")),
                     priority=priority_of(options),
                     started=datetime.fromisoformat(when).timestamp() if when else 0.0,
                     **kwargs)


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
    #: The positions in the logs of a partitioned store's other partitions (each has its
    #: own log; ``position`` is the first's), by partition index.
    positions: dict[int, int] = field(default_factory=dict)
    # Kept as the log is applied, so a look costs what changed, not the backlog: the
    # runnable runs' claim order (priority, age, then when the index first saw them),
    # and a heap of the others' next due times (see _place).
    _ready: list[tuple[int, float, int, str]] = field(default_factory=list)
    _keys: dict[str, tuple[int, float, int, str]] = field(default_factory=dict)
    _due: list[tuple[str, str]] = field(default_factory=list)
    _wakes: dict[str, str] = field(default_factory=dict)
    _seen: int = 0  # runs the index has begun to follow

    def refresh(self) -> None:
        """Read the log (of every partition) since the last refresh."""
        for index, app in enumerate(parts_of(self.app)):
            position = self.position if index == 0 else self.positions.get(index, 0)
            while True:
                page = app.notifications(position + 1, 1000)
                for n in page:
                    self._apply(str(n.originator_id), n.topic, n.state)
                if page:
                    position = page[-1].id
                    if index == 0:
                        self.position = position
                    else:
                        self.positions[index] = position
                if len(page) < 1000:
                    break

    def _apply(self, run_id: str, topic: str, state: bytes) -> None:
        kind = event_name(topic)
        followed = self.runs.get(run_id)
        seen = followed.seen if followed is not None else 0  # a replaced entry keeps it
        if kind == "RunStarted":
            started = _payload(state)
            context = started.get("context")
            if isinstance(context, dict) and context.get("parent"):
                self.children.add(run_id)
                return  # a child run is driven by its parent's step, never alone
            self.runs[run_id] = _followed(started)
        elif kind in _REOPENING and run_id not in self.runs and run_id not in self.children:
            # a finished run taken up again
            self.runs[run_id] = _followed(self._started(run_id), status="failed", begun=True)
        run = self.runs.get(run_id)
        if run is None:
            return  # not a run this index follows (e.g. a child run)
        if not seen:
            self._seen += 1
            seen = self._seen
        run.seen = seen
        run.begun = run.begun or kind in _BEGUN
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
        elif kind in ("StepWaiting", "StepFailed") or (
                kind in ("StepStarted", "StepCompleted", "StepSkipped")
                and (run.waits or run.retries)):  # else nothing to clear: not parsed
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
        if kind not in _QUIET:
            run.held_until = None
        if run.status in TERMINAL:
            del self.runs[run_id]
        self._place(run_id)

    def _started(self, run_id: str) -> dict[str, Any]:
        """The ``RunStarted`` payload of a run started before this index's position."""
        stored = part_for(self.app, run_id).recorder.select_events(run_uuid(run_id), lte=1)
        return _payload(stored[0].state) if stored else {}

    def runnable(self) -> list[str]:
        """Unfinished runs a driver can move on now, by priority (highest first), then
        oldest first: not paused, and not only waiting (for a person, a signal, or a timer
        or retry still to come) unless something happened since a driver last looked (a
        signal, a decision, unpausing)."""
        now = self.clock().isoformat()
        while self._due and self._due[0][0] <= now:  # waits come due: runnable till changed
            wake, run_id = heapq.heappop(self._due)
            if self._wakes.get(run_id) == wake:
                del self._wakes[run_id]
                run = self.runs[run_id]
                if run.held_until is not None:  # its holder's lease, or its own time, is up
                    run.held_until = None
                    self._place(run_id)
                else:
                    self._enter(run_id)
        return [key[3] for key in self._ready]

    def claimed(self, run_id: str) -> None:
        """A driver took the run: what happened so far is being looked at."""
        if run_id in self.runs:
            self.runs[run_id].nudged = False
            self.runs[run_id].held_until = None
            self._place(run_id)

    def held(self, run_id: str, until: str) -> None:
        """Another worker holds the run's lease until ``until`` (ISO): it is not runnable
        here before then, unless an event other than its driver's own (a signal, a
        pause, a takeover) comes first, or its own timer or retry comes due. Without
        this, every worker of a fleet would try the same oldest runs on every look, and
        all but one would find nothing to do."""
        run = self.runs.get(run_id)
        if run is not None:
            run.held_until = until
            self._place(run_id)

    def _place(self, run_id: str) -> None:
        """File a run after a change: runnable (claim order), waiting for a time (the
        heap: due when the earliest of its waits, retries and deadline passes), or
        neither (paused, finished, or waiting for a person or a signal alone)."""
        key = self._keys.pop(run_id, None)
        if key is not None:
            del self._ready[bisect.bisect_left(self._ready, key)]
        self._wakes.pop(run_id, None)  # its heap entry, if any, is skipped when popped
        run = self.runs.get(run_id)
        if run is None or run.status == "paused":
            return
        if run.held_until is not None:
            # Looked at again when the holder's lease is up, or sooner when the run's
            # own time comes (its holder may have let it go, waiting, and stopped); a
            # time already past does not count (else each claim round of a look would
            # try the run again at once).
            now = self.clock().isoformat()
            self._wake(run_id, [run.held_until, *(t for t in _times(run) if t > now)])
            return
        idle = run.status == "waiting" or bool(run.waits) or bool(run.retries)
        if run.nudged or not idle:
            self._enter(run_id)
            return
        self._wake(run_id, _times(run))

    def _wake(self, run_id: str, times: list[str]) -> None:
        """File a run in the heap, due at the earliest of ``times`` (none: not at all)."""
        if times:
            self._wakes[run_id] = min(times)
            heapq.heappush(self._due, (self._wakes[run_id], run_id))

    def _enter(self, run_id: str) -> None:
        run = self.runs[run_id]
        key = self._keys[run_id] = (-run.priority, run.started, run.seen, run_id)
        bisect.insort(self._ready, key)


#: Events that take a finished run up again.
_REOPENING = frozenset({"RunRetried", "CompensationStarted"})
#: Events a driver records while it drives: they need no other driver's attention.
_QUIET = frozenset({"StepStarted", "StepWaiting", "StepFailed", "StepCompleted",
                    "StepSkipped", "HealStarted", "RemedyApplied", "StepCompensated",
                    "CompensationFailed", "ApprovalRequested"})
#: Events after which claiming a run no longer starts it (a queue's rate counts starts).
_BEGUN = _QUIET | {"RunTakenOver", "CompensationStarted", "RunRetried", "RunTimedOut"}


def _stamp(started: dict[str, Any]) -> str | None:
    """When a run was started, from its ``RunStarted`` payload (ISO)."""
    stamp = started.get("timestamp")
    when = stamp.get("_data_") if isinstance(stamp, dict) else stamp
    return when if isinstance(when, str) else None


def _deadline(started: dict[str, Any]) -> str | None:
    """A run's deadline from its ``RunStarted`` payload (its ``timeout`` option)."""
    seconds, when = (started.get("options") or {}).get("timeout"), _stamp(started)
    if not seconds or when is None:
        return None
    return (datetime.fromisoformat(when) + timedelta(seconds=float(seconds))).isoformat()


def _payload(state: bytes) -> dict[str, Any]:
    try:
        value = json.loads(state)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Worker:
    """Claims runnable runs and drives up to ``concurrency`` of them at once."""

    def __init__(self, app: SagaApplication, leases: Leases,
                 executor: Callable[[str, ToolThreads], Executor], *,
                 worker_id: str | None = None,
                 lease_seconds: float = 30.0, concurrency: int = 4,
                 poll_interval: float = 0.5, tick: Callable[[], Any] | None = None,
                 queues: Mapping[str, QueueLimit] | None = None) -> None:
        """``executor(worker_id, threads)`` makes the executor a drive uses (closed after
        it; its tools run in ``threads``, shared by the worker's drives);
        ``tick()`` runs each time the worker looks for work (firing due schedules);
        ``queues``: the limits of queues (saga.toml ``[queues.NAME]``)."""
        self.tick = tick
        self._next_tick = 0.0  # when schedules are looked at next (monotonic)
        self.queues = dict(queues or {})
        self.app = app
        self.leases = leases
        self.make_executor = executor
        self.worker_id = worker_id or default_worker_id()
        self.lease_seconds = lease_seconds
        self.concurrency = concurrency
        self.poll_interval = poll_interval
        self.index = RunIndex(app)
        self.driven = 0
        #: The appends of every run this worker drives at once share a commit.
        self.group = GroupCommit(app)
        #: As many tool threads for all drives as each drive had of its own.
        self.threads = ToolThreads(TOOL_THREADS * concurrency)
        #: Runs whose drive ended, whose leases the next look gives up (appended on the
        #: event loop, taken in the look's thread).
        self._ended: deque[str] = deque()
        #: The runs a look claimed, read together in its thread, taken by their drives.
        self._loaded: dict[str, Run] = {}
        self._stopping: asyncio.Event | None = None
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None

    def run(self, *, until_idle: bool = False, stop: Callable[[], bool] | None = None) -> int:
        """Work until ``stop()`` says so (or, with ``until_idle``, nothing is runnable);
        returns how many drives ended.

        Once ``stop()`` is true the worker claims nothing more, and its drives finish the
        calls they have in flight, record them and end (see
        :class:`saga.executor.drive.Drive`); :meth:`halt` cuts that short."""
        try:
            return asyncio.run(self._run(until_idle, stop or (lambda: False)))
        except asyncio.CancelledError:  # halted
            return self.driven
        finally:
            self._running = None
            self.threads.close()

    def halt(self) -> None:
        """Stop at once, from a signal handler or another thread: the drives are
        cancelled, and each gives its run's lease up once the calls it gave up on have
        returned from their threads."""
        running = self._running
        if running is not None:
            loop, task = running
            loop.call_soon_threadsafe(task.cancel)

    async def _run(self, until_idle: bool, stop: Callable[[], bool]) -> int:
        active: dict[str, asyncio.Task[None]] = {}
        failures = 0  # rounds in a row that found the store unreachable
        raced = 0  # looks in a row that lost every claim to other workers
        self._stopping = asyncio.Event()
        me = asyncio.current_task()
        assert me is not None
        self._running = (asyncio.get_running_loop(), me)
        try:
            while not stop():
                for run_id, task in list(active.items()):
                    if task.done():
                        active.pop(run_id)
                try:
                    # In a thread while runs are driven: each call rides out an outage of the
                    # store for up to reconnect_seconds, while the loop drives those runs
                    # (their steps, lease renewals). With none, a hand-off costs a claim's CPU.
                    started, held, lost_all = await asyncio.to_thread(
                        self._look, set(active)) if active else self._look(set())
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
                for run_id in started:
                    active[run_id] = asyncio.ensure_future(self._drive(run_id))
                claimed = len(started)
                # A run held back only by its queue's rate is work this worker can do itself
                # once the period passes; one held back by a full queue waits for the runs
                # other workers drive, and is not runnable now. A look that lost all its
                # claims to other workers leaves runs to claim: look again at once (the
                # runs lost are skipped a while, so each look tries others; a second such
                # look in a row waits as usual).
                raced = raced + 1 if lost_all else 0
                if until_idle and not active and not claimed and not raced \
                        and "rate" not in held.values():
                    break
                await self._pause(active, 0 if raced == 1 else self.poll_interval)
            if active:  # an operator waiting on a stop is told what it waits for
                log.warning("worker %s stopping: %d runs finish the steps in flight "
                            "(a second signal stops at once)", self.worker_id, len(active))
            self._stopping.set()
            await asyncio.gather(*active.values(), return_exceptions=True)
        finally:
            for task in active.values():
                task.cancel()
            # Their drives end (their leases join the ended), then the leases go.
            await asyncio.gather(*active.values(), return_exceptions=True)
            await asyncio.to_thread(self._release_ended)
        return self.driven

    def _look(self, driving: set[str]) -> tuple[list[str], dict[str, Claim], bool]:
        """One look for work, beside the runs ``driving``: fire due schedules (once per
        poll interval, not on every completion), follow the log, claim what is runnable
        within its queue's limits (up to ``concurrency`` drives); the runs claimed, to be
        driven, the queues found at a limit (full or rate), and whether every round of
        claims was lost to other workers (runs remain to claim)."""
        if self.tick is not None and time.monotonic() >= self._next_tick:
            self._next_tick = time.monotonic() + self.poll_interval
            try:
                self.tick()
            except StoreUnavailableError:
                raise
            except Exception:  # a broken schedule must not stop the worker's runs
                log.exception("firing due schedules failed")
        self._release_ended()
        active = set(driving)  # and those claimed in this look
        started: list[str] = []
        held: dict[str, Claim] = {}
        lost_all = False
        if len(active) < self.concurrency:  # full: nothing could be claimed anyway
            self.index.refresh()
        for round_ in range(CLAIM_ROUNDS):
            runnable = self.index.runnable()
            if round_ == 0:
                metrics.queue_depth(len(runnable))
            wanted: list[str] = []
            for run_id in runnable:
                if len(active) + len(wanted) >= self.concurrency \
                        or any(self._suspect(r) for r in [*active, *wanted]):
                    break
                if self._suspect(run_id) and (active or wanted):
                    continue  # a run its workers died under is driven alone: if it kills
                    # this worker too, no innocent run dies with it and counts a takeover
                if run_id in active:
                    continue
                queue, limit, start = self._queue_of(run_id)
                if limit is None or not limit.limited:
                    wanted.append(run_id)  # claimed with the others, in one commit
                    continue
                outcome = self._claim(run_id, queue, limit, start, held)
                if outcome == "claimed":
                    self.index.claimed(run_id)
                    active.add(run_id)
                    started.append(run_id)
                elif outcome == "held":
                    self._held_elsewhere([run_id])
            queues: list[str | None] = [self._queue_of(r)[0] for r in wanted]
            claimed = self.leases.claim_many(wanted, self.worker_id, self.lease_seconds,
                                             queues)
            for run_id in claimed:
                self.index.claimed(run_id)
                active.add(run_id)
                started.append(run_id)
            lost = set(wanted).difference(claimed)
            # Runs other workers drive: skipped for a while (see _held_elsewhere), with
            # those next in the order that others hold too, and the next runs tried at
            # once (else this look would claim nothing). Lost runs whose holders let go
            # before we asked have ended, most likely: the log shows it (else they are
            # tried again).
            if not lost:
                break
            ahead = islice((r for r in self.index.runnable()
                            if r not in active and r not in lost), LOOK_AHEAD)
            if not lost.intersection(self._held_elsewhere([*lost, *ahead])):
                self.index.refresh()
        else:
            lost_all = not started
        if started:
            self._load(started)
        return started, held, lost_all

    def _load(self, run_ids: list[str]) -> None:
        """Read the runs just claimed in one round trip, for their drives to take."""
        try:
            runs = self.app.get_runs(run_ids)
        except Exception as e:  # each drive reads its own run then, and reports it
            # Not quiet: a read that always fails costs every drive a read of its own.
            log.warning("could not read the %d runs claimed together (each drive reads "
                        "its own): %s", len(run_ids), e)
            runs = {}
        for run_id in run_ids:  # never a copy an earlier look left behind
            if run_id in runs:
                self._loaded[run_id] = runs[run_id]
            else:
                self._loaded.pop(run_id, None)

    def _held_elsewhere(self, run_ids: list[str]) -> set[str]:
        """Note in the index the runs whose leases other workers hold; which they are."""
        now = self.leases.clock()
        noted: set[str] = set()
        for run_id, (worker, expires) in self.leases.holders(run_ids).items():
            if worker != self.worker_id and expires >= now:  # as a claim sees it
                until = min(expires, now + HELD_RECHECK)
                self.index.held(run_id, datetime.fromtimestamp(until, UTC).isoformat())
                noted.add(run_id)
        return noted

    def _release_ended(self) -> None:
        """Give up the leases of the drives that ended since the last call."""
        ended: list[str] = []
        while self._ended:
            ended.append(self._ended.popleft())
        try:
            self.leases.release_many(ended, self.worker_id)
        except Exception:  # the leases expire anyway
            log.warning("could not release the leases on %s", ", ".join(ended))

    @staticmethod
    async def _pause(active: dict[str, asyncio.Task[None]], seconds: float) -> None:
        """Wait ``seconds``, or less if a drive ends first."""
        if active:
            await asyncio.wait(list(active.values()), timeout=seconds,
                               return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(seconds)

    def _queue_of(self, run_id: str) -> tuple[str, QueueLimit | None, bool]:
        """A run's queue, that queue's limits, and whether claiming it starts the run."""
        followed = self.index.runs.get(run_id)
        queue = followed.queue if followed is not None else DEFAULT_QUEUE
        return queue, self.queues.get(queue), followed is None or not followed.begun

    def _claim(self, run_id: str, queue: str, limit: QueueLimit, start: bool,
               held: dict[str, Claim]) -> Claim:
        """Claim a run's lease within its queue's limits (``held``: the queues found at a
        limit in this look, which are not asked again until the next)."""
        if held.get(queue) == "full" or (start and held.get(queue) == "rate"):
            return held[queue]
        outcome = self.leases.claim_queued(run_id, self.worker_id, self.lease_seconds, queue,
                                           limit, start=start)
        if outcome in ("full", "rate"):
            held[queue] = outcome
        return outcome

    def _suspect(self, run_id: str) -> bool:
        followed = self.index.runs.get(run_id)
        return followed is not None and followed.takeovers > 0

    async def _drive(self, run_id: str) -> None:
        lease = self.leases.lease(run_id, self.worker_id, self.lease_seconds)
        loop = asyncio.get_running_loop()
        try:
            run = self._loaded.pop(run_id, None)
            if run is None:  # the look could not read it: in a thread, as the loop drives
                run = await loop.run_in_executor(None, self.app.get_run, run_id)
            if not run.is_finished:
                executor = self.make_executor(self.worker_id, self.threads)
                executor.group = self.group
                executor.stopping = self._stopping
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
            # Given up with the others that ended by the next look, in one statement,
            # before that look claims anything (so a queue's limits count it free).
            self._ended.append(run_id)
