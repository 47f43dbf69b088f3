"""Performing what the scheduler decides: calling tools, timing out, retrying, recording.

The executor never decides. Each turn it asks :func:`saga.scheduler.decide` for actions,
records them on the run, appends them in one commit (so a step's completion and the
starts of the steps it unblocks cost one append), and only then calls the tools it just
recorded as started (promise 1: ``StepStarted`` is durable before a tool runs). The
clock and ``sleep`` are injected so tests can replace them; retry jitter comes from
tenacity's wait strategies and is recorded as the retry's due time, so replay never
needs it again. :mod:`~saga.executor.drive` is one drive of one run;
:mod:`~saga.executor.nesting` runs nested compositions as child runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from saga.composition import Plan, plan_of
from saga.domain import Run
from saga.executor.drive import Drive, EventHook, LeaseLike
from saga.store.application import SagaApplication
from saga.store.cache import ToolCache
from saga.store.group_commit import GroupCommit
from saga.store.side_tables import Database
from saga.store.undo import UndoStore
from saga.tools import Registry

__all__ = ["EventHook", "Executor", "LeaseLike", "plan_of"]


def _now() -> datetime:
    return datetime.now(UTC)


class Executor:
    """Drives runs of one application with a registry of tools."""

    def __init__(self, app: SagaApplication, registry: Registry, *, worker: str | None = None,
                 clock: Callable[[], datetime] = _now,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 on_events: EventHook | None = None, max_threads: int = 16,
                 cache: ToolCache | None = None, hold: float = 60.0,
                 undo: UndoStore | None = None) -> None:
        """``hold``: the longest wait (a retry's backoff, a sleep, a signal's timeout) a
        drive waits out in this process; a longer one ends the drive, and a worker picks
        the run up again when it is due. ``undo``: where tools' undo state is kept (by
        default opened on the store's database when first needed)."""
        self.app = app
        self.hold = hold
        self.sleep = sleep
        self.cache = cache
        self.registry = registry
        self.worker = worker
        self.clock = clock
        self.on_events = on_events
        self._undo = undo
        self._undo_db: Database | None = None
        self._undo_lock = threading.Lock()
        #: Set by a worker: appends go through its group commit instead of one by one.
        self.group: GroupCommit | None = None
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="saga-tool")

    def close(self) -> None:
        """Stop the tool thread pool."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._undo_db is not None:
            self._undo_db.close()
            self._undo_db, self._undo = None, None

    @property
    def undo_store(self) -> UndoStore:
        """The undo store (:mod:`saga.store.undo`), opened on first use when not given."""
        with self._undo_lock:
            if self._undo is None:
                self._undo_db = Database(self.app.settings)
                self._undo = UndoStore(self._undo_db, self.app.settings.undo_key)
            return self._undo

    def plan_for(self, run: Run) -> Plan:
        """The plan of the definition recorded in the run (never a file edited since)."""
        return plan_of(run)

    def drive(self, run: Run, lease: LeaseLike | None = None) -> Run:
        """Drive a run until it finishes or waits (for an approval); returns its state.

        With a ``lease``, it is renewed while the run is driven, and the drive stops with
        LeaseLostError if another worker took the run over.
        """
        return asyncio.run(self.drive_async(run, lease))

    async def drive_async(self, run: Run, lease: LeaseLike | None = None) -> Run:
        """Async form of :meth:`drive`."""
        return await Drive(self, run, plan_of(run), lease).go()
