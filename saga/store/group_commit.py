"""Group commit: the appends of every run one worker drives, in one transaction per turn.

A worker drives many runs on one event loop. Each drive's append (:meth:`save`) joins
the batch being gathered; one commit at a time runs, in a thread, while the next batch
gathers, so N runs that append together pay about one commit instead of N. Each run's
events are still fenced by its version, and a drive continues only once its own events
are committed (a step's ``StepStarted`` is durable before its tool runs). A conflict on
one run fails the batch's transaction; :meth:`SagaApplication.save_runs` then saves the
runs one by one, so only the stale run gets its error.

A batch that holds every drive in flight, none of which has anything else under way (a
worker driving a chain one run at a time, or the last run of a backlog), is committed on
the event loop itself: nothing on the loop could move while it commits, and handing the
commit to a thread and back cost about as much CPU as the commit's own client side (0.15
ms a commit here). Its drives wait for it as they would for the thread, through an
outage too, where a halt then waits for the commit as it does for the release of the
leases. A drive with a step still running (an async tool, a timer, a child run's drive)
or another drive not in the batch sends the commit to a thread, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from saga.domain import Run
from saga.store.application import SagaApplication
from saga.store.leases import LeaseRelease


class GroupCommit:
    """Batches the appends of runs driven on one event loop (see the module docs)."""

    def __init__(self, app: SagaApplication, max_batch: int = 256) -> None:
        self.app = app
        self.max_batch = max_batch
        self._waiting: list[tuple[Run, asyncio.Future[bool], bool, LeaseRelease | None]] = []
        self._flushing: asyncio.Task[None] | None = None
        self.commits = 0  # transactions made (for benchmarks)
        #: The drives appending through this group now, child runs' included (see
        #: :meth:`driving`).
        self.drives = 0

    @contextmanager
    def driving(self) -> Iterator[None]:
        """Count a drive appending through this group while it lasts."""
        self.drives += 1
        try:
            yield
        finally:
            self.drives -= 1

    async def save(self, run: Run, idle: bool = False,
                   ending: LeaseRelease | None = None) -> bool:
        """Append the run's pending events (with whoever else appends now); raises what
        :meth:`SagaApplication.save_run` would. ``idle``: its drive has nothing else
        under way while it waits (see the module docs). ``ending``: the run ends with
        this append, which gives its lease up too when it is committed alone (one
        round trip fewer for a run driven one at a time); whether it did."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((run, future, idle, ending))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.ensure_future(self._flush())
        return await future

    async def _flush(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(0)  # let the drives that are ready this turn join the batch
        while self._waiting:
            batch, self._waiting = (self._waiting[:self.max_batch],
                                    self._waiting[self.max_batch:])
            runs = [run for run, _, _, _ in batch]
            # A batch of one run gives its lease up with its events when it ends there.
            ending = batch[0][3] if len(batch) == 1 else None
            still = 0 < self.drives <= len(batch) and all(idle for _, _, idle, _ in batch)
            try:
                errors: list[Any] = (
                    self.app.save_runs(runs, ending) if still
                    else await loop.run_in_executor(None, self.app.save_runs, runs, ending))
            except Exception as e:
                errors = [e for _ in batch]
            self.commits += 1
            for (_, future, _, _), error in zip(batch, errors, strict=True):
                if future.done():
                    continue
                if error is None:
                    future.set_result(ending is not None)
                else:
                    future.set_exception(error)
