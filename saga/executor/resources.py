"""A drive's resource slots: a step naming a limited resource starts only with a slot.

The scheduler decides as ever; this module performs the limits of saga.toml's
``[resources.NAME]`` (see :mod:`saga.store.resources`) around its decisions:

1. :func:`may_start`, asked by the drive before it records a ``StepStarted``: a step
   whose call counts against limited resources (its ``resource:``, else its tool's
   default, e.g. ``http:HOST``) starts only once this drive holds its slots; until then
   it is left pending and noted as wanted.
2. :func:`admit`, after each turn's decisions: the slots wanted are asked for in one
   transaction per step, in a thread. A step granted them is started at once (the drive
   decides again, and records its ``StepStarted``); one refused records
   ``StepWaitingForResource`` once per attempt and is asked for again shortly, in
   process, while the drive's ``hold`` allows (a worker's is one second). Past that the
   drive ends with nothing in flight and lets the run go: no worker thread, and no drive,
   waits for a slot. A worker holds such a run off until the store says a slot may be
   its (see :mod:`saga.worker.resources`), or a recheck comes due.
3. :func:`holding`: the slots of a step are renewed while its call runs (every third of
   their lease) and given up when it returns, so the next waiter may start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from saga.domain import step_key
from saga.domain.resources import resource_waits, wait_for_resource
from saga.scheduler import StartStep
from saga.store.resources import Admission, ResourceSlots

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from saga.executor.calling import ToolCalls
    from saga.executor.calls import Outcome
    from saga.executor.drive import Drive

log = logging.getLogger("saga.executor")

#: Seconds between a refused step's in-process asks for its slots: the first, and the
#: longest (each wait is a quarter of the time waited so far, between the two).
POLL_FIRST = 0.2
POLL_MOST = 1.0
#: Lines are kept this many lease lengths for a waiter that stops asking (its worker
#: died: the next to claim the run asks again, and keeps the place).
WAITER_LEASES = 3

Ident = tuple[str, int, int]  # step id, iteration, attempt


def names_of(drive: Drive, action: StartStep) -> list[str]:
    """The resources a step's call counts against: its own ``resource:`` (one name or a
    list; ``[]`` for none), else its tool's default for these parameters."""
    step = drive.plan.step(action.step_id)
    if step.resource is not None:
        return [step.resource] if isinstance(step.resource, str) else list(step.resource)
    if step.tool is None or step.tool not in drive.x.registry:
        return []
    default = getattr(drive.x.registry.get(step.tool), "resource", None)
    if default is None or isinstance(default, str):
        return [default] if default else []
    try:
        found = default(action.parameters if isinstance(action.parameters, dict) else {})
    except Exception:  # a default that cannot read these parameters names none
        return []
    return [] if not found else [found] if isinstance(found, str) else list(found)


