"""Performing what the scheduler decides: calling tools, timing out, retrying, recording.

The executor never decides. Each turn it asks :func:`saga.scheduler.decide` for actions,
records them on the run, appends them in one commit (so a step's completion and the
starts of the steps it unblocks cost one append), and only then calls the tools it just
recorded as started (promise 1: ``StepStarted`` is durable before a tool runs). The
clock and ``sleep`` are injected so tests can replace them; retry jitter comes from
tenacity's wait strategies and is recorded as the retry's due time, so replay never
needs it again. :mod:`~saga.executor.drive` is one drive of one run;
:mod:`~saga.executor.nesting` runs nested compositions as child runs;
:mod:`~saga.executor.incoming` takes in what other processes command meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from saga.composition import Plan, load_child, plan_of, tree_tools
from saga.domain import Run, StepState
from saga.errors import RunNotFoundError, SagaError, ToolsMissingError
from saga.executor.drive import Drive, EventHook, LeaseLike
from saga.executor.incoming import WATCH_EVERY
from saga.executor.pools import Pools, excused
from saga.store.application import SagaApplication
from saga.store.cache import ToolCache
from saga.store.group_commit import GroupCommit
from saga.store.heartbeats import Heartbeats
from saga.store.resources import ResourceSlots
from saga.store.side_tables import Database
from saga.store.undo import UndoStore
from saga.tools import Registry

__all__ = ["TOOL_THREADS", "EventHook", "Executor", "LeaseLike", "ToolThreads", "check_tools",
           "plan_of", "recorded_modules"]


#: Tool threads per run driven at once (a drive's calls past that many wait their turn).
TOOL_THREADS = 16


def recorded_modules(run: Run) -> list[str]:
    """The ``--tools`` modules a run was started with, as its ``RunStarted`` recorded them
    (its options' ``tool_modules``; none for a run started before they were recorded)."""
    modules = run.options.get("tool_modules") if isinstance(run.options, dict) else None
    return [str(m) for m in modules] if isinstance(modules, list) else []


def tools_needed(plan: Plan, run: Run, undoing: bool = False) -> set[str]:
    """The tools a drive of the run may call from here on: any the plan names, or, once
    the run compensates (or is to be undone: ``undoing``), only its steps' compensations
    (a cancel needs no forward tool)."""
    if run.compensation is None and not undoing:
        return plan.tools_named()
    names: set[str] = set()
    for state in run.steps.values():
        if state["status"] in ("pending", "skipped", "compensated"):
            continue  # nothing (left) to undo
        step = plan.step(state["step_id"])
        call = step.compensation
        own = step.tool if step.use is None else None  # a child undoes its own steps
        tool = None if call is None else call.tool if call.tool is not None else own
        names.update([tool] if tool is not None else [])
    return names


def check_tools(registry: Registry, run: Run, plan: Plan | None = None,
                get_run: Callable[[str], Run] | None = None) -> None:
    """Raise ToolsMissingError, before anything is recorded, when ``registry`` lacks a
    tool the drive may call: a process started without the run's ``--tools`` module must
    leave the run as it was (promise 7), not fail it. With ``get_run`` (which reads a
    run), its nested compositions' tools count too: a child run's step is its parent's."""
    missing = sorted(_lacking(registry, run, plan or plan_of(run), get_run))
    if missing:
        raise ToolsMissingError(run.run_id, missing, recorded_modules(run))


def _lacking(registry: Registry, run: Run, plan: Plan,
             get_run: Callable[[str], Run] | None, undoing: bool = False) -> set[str]:
    """The tools a drive of the run (and of the child runs it drives) may call that
    ``registry`` lacks: an open child run's (any child's compensations while the run
    compensates), and for a ``use`` step with no child run yet, its composition's, loaded
    as its start would."""
    undoing = undoing or run.compensation is not None
    names = tools_needed(plan, run, undoing)
    lacking: set[str] = set()
    uses = {step.id for step in plan.steps.values() if step.use is not None}
    if get_run is not None and uses:
        states: dict[str, list[StepState]] = {}
        for state in run.steps.values():
            if state["step_id"] in uses:
                states.setdefault(state["step_id"], []).append(state)
        for step_id in uses:
            children = [c for s in states.get(step_id, []) if (c := _child(s, get_run))]
            for child in children:
                if undoing or not child.is_finished:
                    lacking |= _lacking(registry, child, plan_of(child), get_run, undoing)
            settled = any(s["status"] in ("completed", "skipped")
                          for s in states.get(step_id, []))
            if not children and not settled and not undoing:
                # Not loadable here: its start fails, whatever the tools.
                with contextlib.suppress(SagaError, OSError):
                    names |= tree_tools(load_child(plan.steps[step_id].use or "", None))
    return lacking | {name for name in names if name not in registry}


def _child(state: StepState, get_run: Callable[[str], Run]) -> Run | None:
    """The child run a ``use`` step's attempt started, if it was recorded."""
    parameters = state.get("parameters")
    child_id = parameters.get("run") if isinstance(parameters, dict) else None
    if not child_id:
        return None
    try:
        return get_run(str(child_id))
    except RunNotFoundError:
        return None


def _now() -> datetime:
    return datetime.now(UTC)


class ToolThreads:
    """The threads tools run in, shared by the drives of one process: a drive that
    started its own pool paid a thread start per run, the larger part of a short run's
    scaffold in a worker.

    A call a drive gave up on (a timeout, a cancelled drive) may hold its thread for as
    long as the tool hangs, so such a drive retires the pool: later drives get a new one,
    and the old one's threads end once their calls return and it is collected."""

    def __init__(self, max_threads: int = TOOL_THREADS) -> None:
        self.max_threads = max_threads
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The current pool (made on first use)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_threads,
                                                thread_name_prefix="saga-tool")
            return self._pool

    def retire(self, pool: ThreadPoolExecutor) -> None:
        """Stop handing ``pool`` out (if it is still the current one)."""
        with self._lock:
            if self._pool is pool:
                self._pool = None

    def close(self) -> None:
        """Stop the current pool (calls under way finish on their own)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class Executor:
    """Drives runs of one application with a registry of tools."""

    _heartbeats: Heartbeats | None = None  # (see heartbeats: opened on first use)

    def __init__(self, app: SagaApplication, registry: Registry, *, worker: str | None = None,
                 clock: Callable[[], datetime] = _now,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 on_events: EventHook | None = None, max_threads: int = TOOL_THREADS,
                 cache: ToolCache | None = None, hold: float = 60.0,
                 undo: UndoStore | None = None, threads: ToolThreads | None = None,
                 watch_every: float = WATCH_EVERY) -> None:
        """``hold``: the longest wait (a retry's backoff, a sleep, a signal's timeout) a
        drive waits out in this process; a longer one ends the drive, and a worker picks
        the run up again when it is due. ``undo``: where tools' undo state is kept (by
        default opened on the store's database when first needed). ``threads``: shared
        tool threads (by default, up to ``max_threads`` of its own, stopped on close).
        ``watch_every``: how often (seconds) a drive with calls in flight looks for
        commands other processes recorded on its run, a pause or a cancel (see
        :mod:`~saga.executor.incoming`)."""
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
        #: Set by a worker, and set when it stops: its drives finish the calls they have
        #: in flight, record them, start nothing new and end (see :class:`Drive`).
        self.stopping: asyncio.Event | None = None
        #: Set by a worker: the pools it serves (None: every step; see executor.pools).
        self.pools: Pools | None = None
        #: The store's resource slots (saga.toml ``[resources]``; None: nothing limited),
        #: taken before the steps that name a resource start (see executor.resources).
        self.resources: ResourceSlots | None = None
        self.watch_every = watch_every
        self._own_threads = threads is None
        self.threads = ToolThreads(max_threads) if threads is None else threads
        self._pool = self.threads.pool
        self._calls: set[Future[Any]] = set()
        self._calls_lock = threading.Lock()

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        """Run ``call`` in a tool thread; it counts among :meth:`calls_running` until it
        returns, whether or not a drive still waits for it."""
        future = self._pool.submit(call)
        with self._calls_lock:
            self._calls.add(future)
        future.add_done_callback(self._returned)
        return future

    def _returned(self, future: Future[Any]) -> None:
        with self._calls_lock:
            self._calls.discard(future)

    def calls_running(self) -> list[Future[Any]]:
        """The calls still running in their threads (a drive may have given up on them:
        a timeout, a cancelled drive)."""
        with self._calls_lock:
            return list(self._calls)

    def close(self) -> None:
        """Stop the tool threads if they are this executor's own; else retire them if a
        call given up on still holds one."""
        if self._own_threads:
            self.threads.close()
        elif self.calls_running():
            self.threads.retire(self._pool)
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

    @property
    def heartbeats(self) -> Heartbeats:
        """Tools' last heartbeats (:mod:`saga.store.heartbeats`), on the undo store's
        connection (opened on first use)."""
        db = self.undo_store.db
        found = self._heartbeats
        if found is None or found.db is not db:
            found = self._heartbeats = Heartbeats(db)
        return found

    def plan_for(self, run: Run) -> Plan:
        """The plan of the definition recorded in the run (never a file edited since)."""
        return plan_of(run)

    def drive(self, run: Run, lease: LeaseLike | None = None) -> Run:
        """Drive a run until it finishes or waits (for an approval); returns its state.

        With a ``lease``, it is renewed while the run is driven, and the drive stops with
        LeaseLostError if another worker took the run over.
        """
        driven: list[Run] = []

        async def main() -> None:
            # The task's result is not the run: asyncio.run reprs its main task (through
            # the SIGINT handler's partial) when it restores the handler, and a run's
            # repr costs as much as the run is long.
            driven.append(await self.drive_async(run, lease))
        asyncio.run(main())
        return driven[0]

    async def drive_async(self, run: Run, lease: LeaseLike | None = None) -> Run:
        """Async form of :meth:`drive` (ToolsMissingError, with nothing recorded, when the
        registry lacks a tool the run names)."""
        plan = plan_of(run)
        try:
            check_tools(self.registry, run, plan, self.app.get_run)
        except ToolsMissingError as e:  # a worker of one pool needs only its tools
            if lease is None or not excused(plan, self.pools, e.tools):
                raise
        # A worker's group commit counts its drives, a child run's too (see GroupCommit).
        with self.group.driving() if self.group is not None else contextlib.nullcontext():
            return await Drive(self, run, plan, lease).go()
