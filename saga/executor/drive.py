"""One drive of one run: the loop of decide, record, save, perform (see
:mod:`saga.executor`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from saga import expressions, scheduler
from saga.composition import Plan
from saga.composition.definition import Step
from saga.domain import Run, StepState, step_key
from saga.domain.undos import undos_in_flight
from saga.errors import ConcurrentWriteError, LeaseLostError
from saga.executor import calls, incoming, nesting, outputs, pools, resources
from saga.executor.calling import ToolCalls
from saga.executor.calls import Outcome
from saga.executor.waits import abandon_wait, wait_length
from saga.scheduler import CompensateStep, Recorded, RequestApproval, RunRemedy, StartStep
from saga.telemetry import metrics, scope, tracing

if TYPE_CHECKING:
    from saga.executor import Executor

log = logging.getLogger("saga.executor")


class LeaseLike(Protocol):
    """What the executor needs of a run's lease (see :class:`saga.store.leases.Lease`)."""

    @property
    def renew_every(self) -> float:
        """Seconds between renewals."""
        ...

    def renew(self) -> bool:
        """Extend the lease; False when another worker holds it now."""
        ...

    def fresh(self, margin: float) -> bool:
        """Whether it is surely held ``margin`` seconds more, by this process's clock."""
        ...

    def take_claim(self) -> Any:
        """The claim the run's next append is to make (once), or None if it is held."""
        ...

    def ending(self) -> Any:
        """The release the append that ends the run is to make, or None."""
        ...

    def ended(self) -> None:
        """That append was made: the lease is given up."""
        ...

EventHook = Callable[[Run, list[Any]], None]
#: Seconds after a suspect run's call starts when its lease is renewed (see _launch).
ALIVE_AFTER = 0.05
#: A drive's span outcome when the drive itself stops short, by exception.
_CUT_SHORT = {"LeaseLostError": "lease_lost", "ConcurrentWriteError": "conflict",
              "CancelledError": "interrupted", "KeyboardInterrupt": "interrupted"}


