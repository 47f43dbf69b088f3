"""Performing a drive's calls: each launched as a task (a step's tool, a remedy, a
compensation, the timers it waits on), made in its span, a blocking tool in a thread
(the :class:`~saga.executor.drive.Drive` mixes this in)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from saga import secrets
from saga.composition import Plan
from saga.domain import Run
from saga.domain.revisions import key_of
from saga.errors import LeaseLostError, ToolError
from saga.executor import calls, heartbeats, outputs, resources
from saga.executor.calls import Outcome
from saga.scheduler import CompensateStep, RunRemedy, StartStep
from saga.telemetry import metrics, scope, tracing
from saga.tools import ToolContext

if TYPE_CHECKING:
    from saga.executor import Executor
    from saga.executor.drive import LeaseLike


class ToolCalls:
    """The calls a drive performs, each ending in an :class:`~.calls.Outcome`."""

    # Provided by the drive these calls belong to.
    x: Executor
    run: Run
    plan: Plan
    wakeup: calls.Wakeup
    in_threads: dict[asyncio.Task[Any] | None, Future[Any]]
    tasks: dict[asyncio.Task[Outcome], tuple[str, str, int, int]]
    lease: LeaseLike | None
    alive: asyncio.Task[None] | None
    #: The heartbeats of its attempts that beat, until recorded (executor.heartbeats); a
    #: class default, not the instance's __dict__, which reading would slow every attribute.
    beating: dict[tuple[str, int, int], Any] | None = None
    #: Its resource slots, made on first use (executor.resources), and the run's version
    #: when it first left a step to another pool (executor.pools): class defaults too.
    resource_slots: Any = None
    pool_start: int | None = None

    if TYPE_CHECKING:
        async def _renew_soon(self) -> None: ...
        async def _call_step(self, action: StartStep) -> Outcome: ...
        async def _call_compensation(self, action: CompensateStep) -> Outcome: ...

    def _launch(self, kind: str, payload: Any) -> None:
        if kind == "wake":
            key, delay = payload
            coro = self._wake(key, delay)
            ident = (kind, key, 0, 0)
        elif kind == "timer":
            action, delay = payload
            coro = self._timer(action, delay)
            ident = (kind, action.step_id, action.iteration, action.attempt)
        elif kind == "step":
            coro = resources.holding(self, payload, self._observed(
                "saga.step", payload, payload.attempt, self._call_step(payload)))
            ident = (kind, payload.step_id, payload.iteration, payload.attempt)
            if self.run.suspect and self.lease is not None:
                self.alive = asyncio.ensure_future(self._renew_soon())
        elif kind == "remedy":
            coro = self._call_remedy(payload)
            ident = (kind, payload.step_id, payload.iteration, payload.index)
        else:
            coro = self._observed("saga.compensate", payload, 1,
                                  self._call_compensation(payload))
            ident = (kind, payload.step_id, payload.iteration, 1)
        self.tasks[self.wakeup.watch(asyncio.ensure_future(coro))] = ident

    async def _observed(self, name: str, action: StartStep | CompensateStep, attempt: int,
                        call: Coroutine[Any, Any, Outcome]) -> Outcome:
        """Make a call of a step or compensation inside its span, with the step as the
        log scope; count how long a step's attempt took."""
        tool = getattr(action, "tool", None) or self._tool(action.step_id)
        parent = scope.current().span  # tracing off: its attributes are not made
        span = parent if parent is tracing.NOOP else parent.child(name, {
            "saga.run_id": self.run.run_id, "saga.definition": self.run.name,
            "saga.step_id": action.step_id, "saga.iteration": action.iteration,
            "saga.attempt": attempt, "saga.tool": tool})
        began = time.perf_counter()  # the recorded duration_ms is whole milliseconds
        with scope.scoped(step_id=action.step_id, iteration=action.iteration,
                          attempt=attempt, span=span):
            try:
                outcome = await call
            except BaseException as e:  # cancelled (a timeout, the drive ending), or a bug
                heartbeats.let_go(self, action.step_id, action.iteration, attempt)
                span.end("cancelled" if isinstance(e, asyncio.CancelledError) else "failed",
                         type(e).__name__, str(e))
                raise
        if name == "saga.step" and self.beating:  # some attempt beat
            outcome = heartbeats.attach(self, outcome)  # its beats end with it
        done = ("completed" if name == "saga.step" else "compensated") if outcome.ok \
            else "failed"
        span.end(done, outcome.error_type or None, outcome.message,
                 retryable=None if outcome.ok else outcome.retryable,
                 cache_hit=True if outcome.cache else None)
        if name == "saga.step" and not outcome.cache:
            metrics.step_duration(tool, done, time.perf_counter() - began)
        self.wakeup.wake()  # this task ends with the return: no turn waits for it
        return outcome

    def _settle_beats(self, outcome: Outcome) -> None:
        """Before an attempt's end is recorded: what its tool last beat (heartbeats)."""
        if outcome.heartbeat is not None or outcome.kind == "cut":
            heartbeats.settle(self, outcome)

    def _recover_beats(self) -> None:
        """Taking the run over: what the dead worker's attempts last beat (heartbeats)."""
        heartbeats.recover(self)

    def _tool(self, step_id: str) -> str:
        try:
            return calls.tool_label(self.plan.step(step_id))
        except Exception:  # a step the plan does not know: count it, unnamed
            return "unknown"

    async def _wake(self, key: str, delay: float) -> Outcome:
        await self.x.sleep(delay)
        return Outcome("wake", key, 0, 0)

    async def _timer(self, action: StartStep, delay: float) -> Outcome:
        await self.x.sleep(delay)
        return Outcome("timer", action.step_id, action.iteration, action.attempt)

    async def _call_remedy(self, action: RunRemedy) -> Outcome:
        """Call one auto-heal remedy; its ``attempt`` field carries the remedy's index."""
        started = time.monotonic()
        call = StartStep(action.step_id, action.iteration, 1, action.parameters)
        try:
            output = await self._call_tool(action.tool, action.parameters, call, None,
                                           suffix=f":heal{action.index}")
            calls.check_json(output)
            output = outputs.drop(output)
        except LeaseLostError:
            raise  # nothing was called: the drive gives the run up
        except Exception as e:
            return calls.failure("remedy", action.step_id, action.iteration, action.index, e, None,
                            started)
        return Outcome("remedy", action.step_id, action.iteration, action.index, output=output,
                       duration_ms=calls.ms(started))

    async def _call_tool(self, name: str, parameters: Any, action: StartStep,
                         timeout: float | None, suffix: str = "",
                         own_output: tuple[Any] | None = None) -> Any:
        """Call a tool (or, with ``own_output``, the tool's own compensation)."""
        tool = self.x.registry.get(name)
        func = tool.func
        if own_output is not None:
            if tool.compensate is None:
                raise ToolError(f"tool {name!r} has no compensation", retryable=False)
            func = calls.bind_output(tool.compensate, own_output[0])
        run_id = self.run.run_id
        params = parameters if isinstance(parameters, dict) else {"value": parameters}
        recorded = own_output[0] if own_output is not None else None
        values = secrets.lookup(run_id, secrets.names_in(params) | secrets.names_in(recorded),
                                allow=self.x.app.settings.secrets_allow)
        params = secrets.reveal(params, values)
        step_call = not suffix and own_output is None  # a step's attempt, not its undo
        beat: list[Any] = []  # the attempt's heartbeats once it beat (executor.heartbeats)
        ctx = ToolContext(
            run_id=run_id, step_id=action.step_id, iteration=action.iteration,
            attempt=action.attempt,
            idempotency_key=key_of(self.run, action.step_id, action.iteration) + suffix,
            deadline=time.time() + timeout if timeout else None,
            logger=logging.getLogger(f"saga.tool.{name}"),
            traceparent=scope.current().span.traceparent,
            last_heartbeat=heartbeats.last_details(self.run, action)
            if step_call and action.attempt > 1 else None,
            on_heartbeat=heartbeats.beater(self, action, values, beat) if step_call else None,
        )
        if own_output is not None:
            assert tool.compensate is not None
            func = calls.bind_output(tool.compensate, secrets.reveal(recorded, values))
        else:
            problems = tool.check_parameters(params)
            if problems:  # rendered values can break a schema that templates passed
                message = "invalid parameters: " + "; ".join(problems)
                raise ToolError(secrets.conceal(message, values),
                                error_type="InvalidParameters", retryable=False)
        # The lease is checked here and nowhere later: immediately before the tool runs
        # (in its thread, for a blocking one), so a worker stopped anywhere before (after
        # its StepStarted, in a slot's wait, in the tool threads' queue) and continued
        # past its lease calls nothing once another took the run (break 7).
        if inspect.iscoroutinefunction(func):
            lease = self.lease
            if lease is not None and not lease.fresh(lease.renew_every):  # a round trip
                await asyncio.get_running_loop().run_in_executor(None, fence, lease, run_id)
            fence(lease, run_id)  # fresh now, or renewed just before: no round trip
            call = func(params, ctx)
        else:
            call = self._in_thread(_fenced, self.lease, run_id, func, params, ctx)
        step = self.plan.steps.get(action.step_id) if step_call else None
        if step is not None and step.heartbeat_timeout is not None and ctx.on_heartbeat:
            call = heartbeats.watched(call, ctx.on_heartbeat, step)
        try:
            result = await asyncio.wait_for(call, timeout) if timeout else await call
        except LeaseLostError:
            raise  # not the tool's failure: the drive gives the run up (see fence)
        except (ToolError, TimeoutError):
            if not values:
                raise
            raise calls.concealed(sys.exc_info()[1], values) from None
        except Exception as e:
            if not values:
                raise
            raise ToolError(secrets.conceal(str(e), values), error_type=type(e).__name__) \
                from None
        finally:
            beat.append(heartbeats.ENDED)  # later beats (a thread given up on) are not kept
        if ctx.usage and isinstance(result, dict):  # ctx.report_usage(): seed 003's tokens
            result = {**result, "_usage": {**ctx.usage, **result.get("_usage", {})}}
        return secrets.conceal(result, values)

    async def _in_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        # The thread sees this task's scope (logs, span), and hands its answer straight to
        # a future of this loop: asyncio.wrap_future chains two futures with callbacks on
        # both sides, a fifth of what a step on the tool threads cost beyond one run
        # inline (issue 44).
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        thread = self.x.submit(functools.partial(
            _answering, loop, answer, contextvars.copy_context().run, func, *args))
        task = asyncio.current_task()
        self.in_threads[task] = thread  # what a cut short leaves running (see _cut_short)
        try:
            return await answer
        except asyncio.CancelledError:
            thread.cancel()  # not started yet: it never starts (as wrap_future's did)
            raise
        finally:
            self.in_threads.pop(task, None)


