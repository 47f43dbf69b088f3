"""What other processes record on a run while a drive holds it: commands (a pause, a
cancel, a signal, a decision) and revisions (a label, a migration, a reset of a run
whose steps in flight only wait), all listed in :data:`saga.domain.COMMANDS`, which the
drive takes in instead of giving the run up. A migration taken in moves the drive to the
run's new plan: the steps not started yet follow it; those in flight keep the start they
recorded.

A command is appended by whoever gives it (``saga pause``, ``saga cancel``, the HTTP
API), fenced by the run's version like every append, while the run's driver goes on. The
driver learns of it in two ways:

- :class:`Watcher`: while a call of its stays in flight, a drive holding a lease has its
  run's last version read every :data:`WATCH_EVERY` seconds, and :func:`catch_up` folds
  what it finds onto its run: a cancel cuts its calls short at once (``RunCancelled``);
- :func:`rebase`: an append that conflicted with a command (it landed between two looks)
  is made again on the run as stored, with what only the drive knew (the outcomes of its
  calls, the attempts it cut short) recorded once more, and its decisions taken again.

Anything else another process recorded is a second driver's: the version fence's verdict
stands (ConcurrentWriteError), as before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any

from saga.domain import COMMANDS
from saga.executor.pools import excused
from saga.executor.waits import ending_cause

if TYPE_CHECKING:
    from saga.executor.drive import Drive

log = logging.getLogger("saga.executor")

#: How often (seconds) a drive with calls in flight looks for commands on its run
#: (``Executor.watch_every``).
WATCH_EVERY = 1.0


def is_command(event: Any) -> bool:
    """Whether another process may have recorded this event while the run was driven:
    a command (a rollback only when requested), never a driver's own record."""
    name = type(event).__name__
    return name in COMMANDS and (name != "CompensationStarted"
                                 or bool(getattr(event, "requested", False)))


class Watcher:
    """Looks for commands on behalf of the drives of one event loop that hold a lease (a
    worker's, or ``saga run``'s): one timer for them all, every ``watch_every`` seconds
    (of the first drive's executor). A drive with a call in flight since the last tick
    has its run's last version read; when the store holds one past the drive's (the
    events the drive has not appended yet have versions of their own: a later one is
    another process's), the drive is told (``drive.news``, and its wait ends). A drive of
    short calls never has the store read for it."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.drives: dict[Drive, tuple[Any, ...]] = {}  # the calls in flight at the last tick
        self.looking: dict[Drive, asyncio.Task[None]] = {}
        self.timer = asyncio.get_running_loop().call_later(every, self._tick)

    def _tick(self) -> None:
        for drive, seen in self.drives.items():
            tasks = drive.tasks
            if drive not in self.looking and any(task in tasks for task in seen):
                self.looking[drive] = asyncio.ensure_future(self._look(drive))
            self.drives[drive] = tuple(tasks)
        self.timer = asyncio.get_running_loop().call_later(self.every, self._tick)

    async def _look(self, drive: Drive) -> None:
        try:
            last = await asyncio.get_running_loop().run_in_executor(None, functools.partial(
                drive.x.app.events_of, drive.run.id, desc=True, limit=1))
        except Exception as e:  # the store is away: the drive's next append says more
            log.debug("run %s: could not look for commands: %s", drive.run.run_id, e)
            last = []
        finally:
            self.looking.pop(drive, None)
        if last and last[0].originator_version > drive.run.version:
            drive.news = True
            drive.wakeup.poke()


#: The watcher of each event loop that has drives to watch.
_WATCHERS: dict[asyncio.AbstractEventLoop, Watcher] = {}


def watch(drive: Drive) -> None:
    """Have the drive's run watched for commands until :func:`unwatch`."""
    loop = asyncio.get_running_loop()
    watcher = _WATCHERS.get(loop)
    if watcher is None:
        watcher = _WATCHERS[loop] = Watcher(drive.x.watch_every)
    watcher.drives[drive] = ()


def unwatch(drive: Drive) -> None:
    """The drive ends: stop watching it (and the loop, once it has no drive left)."""
    loop = asyncio.get_running_loop()
    watcher = _WATCHERS.get(loop)
    if watcher is None or watcher.drives.pop(drive, None) is None:
        return
    looking = watcher.looking.pop(drive, None)
    if looking is not None:
        looking.cancel()
    if not watcher.drives:  # nothing holds the loop once it is done
        watcher.timer.cancel()
        del _WATCHERS[loop]


