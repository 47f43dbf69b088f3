"""Heartbeats of long calls: a tool's ``ctx.heartbeat(details)``, kept cheaply while the
call runs, recorded once when it ends, and watched against the step's
``heartbeat_timeout``.

- A beat only changes memory (under a lock: tools beat from their threads or inline on
  the event loop). The first beat of a quiet spell schedules a write of the attempt's
  last details to the side table (:mod:`saga.store.heartbeats`), and further beats are
  written at most every :data:`WRITE_EVERY` seconds, so ``saga status`` in another
  process sees them live without an event per beat.
- When the attempt ends, :func:`settle` records the details in force as
  ``HeartbeatRecorded`` right before the event that ends it; a worker taking a run over
  from a dead one copies the dead attempts' rows into the log the same way
  (:func:`recover`) before it records them interrupted. The next attempt of the step
  gets them, from the log, as ``ctx.last_heartbeat``.
- With ``heartbeat_timeout``, :func:`watched` cancels the call when no beat came for that
  long and raises :class:`~saga.errors.HeartbeatTimeout`: an ordinary failed attempt,
  retried by the step's policy. The executor does this (it has the clock); the
  scheduler only sees the recorded failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from saga import secrets
from saga.chain import json_safe
from saga.composition.definition import Step, parse_duration
from saga.domain import Run, step_key
from saga.domain.heartbeats import HeartbeatRecorded
from saga.errors import HeartbeatTimeout
from saga.executor.calls import Outcome
from saga.scheduler import StartStep

if TYPE_CHECKING:
    from saga.executor.calling import ToolCalls

log = logging.getLogger("saga.executor")
T = TypeVar("T")
#: Seconds between two writes of one attempt's beats to the side table.
WRITE_EVERY = 1.0
#: The most JSON text of details kept; larger details are cut to a marked summary.
MAX_DETAILS = 8192
#: Appended to an attempt's slot when its call ended: beats after it are not kept (a
#: first beat then makes nothing; a Beats made meanwhile is closed by attach).
ENDED = "ended"
_MAKING = threading.Lock()


class Beats:
    """The heartbeats of one attempt: the last details, how many beats, and when the
    last came (``last``: this process's monotonic clock, for the timeout)."""

    def __init__(self, write: Callable[[dict[str, Any]], None] | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._write = write
        self._loop = loop
        self._lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._dirty = False
        self._writing = False
        self.closed = False
        self.details: Any = None
        self.count = 0
        self.at: str | None = None  # ISO, the last beat's wall-clock time
        self.last = time.monotonic()  # the attempt's start until a beat comes
        #: Replaces secret values in details with their markers (set once they are known).
        self.conceal: Callable[[Any], Any] = lambda value: value

    def beat(self, details: Any = None) -> None:
        """One beat (``details`` None keeps the last): cheap, from any thread."""
        kept = None if details is None else _bounded(self.conceal(json_safe(details)))
        with self._lock:
            if self.closed:
                return  # an attempt given up on, still running in its thread
            self.count += 1
            self.last = time.monotonic()
            self.at = datetime.now(UTC).isoformat()
            if details is not None:
                self.details = kept
            self._dirty = True
            if self._writing or self._write is None:
                return
            self._writing = True
        try:
            self._loop.call_soon_threadsafe(self._start)
        except RuntimeError:  # its drive's loop is closed: nobody records this attempt now
            self.closed = True

    def snapshot(self) -> dict[str, Any] | None:
        """``{"details", "beats", "at"}`` as of now; None when it never beat."""
        with self._lock:
            if not self.count:
                return None
            return {"details": self.details, "beats": self.count, "at": self.at}

    def close(self) -> dict[str, Any] | None:
        """The attempt ended: no more writes; what it last reported (see snapshot)."""
        with self._lock:
            self.closed = True
        if self._task is not None:
            self._task.cancel()
        return self.snapshot()

    def _start(self) -> None:
        if self.closed:
            return
        self._task = asyncio.ensure_future(self._writes())

    async def _writes(self) -> None:
        """Write the last beat now, then at most every WRITE_EVERY while beats come."""
        assert self._write is not None
        try:
            while True:
                with self._lock:
                    self._dirty = False
                found = self.snapshot()
                if found is not None:
                    await self._loop.run_in_executor(None, self._write, found)
                await asyncio.sleep(WRITE_EVERY)
                with self._lock:
                    if not self._dirty or self.closed:
                        self._writing = False
                        return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the log keeps the last details anyway; only status lags
            log.warning("could not keep a heartbeat: %s", e)
            with self._lock:
                self._writing = False


def _bounded(details: Any) -> Any:
    """Details as plain JSON (what is not JSON as its text: it goes into an event), cut
    short past MAX_DETAILS."""
    text = json.dumps(details, default=str)
    if len(text) <= MAX_DETAILS:
        return json.loads(text)
    return {"_truncated": True, "text": text[:MAX_DETAILS // 2]}


def last_details(run: Run, action: StartStep) -> Any:
    """What an earlier attempt of this step execution last reported (from the log)."""
    state = run.steps.get(step_key(action.step_id, action.iteration)) or {}
    recorded = state.get("heartbeat")
    if recorded is None or recorded["attempt"] >= action.attempt:
        return None
    return recorded["details"]


def beater(drive: ToolCalls, action: StartStep, values: dict[str, str],
           slot: list[Any]) -> Callable[..., None]:
    """``ctx.on_heartbeat`` for a step's attempt about to be called. Its :class:`Beats`
    are made at its first beat (into ``slot``), and only then known to the drive (until
    the attempt is recorded: see attach, settle): most calls never beat, and pay for no
    more than this. The caller appends :data:`ENDED` to ``slot`` when the call ends.
    ``values``: the secrets the call was given, concealed in what it reports."""
    return functools.partial(_beat, drive, action, asyncio.get_running_loop(), values, slot)


def _beat(drive: ToolCalls, action: StartStep, loop: asyncio.AbstractEventLoop,
          values: dict[str, str], slot: list[Any], details: Any = None) -> None:
    beats = slot[0] if slot else _made(drive, action, loop, values, slot)
    if isinstance(beats, Beats):
        beats.beat(details)


def _made(drive: ToolCalls, action: StartStep, loop: asyncio.AbstractEventLoop,
          values: dict[str, str], slot: list[Any]) -> Beats | None:
    with _MAKING:  # two threads of one call may beat first at once
        if not slot:
            slot.append(_new(drive, action, loop, values))
            _in_flight(drive)[(action.step_id, action.iteration, action.attempt)] = slot[0]
    found = slot[0]
    return found if isinstance(found, Beats) else None


def _new(drive: ToolCalls, action: StartStep, loop: asyncio.AbstractEventLoop,
         values: dict[str, str]) -> Beats:
    run_id, key, worker = drive.run.run_id, step_key(action.step_id, action.iteration), \
        drive.x.worker

    def write(found: dict[str, Any]) -> None:
        drive.x.heartbeats.put(run_id, key, action.attempt, found["details"], found["beats"],
                               found["at"], worker)
    beats = Beats(write, loop)
    if values:
        beats.conceal = functools.partial(secrets.conceal, values=values)
    return beats


def _in_flight(drive: ToolCalls) -> dict[tuple[str, int, int], Beats]:
    """The Beats of the drive's attempts that beat, until their outcome is recorded."""
    found: dict[tuple[str, int, int], Beats] | None = drive.beating
    if found is None:
        found = drive.beating = {}
    return found


def attach(drive: ToolCalls, outcome: Outcome) -> Outcome:
    """A step's outcome, with what its attempt last reported: the attempt is over."""
    if not drive.beating:
        return outcome  # (nothing beat: the usual case)
    beats = _in_flight(drive).pop((outcome.step_id, outcome.iteration, outcome.attempt),
                                  None)
    found = None if beats is None else beats.close()
    return outcome if found is None else dataclasses.replace(outcome, heartbeat=found)


def let_go(drive: ToolCalls, step_id: str, iteration: int, attempt: int) -> None:
    """A step's call ended without an outcome (cancelled): its beats stop being kept."""
    if drive.beating:
        beats = _in_flight(drive).pop((step_id, iteration, attempt), None)
        if beats is not None:
            beats.close()

def settle(drive: ToolCalls, outcome: Outcome) -> None:
    """Before an attempt's end is recorded: its last heartbeat, recorded once (again on
    a run re-read after a conflict, whose fold lacks it)."""
    if outcome.kind not in ("step", "cut"):
        return
    found = outcome.heartbeat
    if found is None and outcome.kind == "cut":  # cut short: its call is still in flight
        beats = _in_flight(drive).get((outcome.step_id, outcome.iteration, outcome.attempt))
        found = None if beats is None else beats.snapshot()
    if found is not None:
        _record(drive.run, outcome.step_id, outcome.iteration, outcome.attempt, found)


def _record(run: Run, step_id: str, iteration: int, attempt: int,
            found: dict[str, Any]) -> None:
    state = run.steps.get(step_key(step_id, iteration)) or {}
    recorded = state.get("heartbeat") or {}
    if recorded.get("attempt") == attempt and recorded.get("beats") == found["beats"]:
        return  # recorded already
    run.trigger_event(HeartbeatRecorded, step_id=step_id, iteration=iteration,
                      attempt=attempt, details=found["details"], beats=int(found["beats"]),
                      at=found.get("at"))


def recover(drive: ToolCalls) -> None:
    """Taking the run over from a dead worker: the last heartbeats its attempts in flight
    left in the side table go into the log before they are recorded interrupted."""
    run = drive.run
    running = {key: s for key, s in run.steps.items()
               if s["status"] == "running" and not s.get("wait")}
    if not running:
        return
    try:
        rows = drive.x.heartbeats.of_run(run.run_id)
    except Exception as e:  # the attempts are recorded interrupted all the same
        log.warning("run %s: could not read its heartbeats: %s", run.run_id, e)
        return
    for key, state in running.items():
        row = rows.get(key)
        if row is not None and row["attempt"] == state["attempt"]:
            _record(run, state["step_id"], state["iteration"], state["attempt"], row)


async def watched(call: Awaitable[T], on_heartbeat: Callable[..., None], step: Step) -> T:
    """Await ``call`` (of a step with ``heartbeat_timeout``); cancel it and raise
    HeartbeatTimeout when its beats stayed silent that long (counted from the start
    until the first beat). As ``asyncio.timeout`` does, the task is cancelled and the
    cancellation turned into the error, so a tool awaited in its thread is given up on
    like a timed-out one."""
    assert isinstance(on_heartbeat, functools.partial) and step.heartbeat_timeout is not None
    beats = _made(*on_heartbeat.args)
    seconds = parse_duration(step.heartbeat_timeout) or 0.0
    if beats is None or not seconds:
        return await call
    step_id = step.id
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    expired = False
    handle: asyncio.TimerHandle | None = None

    def check() -> None:
        nonlocal handle, expired
        left = beats.last + seconds - time.monotonic()
        if left > 0:
            handle = loop.call_later(left, check)
            return
        expired = True
        task.cancel()
    handle = loop.call_later(seconds, check)
    try:
        return await call
    except asyncio.CancelledError:
        if expired and task.uncancel() == 0:
            raise HeartbeatTimeout(step_id, seconds, beats.at) from None
        raise
    finally:
        if handle is not None:
            handle.cancel()