def fence(lease: LeaseLike | None, run_id: str) -> None:
    """Raise LeaseLostError unless this worker surely holds ``run_id``'s lease: fresh by
    this process's clock for another renewal period (no round trip), or renewed now (a
    stopped or slow worker's); a renewal fails once another worker took the run. Called
    immediately before every tool call (DESIGN promise 8)."""
    if lease is None or lease.fresh(lease.renew_every):
        return
    if not lease.renew():
        raise LeaseLostError(run_id)


def _fenced(lease: LeaseLike | None, run_id: str, func: Callable[..., Any],
            *args: Any) -> Any:
    """``func(*args)`` in its tool thread, the lease checked first (see :func:`fence`)."""
    fence(lease, run_id)
    return func(*args)


def _answering(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Any],
               call: Callable[..., Any], *args: Any) -> Any:
    """``call(*args)`` in a tool thread, its result or error also set on ``answer`` in
    ``loop`` (unless the loop is gone, or the drive stopped waiting); the thread's own
    future gets them as well, for what watches it (calls still running, abandoned)."""
    try:
        result = call(*args)
    except BaseException as e:
        if not loop.is_closed():
            loop.call_soon_threadsafe(_settle, answer, None, e)
        raise
    if not loop.is_closed():
        loop.call_soon_threadsafe(_settle, answer, result, None)
    return result


def _settle(answer: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if answer.done():  # cancelled: the drive stopped waiting
        return
    if error is not None:
        answer.set_exception(error)
    else:
        answer.set_result(result)
