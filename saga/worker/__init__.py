"""Workers: find runnable runs in the log, claim their leases, and drive them.

A worker follows the store's notification log (:class:`~saga.worker.index.RunIndex`) to
know which runs are unfinished and not waiting for a person, claims each one's lease
(:mod:`saga.store.leases`) and drives it with an executor. A run whose worker died is
taken over as soon as a look's sweep finds that worker's liveness lock gone (see
:mod:`saga.store.liveness`; a holder that registered none: once its lease expires): the
attempts it left ``running`` are interrupted (see :func:`saga.scheduler.interrupted`).

Runs are claimed by priority (highest first), then age (oldest first), each from the
queue its ``RunStarted`` names and within that queue's limits (saga.toml
``[queues.NAME]``), which :meth:`~saga.store.leases.Leases.claim_queued` keeps across
every worker together. A run whose queue is at a limit is left for a later look.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Protocol

from saga.config import QueueLimit
from saga.domain import Run
from saga.errors import (
    ConcurrentWriteError,
    LeaseLostError,
    SagaError,
    StoreUnavailableError,
    ToolsMissingError,
)
from saga.executor import TOOL_THREADS, Executor, ToolThreads
from saga.executor.pools import Pools
from saga.store.application import SagaApplication
from saga.store.group_commit import GroupCommit
from saga.store.leases import Claim, Leases, default_worker_id
from saga.store.liveness import Liveness
from saga.store.reconnect import backoff
from saga.telemetry import metrics
from saga.worker.index import RunIndex
from saga.worker.pools import POOL_RECHECK
from saga.worker.resources import ResourceWaits

__all__ = ["CLAIM_ROUNDS", "HELD_RECHECK", "LACKING_RECHECK", "LOOK_AHEAD", "WORKER_HOLD",
           "RunIndex", "Worker"]

log = logging.getLogger("saga.worker")


class Companion(Protocol):
    """What works beside a worker for as long as it runs (the notifier)."""

    def start(self) -> Any: ...

    def stop(self, *, drain: bool = False) -> None: ...

#: The longest wait a worker's drive waits out in process (seconds): a longer timer,
#: retry backoff or signal timeout releases the run, and any worker takes it up when due.
WORKER_HOLD = 1.0
#: A run another worker holds is tried again after this long at the latest (seconds),
#: though its lease runs longer: a worker that stops gives its runs up before then.
HELD_RECHECK = 5.0
#: A run this worker lacks tools for is looked at again after this long (seconds), or
#: sooner on news of it (a cancel needs fewer tools): its registry never grows, and each
#: look holds the run's lease a moment from the workers that have them.
LACKING_RECHECK = 30.0
#: Claims a look makes at most: after the first, only if other workers held some of the
#: runs it wanted (the next runs in the order are tried instead).
CLAIM_ROUNDS = 4
#: How many of the next runs in the order a claim offers as stand-ins for those it wants
#: that other workers hold (the first free ones are taken; see ``Worker._look``).
LOOK_AHEAD = 32
#: A look with room for runs reads the log at least this often (seconds). In between,
#: on PostgreSQL, a look claims from what the index has read: its claim passes over a run
#: that has ended since, reports the runs other workers took (the next in the order
#: stand in for them), and a look that claims nothing so reads the log and tries again.
#: With a queue that limits its drives or starts (saga.toml), every look reads the log.
FOLLOW_EVERY = 0.05


class Worker:
    """Claims runnable runs and drives up to ``concurrency`` of them at once."""

    def __init__(self, app: SagaApplication, leases: Leases,
                 executor: Callable[[str, ToolThreads], Executor], *,
                 worker_id: str | None = None,
                 lease_seconds: float = 30.0, concurrency: int = 4,
                 poll_interval: float = 0.5, tick: Callable[[], Any] | None = None,
                 queues: Mapping[str, QueueLimit] | None = None,
                 pools: Pools | None = None) -> None:
        """``executor(worker_id, threads)`` makes the executor a drive uses (closed after
        it; its tools run in ``threads``, shared by the worker's drives);
        ``tick()`` runs each time the worker looks for work (firing due schedules);
        ``queues``: the limits of queues (saga.toml ``[queues.NAME]``); ``pools``: the
        pools whose steps it runs (default: none, and unpooled steps; see
        :mod:`saga.executor.pools`)."""
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
        #: What dies with this process, so its runs move on at once (saga.store.liveness).
        self.liveness = Liveness(leases.db, self.worker_id, leases.bindings)
        self.pools = pools or Pools()
        self.index = RunIndex(app, serves=self.pools.serves)
        self.driven = 0
        #: The appends of every run this worker drives at once share a commit.
        self.group = GroupCommit(app)
        #: As many tool threads for all drives as each drive had of its own.
        self.threads = ToolThreads(TOOL_THREADS * concurrency)
        #: Runs whose drive ended, whose leases the next look gives up (appended on the
        #: event loop, taken in the look's thread).
        self._ended: deque[str] = deque()
        #: Runs whose drive failed on an error of its own: not claimed again at once.
        self._failed: deque[str] = deque()
        #: Runs whose drive ended, not claimed again before the log says what it did.
        self._parked: deque[str] = deque()
        #: The runs a look claimed, read together in its thread, taken by their drives.
        self._loaded: dict[str, Run] = {}
        #: When the look that claimed each run began (POSIX time, the leases' clock): its
        #: lease is held until that time plus its length at least (see Drive._fence).
        self._claimed_at: dict[str, float] = {}
        self._appends = app.claims_with_append()  # its leases ride on its appends
        self._followed = float("-inf")  # when a look last read the log (monotonic)
        #: Whether any queue limits its drives or starts (its runs are claimed apart).
        self._limits = any(limit.limited for limit in self.queues.values())
        #: Whether every look reads the log: a claim that passes over ended runs needs
        #: saga's PostgreSQL recorder, and a queue's limits count what the log says (a
        #: run started and finished elsewhere meanwhile must not count as a start here).
        self._follow_always = not self._appends or self._limits
        #: The runs (with the tools they need) this worker left for lack of tools, each
        #: said once in its log.
        self._missing: set[tuple[str, tuple[str, ...]]] = set()
        self._lacking: deque[str] = deque()  # of those, the runs to hold off (next look)
        self._stopping: asyncio.Event | None = None
        self._running: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None
        #: Set when saga.toml limits resources: the runs whose steps wait for a slot are
        #: held off until one may be theirs (see saga.worker.resources).
        self.resources: ResourceWaits | None = None

    def run(self, *, until_idle: bool = False, stop: Callable[[], bool] | None = None,
            alongside: Companion | None = None) -> int:
        """Work until ``stop()`` says so (or, with ``until_idle``, nothing is runnable);
        returns how many drives ended.

        Once ``stop()`` is true the worker claims nothing more, and its drives finish the
        calls they have in flight, record them and end (see
        :class:`saga.executor.drive.Drive`); :meth:`halt` cuts that short.

        ``alongside`` (the notifier) works beside it while this worker's liveness lock
        is held: started once the lock is, so what it claims carries the lock's key and is
        taken back at once if this process dies; stopped before the lock goes, so no
        other worker takes back what it still has in flight."""
        self.liveness.start(self.lease_seconds)  # a process with this id must be gone
        if alongside is not None:
            alongside.start()
        try:
            return asyncio.run(self._run(until_idle, stop or (lambda: False)))
        except asyncio.CancelledError:  # halted
            return self.driven
        finally:
            self._running = None
            if alongside is not None:
                alongside.stop(drain=until_idle)
            self.threads.close()
            self.liveness.stop()

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
                        and "rate" not in held.values() \
                        and not (self.resources and self.resources.waiting):  # held off for slots
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
        if self.resources is not None:
            self.resources.look(self.index, self.leases.clock())
        for run_id in self.liveness.sweep():  # their holders died: runnable now
            self.index.held(run_id, self.index.clock().isoformat())
        while self._failed:  # else the next look drives it again, and fails, at once
            self._held_elsewhere({self._failed.popleft(): self.leases.clock() + HELD_RECHECK},
                                 failed=True)
        while self._lacking:
            later = datetime.fromtimestamp(self.leases.clock() + LACKING_RECHECK, UTC)
            self.index.held(self._lacking.popleft(), later.isoformat())
        while self._parked:
            self.index.park(self._parked.popleft())
        if self.liveness.lost:
            # Its leases do not count until its lock is back (saga.store.liveness): a run
            # claimed now would record a start and be given up at once, and taken over by
            # this worker itself on the next look (a server restart so quarantined runs).
            # Nothing is claimed, but the worker is not idle: it looks again soon.
            return [], {}, True
        active = set(driving)  # and those claimed in this look
        started: list[str] = []
        claimed_at = self.leases.clock()  # no claim of this look is earlier
        read: set[str] = set()  # of those started, the runs their claim read
        held: dict[str, Claim] = {}
        lost_all = False
        if len(active) < self.concurrency:  # full: nothing could be claimed anyway
            now = time.monotonic()
            # On PostgreSQL a look between reads of the log claims from what the index
            # has read (see FOLLOW_EVERY); one that finds nothing so reads the log first.
            between = not self._follow_always and now - self._followed < FOLLOW_EVERY
            for follow in (False, True) if between else (True,):
                if follow:
                    self.index.refresh()
                    self._followed = now
                lost_all = self._claim_rounds(active, started, read, held, follow)
                if started:
                    break
        for run_id in started:
            self._claimed_at[run_id] = claimed_at
        unread = [r for r in started if r not in read]
        if unread:
            self._load(unread)
        return started, held, lost_all

    def _claim_rounds(self, active: set[str], started: list[str], read: set[str],
                      held: dict[str, Claim], followed: bool) -> bool:
        """Claim runnable runs in the index's order, in rounds (see CLAIM_ROUNDS), up to
        ``concurrency`` drives beside those ``active``: each claimed is added to
        ``active`` and ``started`` (and to ``read`` when its claim read the run), the
        queues found at a limit to ``held``; whether every round was lost to other
        workers (runs remain to claim). ``followed``: the index has just read the log
        (the queue depth it reports is then what the log says)."""
        for round_ in range(CLAIM_ROUNDS):
            runnable = self.index.runnable()
            if round_ == 0 and followed:
                metrics.queue_depth(len(runnable))
            wanted: list[str] = []
            alone = any(self._suspect(r) for r in active)  # a suspect is driven alone
            for run_id in runnable:
                if len(active) + len(wanted) >= self.concurrency or alone:
                    break
                if run_id in active:
                    continue
                suspect = self._suspect(run_id)
                if suspect and (active or wanted):
                    continue  # a run its workers died under is driven alone: if it kills
                    # this worker too, no innocent run dies with it and counts a takeover
                queue, limit, start = self._queue_of(run_id)
                if limit is None or not limit.limited:
                    wanted.append(run_id)  # claimed with the others, in one commit
                    alone = suspect
                    continue
                outcome = self._claim(run_id, queue, limit, start, held)
                if outcome == "claimed":
                    alone = suspect
                    self.index.claimed(run_id)
                    active.add(run_id)
                    started.append(run_id)
                elif outcome == "held":
                    self._held_elsewhere(self.leases.held_by_others([run_id], self.worker_id))
            if not wanted:
                break
            # The next runs in the order stand in for those other workers hold, in the
            # same statement, which also tells which those are: a fleet's workers all
            # start from the same oldest runs, and a lost claim each would cost a round.
            spare = [] if alone else list(
                islice((r for r in runnable[runnable.index(wanted[-1]) + 1:]
                        if r not in active and not self._suspect(r)
                        and not (self._limits and self._limited(r))), LOOK_AHEAD))
            candidates = [*wanted, *spare]
            claimed, elsewhere, runs = self.app.claim_runs(
                self.leases, candidates, len(wanted), self.worker_id, self.lease_seconds,
                [self.index.queue_of(r) for r in candidates],
                versions=self.index.versions(candidates))
            self._held_elsewhere(elsewhere)
            # A run wanted that was neither claimed nor held elsewhere has ended or been
            # taken since the index read the log: each round would offer it again.
            for run_id in wanted:
                if run_id not in claimed and run_id not in elsewhere:
                    self.index.park(run_id)
            if runs is not None:  # read with the claim: their drives read nothing more
                claimed = self._not_suspects(claimed, runs, active)
                self._keep(claimed, runs)
                read.update(claimed)
            for run_id in claimed:
                self.index.claimed(run_id)
                active.add(run_id)
                started.append(run_id)
            if len(claimed) == len(wanted):
                break
        else:
            return not started
        return False

    def _not_suspects(self, claimed: list[str], runs: dict[str, Run],
                      active: set[str]) -> list[str]:
        """The runs claimed, but for those whose read shows a takeover the index had not
        read yet (it follows the log at most every FOLLOW_EVERY): a run other workers
        died under is driven alone, so each such run claimed beside others is given up
        at once, and the next look (which knows it now) claims it alone."""
        found = [r for r in claimed if r in runs and runs[r].suspect
                 and not self._suspect(r)]
        if not found:
            return claimed
        for run_id in found:
            followed = self.index.runs.get(run_id)
            if followed is not None:
                followed.takeovers = max(followed.takeovers, 1)
        if len(claimed) == 1 and not active:
            return claimed  # alone anyway
        self.leases.release_many(found, self.worker_id)
        return [r for r in claimed if r not in found]

    def _load(self, run_ids: list[str]) -> None:
        """Read the runs just claimed in one round trip, for their drives to take."""
        try:
            runs = self.app.get_runs(run_ids)
        except Exception as e:  # each drive reads its own run then, and reports it
            # Not quiet: a read that always fails costs every drive a read of its own.
            log.warning("could not read the %d runs claimed together (each drive reads "
                        "its own): %s", len(run_ids), e)
            runs = {}
        self._keep(run_ids, runs)

    def _keep(self, run_ids: list[str], runs: dict[str, Run]) -> None:
        """Keep the runs read for the drives of ``run_ids`` to take."""
        for run_id in run_ids:  # never a copy an earlier look left behind
            if run_id in runs:
                self._loaded[run_id] = runs[run_id]
            else:
                self._loaded.pop(run_id, None)

    def _held_elsewhere(self, expiries: dict[str, float], failed: bool = False) -> None:
        """Note in the index the runs other workers hold, with their leases' expiry (or,
        ``failed``, when a run whose drive failed here is to be tried again)."""
        now = self.leases.clock()
        for run_id, expires in expiries.items():
            # a run handed to a pool this worker serves is given up by its holder at once
            soon = not failed and self.index.awaits_served(run_id)
            until = min(expires, now + (POOL_RECHECK if soon else HELD_RECHECK))
            self.index.held(run_id, datetime.fromtimestamp(until, UTC).isoformat())

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
        queue = self.index.queue_of(run_id)
        followed = self.index.runs.get(run_id)
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

    def _limited(self, run_id: str) -> bool:
        """Whether the run's queue limits its drives or starts (claimed one at a time)."""
        limit = self._queue_of(run_id)[1]
        return limit is not None and limit.limited

    def _suspect(self, run_id: str) -> bool:
        followed = self.index.runs.get(run_id)
        return followed is not None and followed.takeovers > 0

    async def _drive(self, run_id: str) -> None:
        lease = self.leases.lease(run_id, self.worker_id, self.lease_seconds)
        lease.appends = self._appends  # the append that ends the run may give it up
        lease.expires = self._claimed_at.pop(run_id, 0.0) + self.lease_seconds
        loop = asyncio.get_running_loop()
        try:
            run = self._loaded.pop(run_id, None)
            if run is None:  # the look could not read it: in a thread, as the loop drives
                run = await loop.run_in_executor(None, self.app.get_run, run_id)
            if not run.is_finished:
                executor = self.make_executor(self.worker_id, self.threads)
                executor.group = self.group
                executor.stopping = self._stopping
                executor.pools = self.pools
                try:
                    await executor.drive_async(run, lease)
                finally:
                    executor.close()
        except (ConcurrentWriteError, LeaseLostError) as e:
            log.info("backing off run %s: %s", run_id, e)
        except StoreUnavailableError as e:  # taken up again once the store is back
            log.warning("run %s: %s; it will be driven again", run_id, e)
        except ToolsMissingError as e:
            # Nothing was recorded: the run is left for a worker with the tools (this one
            # looks again after LACKING_RECHECK, and says so once per run and tools).
            if (run_id, tuple(e.tools)) not in self._missing:
                self._missing.add((run_id, tuple(e.tools)))
                log.warning("worker %s leaves run %s to a worker that has its tools: %s",
                            self.worker_id, run_id, e)
            self._lacking.append(run_id)
        except SagaError as e:
            log.error("run %s: %s (tried again in %.0f s)", run_id, e, HELD_RECHECK)
            self._failed.append(run_id)
        except Exception:
            log.exception("run %s failed in the worker (tried again in %.0f s)", run_id,
                          HELD_RECHECK)
            self._failed.append(run_id)
        finally:
            self.driven += 1
            self._parked.append(run_id)
            # Given up with the others that ended by the next look, in one statement,
            # before that look claims anything (so a queue's limits count it free),
            # unless the append that ended the run gave it up.
            if not lease.released:
                self._ended.append(run_id)
