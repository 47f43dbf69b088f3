"""How a step's wait (a ``sleep``, or a wait for a ``signal``) ends, as a drive records it:
due (its own length), or abandoned because its run stops having it; and why a run cuts
what it has in flight short (:func:`ending_cause`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from saga.domain import Run, StepState
from saga.executor.calls import ms_between_iso


def wait_length(state: StepState, wait: dict[str, Any]) -> int:
    """Milliseconds from the wait's start to its due time, both recorded: a durable wait
    ends when a worker looks, which may be long after (its StepCompleted's time says when
    that was, and a duration measured to it would count the worker's absence)."""
    return ms_between_iso(state.get("attempt_started_at"), datetime.fromisoformat(wait["until"]))


def abandon_wait(run: Run, state: StepState) -> None:
    """End the wait of a run that timed out or compensates (a cancel) as a failed attempt,
    never a step left running after its run ended."""
    run.fail_step(state["step_id"], state["iteration"], state["attempt"], *ending_cause(run))


def ending_cause(run: Run) -> tuple[str, str]:
    """Why a run that timed out or compensates (a cancel) cuts short what it has in flight,
    a wait or a call: the error type and message each such attempt fails with."""
    comp = run.compensation
    if run.timed_out:
        return "RunTimeout", f"the run's deadline {run.timed_out} passed"
    if comp is not None and comp.get("cancel"):
        return "RunCancelled", f"the run was cancelled: {comp['reason']}"
    return "RunCompensating", \
        f"the run compensates: {comp['reason'] if comp is not None else ''}"