class DriveSlots:
    """The slots one drive holds, and the starts waiting for theirs."""

    def __init__(self, drive: Drive, store: ResourceSlots) -> None:
        self.drive = drive
        self.store = store
        self.held: dict[Ident, str] = {}  # the holder of each start's slots
        self.wanted: dict[Ident, list[str]] = {}
        self.refused: dict[Ident, float] = {}  # when it was first refused (monotonic)
        self.keeper: asyncio.Task[None] | None = None
        self.waited = False  # some start waited in line (its places go when the run ends)
        lease_seconds = getattr(drive.lease, "seconds", None)
        self.seconds = float(lease_seconds or drive.x.app.settings.lease_seconds)

    def holder(self, ident: Ident) -> str:
        """``RUN:STEP:ATTEMPT``: who holds (or waits for) one attempt's slots."""
        return f"{self.drive.run.id}:{step_key(ident[0], ident[1])}:{ident[2]}"

    def acquire(self, wanted: dict[Ident, list[str]]) -> dict[Ident, Admission]:
        """Ask the store for each start's slots (in a thread: it is a round trip)."""
        run = self.drive.run
        return {ident: self.store.acquire(
            names, self.holder(ident), str(run.id), step_key(ident[0], ident[1]),
            self.drive.x.worker, self.seconds, self.seconds * WAITER_LEASES)
            for ident, names in wanted.items()}

    async def admit(self) -> list[tuple[str, Any]]:
        wanted, self.wanted = self.wanted, {}
        loop = asyncio.get_running_loop()
        answers = await loop.run_in_executor(None, self.acquire, wanted)
        launches: list[tuple[str, Any]] = []
        granted = False
        for ident, answer in answers.items():
            if answer.granted:
                self.held[ident] = self.holder(ident)
                self.refused.pop(ident, None)
                granted = True
                continue
            self.waited = True
            wait_for_resource(self.drive.run, *ident, sorted(wanted[ident]))
            launches += self._ask_again(ident)
        if granted:
            if self.keeper is None:
                self.keeper = asyncio.ensure_future(self._keep())
            launches = self.drive._advance() + launches  # now they start
        self.wanted.clear()  # the refused, wanted again by that decision: next turn
        return launches

    def _ask_again(self, ident: Ident) -> list[tuple[str, Any]]:
        """A wake to ask again for a refused start's slots, while the drive may hold the
        run that long; none past it (the run is let go when nothing else is in flight)."""
        first = self.refused.setdefault(ident, time.monotonic())
        waited = time.monotonic() - first
        delay = min(POLL_MOST, max(POLL_FIRST, waited / 4))
        key = "resource:" + step_key(ident[0], ident[1])
        # A child run's drive is its parent's step: it asks on (its parent's step would
        # wait for it with no time to come back at), holding a task but no thread.
        child = bool(self.drive.run.context.get("parent"))
        if (waited + delay > self.drive.x.hold and not child) or key in self.drive.wakes:
            return []
        self.drive.wakes.add(key)
        return [("wake", (key, delay))]

    async def _keep(self) -> None:
        """Renew the slots of the calls in flight, every third of their lease."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.seconds / 3)
            holders = list(self.held.values())
            try:
                kept = await loop.run_in_executor(None, self.store.renew, holders, self.seconds)
            except Exception as e:  # the slots lapse at their expiry: said, not fatal
                log.warning("run %s: could not renew its resource slots: %s",
                            self.drive.run.run_id, e)
                continue
            if kept < len(holders):
                log.warning("run %s: a resource slot lapsed while its call ran (the "
                            "worker fell behind its renewals)", self.drive.run.run_id)

    def release(self, ident: Ident) -> str | None:
        """Forget a start's slots; the holder whose rows are to go, if it had any."""
        return self.held.pop(ident, None)

    def close(self) -> None:
        """The drive ends: slots never used go, and a run still waiting is let go (and
        noted for this process's worker); a run that waits no more leaves every line."""
        if self.keeper is not None:
            self.keeper.cancel()
        holders = list(self.held.values())
        self.held.clear()
        run = self.drive.run
        try:
            if holders:
                self.store.release(holders)
            if resource_waits(run):
                if self.drive.lease is not None:
                    self.store.released.append(str(run.id))
            elif self.waited or run.is_finished:
                self.store.leave(str(run.id))
        except Exception as e:  # slots and places lapse at their expiry anyway
            log.warning("run %s: could not give its resource slots up: %s", run.run_id, e)


def _slots(drive: Any) -> DriveSlots | None:
    """The drive's slots (made on first use), or None when nothing is limited."""
    found: DriveSlots | None = drive.resource_slots
    if found is None:
        store: ResourceSlots | None = getattr(drive.x, "resources", None)
        if store is None or not store.limits:
            return None
        found = drive.resource_slots = DriveSlots(drive, store)
    return found


def may_start(drive: Drive, action: StartStep) -> bool:
    """Whether a start the scheduler decided may be recorded now: it names no limited
    resource, or this drive holds its slots; else it is noted as wanted (see admit)."""
    if getattr(drive.x, "resources", None) is None:
        return True
    step = drive.plan.step(action.step_id)
    if step.sleep is not None or step.signal is not None:
        return True  # a wait, not a call
    slots = _slots(drive)
    if slots is None:
        return True
    names = slots.store.limited(names_of(drive, action))
    ident = (action.step_id, action.iteration, action.attempt)
    if not names or ident in slots.held:
        return True
    slots.wanted[ident] = names
    return False


async def admit(drive: Drive) -> list[tuple[str, Any]]:
    """Ask for the slots of the starts this turn left wanting; the launches of those
    granted (decided again, now started) and the wakes to ask again for the others."""
    slots: DriveSlots | None = drive.resource_slots
    if slots is None or not slots.wanted:
        return []
    return await slots.admit()


async def holding(calls: ToolCalls, action: StartStep,
                  call: Coroutine[Any, Any, Outcome]) -> Outcome:
    """Make a step's call, then give its slots up (at once: the next waiter may start)."""
    slots: DriveSlots | None = calls.resource_slots
    ident = (action.step_id, action.iteration, action.attempt)
    if slots is None or ident not in slots.held:
        return await call
    try:
        outcome = await call
    except BaseException:
        holder = slots.release(ident)
        with contextlib.suppress(Exception):
            slots.store.release([holder] if holder else [])
        raise
    holder = slots.release(ident)
    if holder is not None:
        try:
            await asyncio.get_running_loop().run_in_executor(None, slots.store.release,
                                                             [holder])
        except Exception as e:  # the slot lapses at its expiry
            log.warning("could not give up the resource slot of %s: %s", holder, e)
    return outcome


def close(drive: Drive) -> None:
    """The drive ends (see :meth:`DriveSlots.close`)."""
    slots: DriveSlots | None = drive.resource_slots
    if slots is not None:
        slots.close()
