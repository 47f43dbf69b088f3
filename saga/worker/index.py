"""The index a worker keeps of the unfinished runs, followed from the notification log.

Each worker reads the log (of every partition) since its last look and keeps, per run it
follows, what a claim needs: its status by event, its queue and priority, and (reading
those events' payloads) when its timers, retries and deadline come due, so a run that
only waits holds no worker and is not claimed before its time. The claim order is kept as
the log is applied, so a look costs what changed, not the backlog. Child runs are left
out: a parent's step drives them.
"""

from __future__ import annotations

import bisect
import heapq
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from saga.domain import (
    DECISIONS,
    DEFAULT_QUEUE,
    TERMINAL,
    RunStatus,
    event_name,
    priority_of,
    queue_of,
    run_uuid,
    status_after,
    step_key,
)
from saga.store.application import SagaApplication
from saga.store.partitions import part_for, parts_of
from saga.worker import pools


@dataclass
class _Followed:
    """What the index knows of one unfinished run."""

    status: RunStatus = "running"
    approvals: int = 0  # requested and not yet decided
    waits: dict[str, str | None] = field(default_factory=dict)  # step key -> until
    retries: dict[str, str] = field(default_factory=dict)  # step key -> next retry time
    nudged: bool = True  # something happened that a driver should look at
    deadline: str | None = None  # when the run times out, if it has a timeout
    #: Takeovers since a step of it last completed: a suspect, driven alone, if above 0
    #: (as ``Run.suspect``).
    takeovers: int = 0
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    started: float = 0.0  # when it was started (POSIX time): older runs are claimed first
    begun: bool = False  # a driver recorded something: claiming it again starts nothing
    seen: int = 0  # when the index first saw it: the last tie-break of the claim order
    #: Another worker holds its lease: not claimed here before then (ISO; the lease's
    #: expiry or HELD_RECHECK on, whichever is sooner), unless something other than its
    #: driving happens to it, or its own time comes.
    held_until: str | None = None
    version: int = 0  # of its last event the index has read
    #: The pools its steps wait for, by step key (see saga.worker.pools).
    pools: dict[str, str | None] = field(default_factory=dict)


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
    #: Each child run's parent: news of a child (a decision, a signal) is its parent's.
    parents: dict[str, str] = field(default_factory=dict)
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
    #: Runs not runnable until the next refresh (see :meth:`park`).
    _parked: set[str] = field(default_factory=set)
    #: Whether the worker runs a step of a pool (None: an unpooled step); a run that
    #: waits only for pools it does not serve is not runnable here (None: every run is).
    serves: pools.Serves | None = None

    def refresh(self) -> None:
        """Read the log (of every partition) since the last refresh."""
        self._parked.clear()  # what happened to them is read now
        for index, app in enumerate(parts_of(self.app)):
            position = self.position if index == 0 else self.positions.get(index, 0)
            while True:
                page = app.log_rows(position + 1, 1000)
                for _, run_id, version, topic, state in page:
                    self._apply(run_id, topic, state, version)
                if page:
                    position = page[-1][0]
                    if index == 0:
                        self.position = position
                    else:
                        self.positions[index] = position
                if len(page) < 1000:
                    break

    def _apply(self, run_id: str, topic: str, state: bytes, version: int = 0) -> None:
        kind = event_name(topic)
        followed = self.runs.get(run_id)
        if kind == "StepCompleted" and followed is not None and followed.takeovers:
            followed.takeovers = 0  # it moves on: no longer a suspect (Run.suspect)
        if kind in _MOVES and followed is not None and followed.seen \
                and not (followed.waits or followed.retries or followed.pools) \
                and followed.status != "waiting":
            # A step moving in a run that waits for nothing leaves it where it is: most of
            # a fleet's log (each worker follows every other's steps). All the rest of this
            # method would do is mark it begun.
            followed.begun = True
            followed.version = version
            return
        seen = followed.seen if followed is not None else 0  # a replaced entry keeps it
        if kind == "RunStarted":
            started = _payload(state)
            context = started.get("context")
            if isinstance(context, dict) and context.get("parent"):
                self.children.add(run_id)
                parent = context["parent"]
                if isinstance(parent, dict) and parent.get("run_id"):
                    self.parents[run_id] = str(parent["run_id"])
                return  # a child run is driven by its parent's step, never alone
            self.runs[run_id] = _followed(started)
        elif run_id in self.children:
            if kind in _CHILD_NEWS:
                self._nudge(self.parents.get(run_id))
            return
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
        run.version = version
        run.begun = run.begun or kind in _BEGUN
        pools.follow(run.pools, kind, lambda: _payload(state), _QUIET)
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
                kind in _MOVES and (run.waits or run.retries)):  # else nothing to clear: not parsed
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
        elif kind in ("RunRetried", "CompensationStarted", "RunReset"):
            run.retries.clear()
        run.status = status_after(kind, run.status,
                                  still_waiting=run.approvals > 0 or bool(run.waits))
        run.nudged = run.nudged or kind not in _QUIET
        if kind not in _QUIET:
            run.held_until = None
        if run.status in TERMINAL:
            del self.runs[run_id]
        self._place(run_id)

    def _nudge(self, run_id: str | None) -> None:
        """Something happened to a child of this run (approved, signalled, unpaused) that
        its waiting parent's driver should look at: it drives the child on."""
        if run_id is None:
            return
        run = self.runs.get(run_id)
        if run is None:
            if run_id in self.parents:  # a grandchild's news is its grandparent's
                self._nudge(self.parents[run_id])
            return
        run.nudged = True
        run.held_until = None
        self._place(run_id)

    def _started(self, run_id: str) -> dict[str, Any]:
        """The ``RunStarted`` payload of a run started before this index's position."""
        stored = part_for(self.app, run_id).recorder.select_events(run_uuid(run_id), lte=1)
        return _payload(stored[0].state) if stored else {}

    def versions(self, run_ids: list[str]) -> list[int] | None:
        """The version of the last event read of each of these runs (which the index
        follows), for a claim to pass over one that has ended since; ``None`` over
        partitions, whose runs are not all beside the leases."""
        if len(parts_of(self.app)) != 1:
            return None
        return [self.runs[r].version for r in run_ids]

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
        if self._parked:
            return [key[3] for key in self._ready if key[3] not in self._parked]
        return [key[3] for key in self._ready]

    def awaits_served(self, run_id: str) -> bool:
        """Whether the run waits for a pool the worker serves (saga.worker.pools)."""
        followed = self.runs.get(run_id)
        return followed is not None and bool(pools.served(followed.pools, self.serves))

    def queue_of(self, run_id: str) -> str:
        """The queue a run is claimed from (``default`` for a run not followed)."""
        followed = self.runs.get(run_id)
        return followed.queue if followed is not None else DEFAULT_QUEUE

    def park(self, run_id: str) -> None:
        """The run is not runnable until the next refresh: a drive of it here has just
        ended, or a claim found it ended or taken since the index read the log, and
        the index has not read what happened yet (a refresh that stops short of it,
        below the readers' horizon, offers it again: its drive then finds it so)."""
        self._parked.add(run_id)

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
        if pools.served(run.pools, self.serves) is False:  # for another pool's workers
            now = self.clock().isoformat()
            self._wake(run_id, [t for t in _times(run) if t > now])
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


#: What happens to a child run from outside its parent's drive: its parent is to look.
_CHILD_NEWS = DECISIONS | {"SignalReceived", "RunUnpaused", "CompensationStarted",
                           "RunRetried", "RunReset", "DefinitionMigrated"}
#: Events that take a finished run up again.
_REOPENING = frozenset({"RunRetried", "CompensationStarted", "RunReset"})
#: Events a driver records while it drives: they need no other driver's attention.
_QUIET = frozenset({"StepStarted", "StepWaiting", "StepFailed", "StepCompleted",
                    "StepSkipped", "HealStarted", "RemedyApplied", "StepCompensated",
                    "StepCompensationStarted", "StepNotUndone",
                    "CompensationFailed", "ApprovalRequested", "HeartbeatRecorded",
                    "StepWaitingForResource"})
#: A step's moves: they change a run's place only when it waits or retries something.
_MOVES = frozenset({"StepStarted", "StepCompleted", "StepSkipped"})
#: Events after which claiming a run no longer starts it (a queue's rate counts starts).
_BEGUN = _QUIET | {"RunTakenOver", "CompensationStarted", "RunRetried", "RunTimedOut",
                   "RunReset"}


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