async def catch_up(drive: Drive) -> None:
    """Fold onto the drive's run (which has nothing unsaved) the commands recorded
    after it, up to anything else (left to the version fence), and act on them."""
    drive.news = False
    run = drive.run
    try:
        events = await asyncio.get_running_loop().run_in_executor(None, functools.partial(
            drive.x.app.events_of, run.id, gt=run.version))
    except Exception as e:  # left to the next append: a conflict with them rebases it
        log.warning("run %s: could not read the commands recorded on it: %s", run.run_id, e)
        return
    taken = []
    for event in events:
        if not is_command(event):
            break
        event.mutate(run)
        taken.append(event)
    if taken:
        if any(type(e).__name__ == "DefinitionMigrated" for e in taken):
            _migrated(drive)
        _took_in(drive, taken)


async def rebase(drive: Drive, launches: list[tuple[str, Any]]) -> bool:
    """After an append of the drive's that conflicted, in the turn that decided
    ``launches`` (not launched): whether only commands were recorded since its last
    append. If so, the drive's run is now the run as stored, with what only the drive
    knew recorded again on it (not appended yet), for the turn to be decided again; if
    not, the run is left as it was, for the drive to end. A drive with nothing in flight
    and nothing of its own to record again ends too (its next driver decides as well)."""
    _forget(drive, launches)
    if not (drive.unsaved or drive.tasks):
        return False
    loop = asyncio.get_running_loop()
    app, uid = drive.x.app, drive.run.id
    fresh = await loop.run_in_executor(None, app.get_run, uid)
    events = await loop.run_in_executor(None, functools.partial(
        app.events_of, uid, gt=drive.saved, lte=fresh.version))
    if not events or not all(is_command(e) for e in events):
        return False
    drive.run = fresh
    if any(type(e).__name__ == "DefinitionMigrated" for e in events):
        _migrated(drive)  # what the drive recorded again is decided by the new plan too
    for outcome in drive.unsaved:
        drive._record(outcome)
    _took_in(drive, events)
    return True


def _forget(drive: Drive, launches: list[tuple[str, Any]]) -> None:
    """Drop the marks the drive keeps of launches that will not happen."""
    for kind, payload in launches:
        if kind == "timer":
            action = payload[0]
            drive.timers.discard((action.step_id, action.iteration, action.attempt))
        elif kind == "wake":
            drive.wakes.discard(payload[0])
        elif kind == "remedy":
            drive.remedies.discard(("remedy", payload.step_id, payload.iteration,
                                    payload.index))
        elif kind == "compensation":
            drive.compensating.discard(f"{payload.step_id}:{payload.iteration}")


#: The commands that start undoing the run (a cancel, a requested compensation, a reset).
UNDOING = frozenset({"CompensationStarted", "RunReset"})


def _took_in(drive: Drive, events: list[Any]) -> None:
    """Commands were folded onto the drive's run (a migration's plan taken already):
    show them (the drive's event hook); when one undoes the run (a cancel, a requested
    compensation, a reset), cut the calls in flight short (``RunCancelled``,
    ``RunCompensating``), as the run's deadline does."""
    if drive.x.on_events is not None:
        drive.x.on_events(drive.run, events)
    if any(type(e).__name__ in UNDOING for e in events):
        drive._cut_short(*ending_cause(drive.run))


def _migrated(drive: Drive) -> None:
    """The run moved to a new definition: decide with its plan from here on (its check
    proved every recorded decision the same, the starts of the calls in flight too). A
    worker that lacks a tool the new plan names (and no other pool's worker would call)
    drains the run: its calls in flight finish and are recorded, nothing new starts, and
    the run is left to a worker that has them, never started here to fail."""
    drive.plan = plan = drive.x.plan_for(drive.run)
    drive.nests = any(step.use is not None for step in plan.definition.steps)
    lacking = {name for name in plan.tools_named() if name not in drive.x.registry}
    if lacking and drive.lease is not None and not excused(plan, drive.x.pools, lacking):
        log.warning("run %s: migrated to a definition naming tools this worker lacks "
                    "(%s); it lets the run go once its calls return", drive.run.run_id,
                    ", ".join(sorted(lacking)))
        drive.stopping = asyncio.Event()
        drive.stopping.set()
