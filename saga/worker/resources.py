"""How a worker treats runs waiting for a resource slot (saga.toml ``[resources]``).

A drive whose step could not get its slots within its hold lets the run go (see
:mod:`saga.executor.resources`): it holds no thread and no drive while it waits. The
worker then holds the run off in its index, rather than claim it again on its next look
only to find the slot still taken: until :data:`RECHECK` seconds pass, or sooner, at the
first look where the store says the run is first in line for a slot free now
(:meth:`~saga.store.resources.ResourceSlots.servable`, one query per look, made only
while this worker holds such runs off). That is a poll, bounded: a slot freed is taken
up within one look (``saga worker --poll``, 0.5 s by default) by whichever worker looks
first, and a waiter's place in line is kept in the store meanwhile, so waiters are
served in arrival order whichever worker drives them.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from saga.store.resources import ResourceSlots
from saga.worker.index import RunIndex

log = logging.getLogger("saga.worker")

#: A run held off for a resource is looked at again after this long at the latest
#: (seconds): it asks for its slots again, which keeps its place in line.
RECHECK = 5.0


class ResourceWaits:
    """The runs one worker holds off while they wait for resource slots."""

    def __init__(self, slots: ResourceSlots) -> None:
        self.slots = slots
        self.waiting: set[str] = set()

    def look(self, index: RunIndex, now: float) -> None:
        """At each look (``now``: POSIX time, the leases' clock): hold off the runs whose
        drives just let them go waiting, and make runnable again those the store says
        may have a slot now."""
        while self.slots.released:
            run_id = self.slots.released.popleft()
            self.waiting.add(run_id)
            index.held(run_id, _iso(now + RECHECK))
        self.waiting = {r for r in self.waiting if r in index.runs}  # ended ones go
        if not self.waiting:
            return
        try:
            servable = self.slots.servable() & self.waiting
        except Exception as e:  # the recheck comes anyway
            log.warning("could not read the resource waiters: %s", e)
            return
        for run_id in servable:
            self.waiting.discard(run_id)
            index.held(run_id, _iso(now))  # runnable at this look's claims


def _iso(posix: float) -> str:
    return datetime.fromtimestamp(posix, UTC).isoformat()