class Drive(ToolCalls):
    """One drive of one run: the loop of decide, record, save, perform.

    When its worker stops (``executor.stopping`` is set), a drive holding a lease
    drains: it starts nothing new, lets its in-process waits go (they are durable), waits
    for the calls in flight, records their outcomes and ends; the run continues from
    there with whoever claims it next, and no step is called twice. A drive cancelled
    instead (a second signal, Ctrl-C) keeps its run's lease while calls it gave up on
    still run in their threads: until they return, no other worker may call those
    steps again. A child run's drive is part of its parent's step, and runs on.

    Commands other processes record meanwhile are taken in (:mod:`~.incoming`): paused,
    the drive lets its calls finish, records them, starts nothing new and ends; cancelled
    (or told to compensate), it cuts its calls short, records each failed
    (``RunCancelled``, ``RunCompensating``) and undoes the run."""

    def __init__(self, executor: Executor, run: Run, plan: Plan,
                 lease: LeaseLike | None) -> None:
        self.x = executor
        self.run = run
        self.plan = plan
        self.lease = lease
        self.tasks: dict[asyncio.Task[Outcome], tuple[str, str, int, int]] = {}
        self.timers: set[tuple[str, int, int]] = set()
        self.remedies: set[tuple[Any, ...]] = set()
        self.compensating: set[str] = set()
        self.wakes: set[str] = set()
        #: ``use:`` steps whose waiting child this drive drove on (see _child_waits) or ended
        self.children: set[str] = set()
        self.nests = any(step.use is not None for step in plan.definition.steps)
        self.wakeup = calls.Wakeup()  # the loop's wait for its tasks
        self.alive: asyncio.Task[None] | None = None  # a suspect's renewal after a call
        #: The run's version as of its last append (or load), and what this drive has
        #: recorded since that only it knows (calls' outcomes, attempts it cut short):
        #: recorded again should the next append conflict with a command (see incoming).
        self.saved = run.version - len(run.pending_events)
        self.unsaved: list[Outcome] = []
        #: Whether its run is watched for commands while calls are in flight (a drive
        #: holding a lease), and whether some were found (see incoming.Watcher).
        self.watched = False
        self.news = False
        #: The tool threads of attempts cut short that were still running, by step key:
        #: a compensation of such a step waits for its thread (the undo follows the deed).
        self.abandoned: dict[str, Future[Any]] = {}
        self.in_threads: dict[asyncio.Task[Any] | None, Future[Any]] = {}
        #: Set when the drive is to drain (see the class docs); a child run's has none.
        self.stopping = executor.stopping if lease is not None else None
        #: Its next append gives the lease up: the run waits for another pool (pools).
        self.handing_over = False

    async def go(self) -> Run:
        """Drive the run inside its ``saga.run`` span, with the run as the log scope."""
        run = self.run
        span = tracing.start_run(run.run_id, run.name, run.context, run.id.hex, self.x.worker)
        with scope.scoped(run_id=run.run_id, step_id=None, iteration=None, attempt=None,
                          span=span):
            try:
                await self._go()
            except BaseException as e:
                span.end(_CUT_SHORT.get(type(e).__name__, "error"), type(e).__name__, str(e))
                raise
        run = self.run  # the run as stored, should a command have been taken in
        span.end(run.status, (run.error or {}).get("type") if run.is_finished else None,
                 (run.error or {}).get("message", ""))
        return run

    async def _go(self) -> Run:
        # Whoever drives a run now is its only driver (it holds the lease), so any attempt
        # still marked running was started by a worker that died.
        if scheduler.interrupted(self.plan, self.run) or undos_in_flight(self.run.compensation):
            # counted first (quarantine reads it), with what the lease shows of the dead
            self.run.take_over(self.x.worker, calls.lease_seen(self.lease, self.run.run_id))
            self._recover_beats()  # what the dead attempts last beat, before they end
            for action in scheduler.interrupted(self.plan, self.run):
                self._apply(action)
        watch = self.wakeup.watch
        keeper = watch(asyncio.ensure_future(self._keep_lease())) if self.lease else None
        stop = None if self.stopping is None else \
            watch(asyncio.ensure_future(self.stopping.wait()))
        try:
            return await self._loop(keeper, stop)
        except BaseException:
            if self.lease is not None and self.x.calls_running():
                for call in self.tasks:
                    call.cancel()
                if keeper is not None:
                    keeper.cancel()  # _hold_lease renews from here on
                await self._hold_lease()
            raise
        finally:
            for task in [*self.tasks, keeper, stop, self.alive]:
                if task is not None and not task.cancel() and not task.cancelled():
                    task.exception()  # done: a call fenced off too (asyncio would log it)
            resources.close(self)  # slots not used go; a run still waiting is let go
            if self.watched:
                incoming.unwatch(self)
            if keeper is not None and keeper.done() and not keeper.cancelled():
                # A renewal that lost the race with the append giving the lease up: the
                # run is over, and asyncio would log its error as never retrieved.
                keeper.exception()

    async def _loop(self, keeper: asyncio.Task[None] | None,
                    stop: asyncio.Task[Any] | None) -> Run:
        while True:
            draining = self.stopping is not None and self.stopping.is_set()
            launches = [] if draining else self._advance()
            launches += await resources.admit(self)  # the starts that got their slots
            if self.nests:  # nothing outlives its parent: ended before its end is durable
                await nesting.end_children(self.x, self.plan, self.run, self.children,
                                           [i for i in self.tasks.values() if i[0] == "step"])
            try:
                await self._save()
            except ConcurrentWriteError:
                if await incoming.rebase(self, launches):
                    continue  # decided again, on the run as stored
                raise
            if launches and self.lease is not None \
                    and not self.lease.fresh(self.lease.renew_every):
                await self._fence()  # early; each tool call: again as it runs (calling.fence)
            for launch in launches:
                self._launch(*launch)
            if draining or self.run.paused:
                self._let_waits_go()
            if self.run.is_finished or not self.tasks:
                if not self.run.is_finished:  # what waits for another pool's worker
                    await pools.hand_over(self)
                return self.run
            waiting: list[asyncio.Future[Any]] = [*self.tasks]
            if keeper is not None:
                waiting.append(keeper)
            if stop is not None and not draining:
                waiting.append(stop)
            if not self.watched and self.lease is not None:  # others' commands meanwhile
                incoming.watch(self)
                self.watched = True
            done = await self.wakeup.first_done(waiting)
            if keeper is not None and keeper in done:
                keeper.result()  # raises LeaseLostError
            if self.news:
                await incoming.catch_up(self)  # before this turn records anything
            for task in done:
                if task in self.tasks:
                    outcome = calls.outcome_of(task, *self.tasks.pop(task))
                    self.unsaved.append(outcome)
                    self._record(outcome)

    def _let_waits_go(self) -> None:
        """Draining: end the in-process waits (a timer before a retry, a wake for a due
        time). Each is recorded already, so whoever drives the run next keeps it."""
        for task, (kind, *_) in list(self.tasks.items()):
            if kind in ("timer", "wake"):
                task.cancel()
                self.tasks.pop(task)

    async def _hold_lease(self) -> None:
        """Renew the run's lease until the calls given up on return from their threads
        (or another worker holds the lease, or the store cannot be reached)."""
        assert self.lease is not None
        loop = asyncio.get_running_loop()
        pending = {calls.quiet(asyncio.wrap_future(f)) for f in self.x.calls_running()}
        log.warning("run %s: waiting for %d call(s) still running before giving up its "
                    "lease", self.run.run_id, len(pending))
        while pending:
            _, pending = await asyncio.wait(pending, timeout=self.lease.renew_every)
            try:
                if pending and not await loop.run_in_executor(None, self.lease.renew):
                    return
            except Exception as e:  # the lease expires on its own then
                log.warning("run %s: could not renew its lease: %s", self.run.run_id, e)
                return

    async def _keep_lease(self) -> None:
        """Renew the run's lease until the drive ends; raise when another worker took it."""
        assert self.lease is not None
        while True:
            await asyncio.sleep(self.lease.renew_every)
            if not await asyncio.get_running_loop().run_in_executor(None, self.lease.renew):
                raise LeaseLostError(self.run.run_id)

    async def _fence(self) -> None:
        """Before calls start (DESIGN promise 8), a lease not surely held by this
        process's clock (a paused worker's, one whose renewals fall behind) is renewed;
        one another worker took raises LeaseLostError, and nothing starts."""
        assert self.lease is not None
        if not await asyncio.get_running_loop().run_in_executor(None, self.lease.renew):
            raise LeaseLostError(self.run.run_id)

    async def _renew_soon(self) -> None:
        """A suspect run's lease renewed ALIVE_AFTER a call starts: a sign of life that
        keeps a later death of this worker from being blamed on the call (RunTakenOver);
        a failure is the keeper's to find."""
        assert self.lease is not None
        await asyncio.sleep(ALIVE_AFTER)
        with contextlib.suppress(Exception):
            await asyncio.get_running_loop().run_in_executor(None, self.lease.renew)

    # -- deciding and recording --------------------------------------------------------

    def _advance(self) -> list[tuple[str, Any]]:
        """Apply the scheduler's actions until it has nothing new; return what to launch."""
        launches: list[tuple[str, Any]] = []
        while True:
            before = (len(self.run.pending_events), len(launches))
            launches += self._waits()
            actions = scheduler.decide(self.plan, self.run)
            for action in actions:
                launch = self._apply(action)
                if launch is not None:
                    launches.append(launch)
                if isinstance(action, scheduler.FailStep):
                    break  # a failure changes what may start (fail_fast): decide again
            if scheduler.nothing_follows(self.plan, actions):
                return launches  # deciding again would find nothing new (at a decision's cost)
            if before == (len(self.run.pending_events), len(launches)) or self.run.is_finished:
                return launches

    def _apply(self, action: scheduler.Action) -> tuple[str, Any] | None:
        """Record a decision; return what to launch for those a tool performs."""
        if isinstance(action, StartStep):
            return self._start(action)
        if isinstance(action, CompensateStep):
            return self._compensate(action)
        if isinstance(action, RequestApproval):
            limit = scheduler.confirmation_timeout(self.plan, action.step_id)
            until = None if limit is None else \
                (self.x.clock() + timedelta(seconds=limit[0])).isoformat()
            self.run.request_approval(action.step_id, action.message, until)
            return None
        if isinstance(action, RunRemedy):
            marker = ("remedy", action.step_id, action.iteration, action.index)
            if marker not in self.remedies:
                self.remedies.add(marker)
                return ("remedy", action)
            return None
        recorded: Recorded = action
        recorded.record(self.run, self.x.worker)
        return None

    def _start(self, action: StartStep) -> tuple[str, Any] | None:
        if pools.elsewhere(self, action.step_id):
            return None  # a worker of its pool starts it (pools.hand_over)
        if action.not_before is not None:
            due = datetime.fromisoformat(action.not_before)
            delay = (due - self.x.clock()).total_seconds()
            if delay > self.x.hold:
                return None  # durable: the run is released and picked up when it is due
            if delay > 0:
                marker = (action.step_id, action.iteration, action.attempt)
                if marker not in self.timers:
                    self.timers.add(marker)
                    return ("timer", (action, delay))
                return None
        if not resources.may_start(self, action):
            return None  # it waits for a resource slot (resources.admit)
        action.record(self.run, self.x.worker)
        step = self.plan.step(action.step_id)
        if step.sleep is not None or step.signal is not None:
            seconds = step.sleep_seconds if step.sleep is not None else step.timeout_seconds
            until = None if seconds is None else \
                (self.x.clock() + timedelta(seconds=seconds)).isoformat()
            self.run.wait(action.step_id, action.iteration, until, step.signal)
            return None
        return ("step", action)

    def _waits(self) -> list[tuple[str, Any]]:
        """End the waits that are due (a sleep completes, a signal wait times out) and set
        in-process timers for those due soon; a wait due later holds no process."""
        launches: list[tuple[str, Any]] = []
        now = self.x.clock()
        deadline = self.run.deadline
        if deadline is not None and not self.run.timed_out and self.run.compensation is None:
            left = (datetime.fromisoformat(deadline) - now).total_seconds()
            if left <= 0:
                self.run.time_out()
                self._cut_short("RunTimeout", f"the run's deadline {deadline} passed")
                return []
            if left <= self.x.hold and "deadline" not in self.wakes:
                self.wakes.add("deadline")
                launches.append(("wake", ("deadline", left)))
        for step_id, approval in self.run.approvals.items():
            if approval["status"] != "requested" or not approval.get("until"):
                continue
            left = (datetime.fromisoformat(approval["until"]) - now).total_seconds()
            limit = scheduler.confirmation_timeout(self.plan, step_id)
            if left <= 0:  # nobody decided in time: the confirmation's default applies
                default = limit[1] if limit is not None else False
                self.run.decide_approval(step_id, default, "timeout",
                                         f"no decision by {approval['until']}: the default "
                                         f"({'approve' if default else 'reject'}) applies")
            elif left <= self.x.hold and f"approval:{step_id}" not in self.wakes:
                self.wakes.add(f"approval:{step_id}")
                launches.append(("wake", (f"approval:{step_id}", left)))
        for key, wait in self.run.waits.items():
            state = self.run.steps[key]
            if self.run.timed_out or self.run.compensation is not None:
                abandon_wait(self.run, state)  # nothing it waits for can come now
                continue  # (a child it waits for is ended with it: nesting.end_children)
            if wait.get("child"):
                launches += self._child_waits(key)
                continue
            if wait["until"] is None:
                continue
            left = (datetime.fromisoformat(wait["until"]) - now).total_seconds()
            if left <= 0 and wait["signal"] is not None \
                    and self.run.signal_arrived_by(wait["signal"], wait["until"]):
                continue  # its signal came in time, whenever a driver looks: decide() hands
                # it over (should it go to an earlier waiter, the next turn times this out)
            if left <= 0:
                self._end_wait(state, wait)
            elif left <= self.x.hold and key not in self.wakes:
                self.wakes.add(key)
                launches.append(("wake", (key, left)))
        return launches

    def _child_waits(self, key: str) -> list[tuple[str, Any]]:
        """A ``use:`` step waiting for its child run: drive the child on, once a drive
        (see :mod:`~saga.executor.nesting`); not while the parent is paused."""
        run, state = self.run, self.run.steps[key]
        if key in self.children or run.paused:
            return []
        self.children.add(key)
        return [("step", StartStep(state["step_id"], state["iteration"], state["attempt"],
                                   state["parameters"]))]

    def _cut_short(self, error_type: str, message: str) -> None:
        """Cancel the attempts in flight and record each as failed for good (one that has
        just ended is recorded as it ended). A tool in a thread cannot be stopped: it runs
        on, and what it returns is dropped."""
        for task, (kind, step_id, iteration, number) in list(self.tasks.items()):
            if kind != "step" or task.done():
                continue
            task.cancel()
            self.tasks.pop(task)
            thread = self.in_threads.get(task)
            if thread is not None and not thread.done():
                self.abandoned[step_key(step_id, iteration)] = thread
            cut = Outcome("cut", step_id, iteration, number, ok=False, error_type=error_type,
                          message=message, retryable=False)
            self.unsaved.append(cut)
            self._record(cut)
        for key, wait in self.run.waits.items():  # a sleep or a signal wait is in flight too
            if not wait.get("child"):
                abandon_wait(self.run, self.run.steps[key])

    def _end_wait(self, state: StepState, wait: dict[str, Any]) -> None:
        step_id, iteration, attempt = state["step_id"], state["iteration"], state["attempt"]
        waited = wait_length(state, wait)  # not until a worker came back
        if wait["signal"] is None:
            self.run.complete_step(step_id, iteration, attempt,
                                   {"slept_until": wait["until"]}, waited)
            return
        self._record_failure(Outcome(
            "step", step_id, iteration, attempt, ok=False, error_type="SignalTimeout",
            message=f"no signal {wait['signal']!r} arrived by {wait['until']}",
            retryable=False, duration_ms=waited))

    def _compensate(self, action: CompensateStep) -> tuple[str, Any] | None:
        key = f"{action.step_id}:{action.iteration}"
        if key in self.compensating:
            return None
        if action.error is not None:
            self.run.compensation_failed(action.step_id, action.iteration, action.error_type,
                                         action.error)
            return None
        if pools.elsewhere(self, action.step_id):
            return None  # a worker of its pool undoes it (pools.hand_over)
        self.compensating.add(key)
        action.start(self.run, self.x.worker)  # durable before the call, as a step's start
        return ("compensation", action)

    def _record(self, outcome: Outcome) -> None:
        run = self.run
        self._settle_beats(outcome)  # an attempt's last beat, before its end
        if outcome.kind == "wake":
            self.wakes.discard(outcome.step_id)  # the next turn ends the wait
        elif outcome.kind == "timer":
            self.timers.discard((outcome.step_id, outcome.iteration, outcome.attempt))
        elif outcome.kind == "remedy":
            self.remedies.discard(("remedy", outcome.step_id, outcome.iteration, outcome.attempt))
            run.remedy_applied(outcome.step_id, outcome.iteration, outcome.attempt, outcome.ok,
                               outcome.output if outcome.ok else None,
                               None if outcome.ok else f"{outcome.error_type}: {outcome.message}")
        elif outcome.kind == "child":  # the step waits for its child, which waits
            key = step_key(outcome.step_id, outcome.iteration)
            self.children.add(key)  # driven on by a later drive, when there is news of it
            child: nesting.ChildWaits = outcome.output
            wait = run.steps[key].get("wait") or {}
            if (wait.get("child"), wait.get("until")) != (child.run_id, child.until):
                run.wait(outcome.step_id, outcome.iteration, child.until, None, child.run_id)
        elif outcome.kind == "cut":  # an attempt cut short: failed for good, not healed
            run.fail_step(outcome.step_id, outcome.iteration, outcome.attempt,
                          outcome.error_type, outcome.message)
        elif outcome.kind == "compensation":
            self.compensating.discard(f"{outcome.step_id}:{outcome.iteration}")
            if outcome.ok:
                run.compensated(outcome.step_id, outcome.iteration, outcome.output)
            else:
                run.compensation_failed(outcome.step_id, outcome.iteration, outcome.error_type,
                                        outcome.message)
        elif outcome.ok:
            try:
                run.complete_step(outcome.step_id, outcome.iteration, outcome.attempt,
                                  outcome.output, outcome.duration_ms, outcome.cache)
            except Exception as e:  # an output the log cannot hold is a failure, recorded
                self._record_failure(replace(
                    outcome, ok=False, output=None, error_type="OutputNotRecordable",
                    message=f"the output cannot be recorded: {e}", retryable=False))
        else:
            self._record_failure(outcome)

    def _record_failure(self, outcome: Outcome) -> None:
        """A failed attempt: healed (remedies, then a retry), retried after a backoff, or
        failed for good."""
        heal = scheduler.heal_decision(self.plan, self.run, outcome.step_id, outcome.iteration,
                                       outcome.error_type, outcome.message)
        retry = heal is not None or scheduler.retry_decision(
            self.plan, outcome.step_id, outcome.attempt, outcome.error_type, outcome.retryable)
        next_at = None
        if heal is not None:
            next_at = self.x.clock().isoformat()
        elif retry:
            step = self.plan.step(outcome.step_id)
            policy = step.retry or calls.default_policy(self.plan)
            delay = calls.retry_delay(policy, outcome.attempt)
            next_at = (self.x.clock() + timedelta(seconds=delay)).isoformat()
        self.run.fail_step(outcome.step_id, outcome.iteration, outcome.attempt,
                           outcome.error_type, outcome.message, retry, next_at)
        if heal is not None:
            self.run.start_heal(outcome.step_id, outcome.iteration, outcome.attempt, *heal)

    async def _save(self) -> None:
        pending = list(self.run.pending_events)
        if not pending:
            self.unsaved.clear()  # what it recorded changed only the drive's own marks
            return
        # The append that ends the run may give its lease up too (a run's first append,
        # still to claim it, never does: ending() is None then).
        lease = self.lease
        ending = lease.ending() if lease is not None and (
            self.run.is_finished or self.handing_over) else None
        if self.x.group is not None:  # a worker's group commit (one commit per turn)
            # it gives the lease up only with a batch of this run alone
            released = await self.x.group.save(self.run, idle=not self.tasks, ending=ending)
        elif lease is None:
            self.x.app.save_run(self.run)
            released = False
        else:  # a new run's first append may claim its lease
            self.x.app.save_run(self.run, lease.take_claim(), ending)
            released = ending is not None
        self.saved = self.run.version
        self.unsaved.clear()
        if released and lease is not None:
            lease.ended()
        metrics.recorded(self.run.name, pending, self._tool)
        if self.x.on_events is not None:
            self.x.on_events(self.run, pending)

    # -- performing --------------------------------------------------------------------

    async def _call_step(self, action: StartStep) -> Outcome:
        step = self.plan.step(action.step_id)
        started = time.monotonic()
        try:
            if step.compute is not None:
                output = await self._in_thread(
                    functools.partial(expressions.run_compute, seconds=step.timeout_seconds),
                    step.compute, scheduler.namespace(self.plan, self.run))
            elif step.use is not None:
                output = await nesting.run_child(self.x, self.run, action.step_id,
                                                 action.iteration, action.parameters)
                if isinstance(output, nesting.ChildWaits):
                    return Outcome("child", action.step_id, action.iteration, action.attempt,
                                   output=output)
            else:
                assert step.tool is not None
                hit = outputs.cached(self, step, action)
                if hit is not None:
                    return Outcome("step", action.step_id, action.iteration, action.attempt,
                                   output=hit.pop("output"), cache=hit)
                output = await self._call_tool(step.tool, action.parameters, action,
                                               step.timeout_seconds)
            calls.check_json(output)
            calls.check_expectation(step, output)
            output = await outputs.keep(self, step, action, output)
            outputs.remember(self, step, action, output)
        except LeaseLostError:
            raise  # nothing was called (calling.fence): the drive gives the run up
        except Exception as e:
            return calls.failure("step", action.step_id, action.iteration, action.attempt, e,
                            step.timeout_seconds, started)
        return Outcome("step", action.step_id, action.iteration, action.attempt, output=output,
                       duration_ms=calls.ms(started))

    async def _call_compensation(self, action: CompensateStep) -> Outcome:
        step: Step = self.plan.step(action.step_id)
        compensation = step.compensation
        assert compensation is not None
        timeout = compensation.timeout_ms / 1000 if compensation.timeout_ms else None
        started = time.monotonic()
        call = StartStep(action.step_id, action.iteration, action.attempt, action.parameters)
        thread = self.abandoned.pop(step_key(action.step_id, action.iteration), None)
        if thread is not None:  # its attempt was cut short, but may still act: after it
            await calls.returned(thread)
        try:
            recorded = self.run.steps[step_key(action.step_id, action.iteration)]["output"]
            if action.tool is None and step.use is not None:
                child = self.run.steps[step_key(action.step_id, action.iteration)]
                output = await nesting.compensate_child(
                    self.x, self.run, (recorded or {}).get("run_id")
                    or child["parameters"]["run"])
            elif action.tool is None:
                assert step.tool is not None
                recorded = await outputs.restore(self, recorded)
                output = await self._call_tool(step.tool, action.parameters, call, timeout,
                                               suffix=":compensate", own_output=(recorded,))
            else:
                output = await self._call_tool(action.tool, action.parameters, call, timeout,
                                               suffix=":compensate")
            calls.check_json(output)
            output = outputs.drop(output, step.secret_outputs)
        except LeaseLostError:
            raise  # nothing was called (calling.fence): the drive gives the run up
        except Exception as e:
            return calls.failure("compensation", action.step_id, action.iteration, 1, e, timeout,
                            started)
        return Outcome("compensation", action.step_id, action.iteration, 1, output=output,
                       duration_ms=calls.ms(started))
