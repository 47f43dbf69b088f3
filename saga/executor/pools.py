"""Worker pools: a worker runs only the steps of its pools, and hands a run over to the
workers of the pools its next steps need.

A step may name a ``pool``. A worker started with ``--pool NAME`` (repeatable) serves
those pools, and unpooled steps too unless ``--only-pools`` (:class:`Pools`). Its drive
of a run (:class:`saga.executor.drive.Drive`) starts only the steps (and compensations)
it serves (:func:`elsewhere`); when nothing of the run is left in flight and what the
scheduler would start next needs another pool, the drive records ``StepAwaitingPool``
for each such step and gives the run's lease up with that append (:func:`hand_over`).
Every worker's index reads those events: a run whose waits name none of a worker's pools
is not claimed by it (:class:`saga.worker.index.RunIndex`), and a worker of one of them
claims it and starts the step. So a run moves from worker to worker as its steps need,
and for its pooled steps its lease is held per step attempt. A run whose pool no worker
serves waits, and says so (``saga status``: ``waiting: pool NAME``); it never fails for
lack of a worker.

What this costs: one run is driven by one worker at a time (its lease; DESIGN promise
2), so steps of one run in different pools that could run in parallel run one pool after
the other: the worker of the first keeps the run until its steps there are done.

Only a worker's drives of the runs it claimed follow pools: ``saga run``, ``saga
resume`` and the API's in-process drives run every step (they are no worker), and a
child run (``use:``) runs where its parent's step runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from saga.composition import Plan
from saga.domain.pools import await_pool, recorded_waits
from saga.scheduler import decide
from saga.scheduler.pools import matches, needs, pool_of, pooled

if TYPE_CHECKING:
    from saga.executor.drive import Drive

log = logging.getLogger("saga.executor")


@dataclass(frozen=True)
class Pools:
    """The pools one worker serves: ``names``, and unpooled steps unless ``only``."""

    names: frozenset[str] = field(default_factory=frozenset)
    only: bool = False

    @classmethod
    def of(cls, names: Iterable[str] = (), only: bool = False) -> Pools:
        """The pools of ``saga worker --pool NAME ... [--only-pools]``."""
        return cls(frozenset(names), only)

    def serves(self, pool: str | None) -> bool:
        """Whether this worker runs a step of ``pool`` (None: an unpooled step)."""
        return pool in self.names if pool is not None else not self.only

    def describe(self) -> str:
        """The pools in words, for the worker's log."""
        names = ", ".join(sorted(self.names)) or "none"
        return f"pools {names}" + ("" if self.only else " and unpooled steps")


def excused(plan: Plan, served: Pools | None, missing: Iterable[str]) -> bool:
    """Whether a worker serving ``served`` may drive a run of ``plan`` though it lacks
    the ``missing`` tools: each is named only by steps of pools it does not serve (their
    calls, undos and remedies), which it never runs. A host of one pool needs only that
    pool's tools (a tool a nested composition of another pool's ``use:`` step names
    still counts: it is not looked up here)."""
    if served is None:
        return False
    mine: set[str] = set()
    theirs: set[str] = set()
    for step in plan.steps.values():
        calls = [step.compensation, *(call for h in step.heal for call in h.do)]
        names = {c.tool for c in calls if c is not None and c.tool is not None}
        names |= {step.tool} if step.tool is not None else set()
        (mine if served.serves(step.pool) else theirs).update(names)
    return all(tool in theirs and tool not in mine for tool in missing)


def elsewhere(drive: Drive, step_id: str) -> bool:
    """Whether a step (its start, or its compensation) is left to a worker of its pool:
    the drive is a worker's, holding the run's lease, and the worker does not serve the
    step's pool. Nothing is recorded here: :func:`hand_over` records the waits when the
    drive has nothing else to do."""
    served = drive.x.pools
    if served is None or drive.lease is None:
        return False
    if drive.pool_start is None:  # see hand_over
        drive.pool_start = drive.saved
    return not served.serves(pool_of(drive.plan, step_id))


async def hand_over(drive: Drive) -> bool:
    """The drive has nothing in flight and the run is not finished: record a
    ``StepAwaitingPool`` for each step start or compensation the scheduler decides now
    that needs a pool its worker does not serve (unless recorded already, and not
    forgotten since), and save them in one append that gives the run's lease up too
    (or, where the store cannot, give it up at once after): a worker of that pool
    claims the run next. Whether the drive handed the run over so."""
    served = drive.x.pools
    run, lease = drive.run, drive.lease
    if served is None or lease is None or run.is_finished or run.paused \
            or not pooled(drive.plan) \
            or (drive.stopping is not None and drive.stopping.is_set()):
        return False
    recorded = list(recorded_waits(run).values())
    waiting = [need for need in needs(drive.plan, decide(drive.plan, run))
               if not served.serves(need.pool)]
    new = [need for need in waiting if not any(matches(need, w) for w in recorded)]
    if not new and run.version == drive.pool_start:
        # Recorded already, yet this drive did nothing: news since (a signal, a label, a
        # takeover) made the workers' indexes forget the waits (saga.worker.pools), and
        # a worker of none of their pools claimed the run. Said again, so that it does
        # not claim it at every look.
        new = waiting
    if not new:
        return False
    for need in new:
        await_pool(run, need.step_id, need.iteration, need.attempt, need.pool,
                   need.compensation, drive.x.worker)
    drive.handing_over = True  # the append gives the lease up with the waits
    try:
        await drive._save()
    finally:
        drive.handing_over = False
    release = getattr(lease, "release", None)
    if release is not None and not getattr(lease, "released", True):
        try:  # a store that cannot give it up in the append: at once, so a worker of
            # the pool that reads the waits finds the run free
            await asyncio.get_running_loop().run_in_executor(None, release)
            lease.ended()
        except Exception as e:  # it expires anyway; the worker tries again as it ends
            log.info("run %s: could not give its lease up: %s", run.run_id, e)
    log.info("run %s waits for %s", run.run_id, ", ".join(
        f"pool {n.pool}" if n.pool is not None else "a worker of unpooled steps"
        for n in new))
    return True
