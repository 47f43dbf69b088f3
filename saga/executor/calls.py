"""What one call of a step, remedy or compensation comes to (:class:`Outcome`), and the
pieces of performing it that need no drive: retry delays, failures as outcomes, checks
of what a tool answered, concealing secrets in errors, waiting for the first call to
end."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeVar

from saga import expressions, secrets
from saga.chain import json_safe
from saga.composition import Plan
from saga.composition.definition import RetryPolicy, Step
from saga.errors import ExpressionError, LeaseLostError, ToolError
from saga.lazy import lazy
from saga.tools import ToolContext

if TYPE_CHECKING:
    import tenacity
else:
    tenacity = lazy("tenacity")  # only a retry's wait needs it

log = logging.getLogger("saga.executor")
_DEFAULT_RETRY = RetryPolicy()
_Task = TypeVar("_Task", bound="asyncio.Future[Any]")


class Wakeup:
    """``asyncio.wait(..., return_when=FIRST_COMPLETED)`` for a drive, whose tasks are
    awaited turn after turn: each task is watched once, when it begins, where
    asyncio.wait adds a callback to every task and removes it again at every turn (about
    5 µs of a noop step's 110–120 here).

    A call that woke the wait itself (:meth:`wake`) has its callback wake the drive's
    next wait too, which then looks once more. Left so on purpose: where the drive's
    append does not wait, that wake lets it resume in the same turn as its next call
    ends, and suppressing it cost 1.7% more instructions per step."""

    def __init__(self) -> None:
        self._waiting: asyncio.Future[None] | None = None
        self._poked = False

    def watch(self, task: _Task) -> _Task:
        """Wake :meth:`first_done` when ``task`` ends; the task."""
        task.add_done_callback(self._wake)
        return task

    def _wake(self, _: asyncio.Future[Any]) -> None:
        self.wake()

    def wake(self) -> None:
        """Wake :meth:`first_done` now, from a watched task about to end (its callback
        would take one more turn of the event loop)."""
        if self._waiting is not None and not self._waiting.done():
            self._waiting.set_result(None)

    def poke(self) -> None:
        """End the wait of :meth:`first_done` (now, or the next one) with nothing done:
        the drive has news of another kind (see saga.executor.incoming)."""
        self._poked = True
        self.wake()

    async def first_done(self, tasks: list[asyncio.Future[Any]]) -> list[asyncio.Future[Any]]:
        """Those of ``tasks`` (each watched) that have ended, once one has (none when
        :meth:`poke` ended the wait)."""
        while not (done := [task for task in tasks if task.done()]):
            if self._poked:
                self._poked = False
                break
            self._waiting = asyncio.get_running_loop().create_future()
            await self._waiting
        return done


@dataclass(frozen=True)
class Outcome:
    """What happened when the executor performed one call."""

    kind: str  # "step", "compensation", "remedy", "timer", "wake", "child" or "cut"
    step_id: str
    iteration: int
    attempt: int
    ok: bool = True
    output: Any = None
    error_type: str = ""
    message: str = ""
    retryable: bool = True
    duration_ms: int = 0
    cache: dict[str, Any] | None = None
    heartbeat: dict[str, Any] | None = None  # what its tool last beat (executor.heartbeats)

    def __post_init__(self) -> None:
        # Whatever a tool answered must be recordable (promise 1 hangs on it).
        object.__setattr__(self, "output", json_safe(self.output))
        object.__setattr__(self, "message", json_safe(self.message))


def wait_strategy(policy: RetryPolicy) -> tenacity.wait.wait_base:
    """A retry policy as tenacity's wait strategy: the one place specs become tenacity."""
    if policy.backoff == "fixed":
        base: tenacity.wait.wait_base = tenacity.wait_fixed(policy.delay)
    elif policy.backoff == "linear":
        base = tenacity.wait_incrementing(start=policy.delay, increment=policy.delay,
                                          max=policy.max_delay)
    else:
        base = tenacity.wait_exponential(multiplier=policy.delay, exp_base=policy.multiplier,
                                         max=policy.max_delay)
    return base + tenacity.wait_random(0, policy.jitter) if policy.jitter else base


def retry_delay(policy: RetryPolicy, attempt: int) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (jitter included)."""
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(),
                                    kwargs={})
    state.attempt_number = attempt
    return float(wait_strategy(policy)(state))



def concealed(error: BaseException | None, values: dict[str, str]) -> BaseException:
    """The same failure, with any secret value in its message replaced by its marker."""
    if isinstance(error, ToolError):
        return ToolError(secrets.conceal(error.message, values), error_type=error.error_type,
                         retryable=error.retryable)
    return error or ToolError("failed")


def bind_output(compensate: Callable[..., Any], output: Any) -> Callable[..., Any]:
    """A tool's own compensation ``(params, output, ctx)`` as a ``(params, ctx)`` call."""
    if inspect.iscoroutinefunction(compensate):
        async def call_async(params: Any, ctx: ToolContext) -> Any:
            return await compensate(params, output, ctx)
        return call_async

    def call(params: Any, ctx: ToolContext) -> Any:
        return compensate(params, output, ctx)
    return call


def default_policy(plan: Plan) -> RetryPolicy:
    if plan.definition.error_handling.failure_strategy == "retry":
        return RetryPolicy(delay=0.5, multiplier=2.0)
    return _DEFAULT_RETRY


def failure(kind: str, step_id: str, iteration: int, attempt: int, e: Exception,
            timeout: float | None, started: float) -> Outcome:
    """A call that raised, as the failed outcome to record (type, message, retryable)."""
    if isinstance(e, TimeoutError):
        error_type, message, retryable = "timeout", f"timed out after {timeout:g}s", True
    elif isinstance(e, ToolError):
        error_type, message, retryable = e.error_type, e.message, e.retryable
    elif isinstance(e, ExpressionError):  # ExpressionLimit says so by its type
        error_type, message, retryable = type(e).__name__, str(e), False
    else:
        error_type, message, retryable = type(e).__name__, str(e) or type(e).__name__, True
    return Outcome(kind, step_id, iteration, attempt, ok=False, error_type=error_type,
                   message=message, retryable=retryable, duration_ms=ms(started))


def check_expectation(step: Step, output: Any) -> None:
    """A step with ``expect`` fails when its condition, over ``output``, is false (a gate
    that answers ``passed: false``)."""
    if step.expect is not None and not expressions.evaluate(step.expect, {"output": output}):
        shown = "" if step.secret_outputs else f" (output {output!r:.200})"  # kept out
        raise ToolError(f"expectation not met: {step.expect}{shown}",
                        error_type="ExpectationFailed", retryable=False)


def outcome_of(task: asyncio.Task[Outcome], kind: str, step_id: str, iteration: int,
               number: int) -> Outcome:
    """A finished call's outcome; an error no call path caught becomes a recorded failure
    of that attempt, never an exception that leaves the attempt running forever."""
    try:
        return task.result()
    except LeaseLostError:
        raise  # another worker took the run before the call (calling.fence): stop
    except Exception as e:
        return Outcome(kind, step_id, iteration, number, ok=False, error_type=type(e).__name__,
                       message=f"unexpected error: {e}", retryable=False)


def quiet(future: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """``future``, its error taken once it ends: a call given up on that ends in error
    in its thread (fenced off, say) has been dealt with, and asyncio would log it as
    never retrieved."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


async def returned(thread: Future[Any]) -> None:
    """Wait until a call in a tool thread has returned (or raised)."""
    with contextlib.suppress(Exception):
        await asyncio.wrap_future(thread)


def ms_between_iso(start: str | None, end: datetime) -> int:
    if start is None:
        return 0
    return max(round((end - datetime.fromisoformat(start)).total_seconds() * 1000), 0)


def check_json(value: Any) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise ToolError(f"output is not JSON: {e}", error_type="OutputNotJSON",
                        retryable=False) from e


def ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)



def tool_label(step: Step) -> str:
    """What a step calls, as metrics and spans name it: its tool, else ``compute``,
    ``use``, ``sleep`` or ``signal``."""
    if step.tool is not None:
        return step.tool
    for kind in ("compute", "use", "sleep", "signal"):
        if getattr(step, kind) is not None:
            return kind
    return "unknown"


def lease_seen(lease: Any, run_id: str) -> dict[str, Any] | None:
    """What a lease just taken over shows of the worker it was taken from: who, when its
    lease expired, and so when it last renewed it (a fleet shares its lease length; see
    ``Run.RunTakenOver``); None when it was free, or no lease is held."""
    previous = getattr(lease, "previous", None)
    try:
        found = previous() if previous is not None else None
    except Exception as e:  # a fact missing blames nobody
        log.warning("run %s: could not read its lease's last holder: %s", run_id, e)
        return None
    if found is None:
        return None
    worker, expired = found
    renewed = expired - float(getattr(lease, "seconds", 0.0))
    return {"worker": worker, "expired_at": datetime.fromtimestamp(expired, UTC).isoformat(),
            "renewed_at": datetime.fromtimestamp(renewed, UTC).isoformat()}
