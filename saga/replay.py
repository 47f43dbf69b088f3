"""Replaying a recorded history through the current scheduler, and reporting divergence.

The replayer does not re-implement any decision: it folds the recorded events one by one
and, before each event that records a decision (a start, a skip, an approval request, a
rollback, an outcome), asks :func:`saga.scheduler.decide` what it would do in that state.
An event the scheduler would not have produced is a divergence. Events that record what
the world answered (a tool's output or error, a person's decision, a worker's death) are
taken as they are, but a failure's ``retryable`` verdict is checked against the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from saga import scheduler
from saga.chain import payload_of
from saga.composition import Plan, compile_any
from saga.domain import Run, step_key
from saga.errors import RunStateError
from saga.scheduler.actions import brief

_WORLD = {"StepCompleted", "ApprovalGranted", "ApprovalRejected", "RunRetried",
          "RemedyApplied", "StepWaiting", "SignalReceived", "RunPaused", "RunUnpaused",
          "RunTimedOut", "RetentionApplied", "RunTakenOver"}


@dataclass(frozen=True)
class Divergence:
    """The first recorded event the current scheduler would not have produced."""

    version: int
    event_type: str
    recorded: dict[str, Any]
    expected: list[str]

    def __str__(self) -> str:
        expected = "; ".join(self.expected) or "nothing (wait)"
        return (f"event {self.version} ({self.event_type}) diverges: recorded "
                f"{brief(self.recorded)}, the scheduler decides {expected}")


def verify(events: list[Any], plan: Plan | None = None) -> Divergence | None:
    """Fold ``events`` (domain events of one run, in order) through the scheduler; return
    the first divergence, or None when every decision is reproduced."""
    run: Run = events[0].mutate(None)
    plan = plan or compile_any(run.definition)
    for event in events[1:]:
        divergence = _check(plan, run, event)
        if divergence is not None:
            return divergence
        event.mutate(run)
    return None


def _check(plan: Plan, run: Run, event: Any) -> Divergence | None:
    kind = type(event).__name__
    step = plan.step(event.step_id) if kind == "StepCompleted" else None
    # a loop's list of outputs and a signal's delivery are decisions, not the world's answer
    derived = step is not None and ((event.iteration == 0 and step.iterates)
                                    or step.signal is not None)
    if (kind in _WORLD and not derived) or (kind == "CompensationStarted" and event.requested):
        return None  # what the world, or a person's command, answered
    if kind == "StepFailed":
        return _check_failure(plan, run, event)
    if kind == "HealStarted":
        return _check_heal(plan, run, event)
    expected = scheduler.decide(plan, run)
    if any(action.matches(kind, event) for action in expected):
        return None
    return Divergence(event.originator_version, kind, _payload(event),
                      [a.describe() for a in expected])


def _check_failure(plan: Plan, run: Run, event: Any) -> Divergence | None:
    state = run.step(step_key(event.step_id, event.iteration))
    if event.error_type in ("Interrupted", "Quarantined"):
        interrupted = scheduler.interrupted(plan, run)
        if any(a.step_id == event.step_id and a.error_type == event.error_type
               and (a.retry_at is not None) == event.retryable for a in interrupted):
            return None
        return Divergence(event.originator_version, "StepFailed", _payload(event),
                          [a.describe() for a in interrupted])
    if state["status"] != "running":  # decided before any call: a template or approval
        expected = scheduler.decide(plan, run)
        if any(a.matches("StepFailed", event) for a in expected):
            return None
        return Divergence(event.originator_version, "StepFailed", _payload(event),
                          [a.describe() for a in expected])
    heal = scheduler.heal_decision(plan, run, event.step_id, event.iteration, event.error_type,
                                   event.message)
    retry = heal is not None or scheduler.retry_decision(
        plan, event.step_id, event.attempt, event.error_type, True)
    if event.retryable and not retry:
        return Divergence(event.originator_version, "StepFailed", _payload(event),
                          [f"no retry of {event.step_id} after attempt {event.attempt}"])
    return None


def _check_heal(plan: Plan, run: Run, event: Any) -> Divergence | None:
    state = run.step(step_key(event.step_id, event.iteration))
    error = state.get("error") or {}
    heal = scheduler.heal_decision(plan, run, event.step_id, event.iteration,
                                   error.get("type", ""), error.get("message", ""))
    if heal is not None and heal == (event.handler, event.remedies):
        return None
    return Divergence(event.originator_version, "HealStarted", _payload(event),
                      [f"heal with {heal}" if heal else "no auto-heal"])


def _payload(event: Any) -> dict[str, Any]:
    return payload_of(event.__dict__)


def state_at(events: list[Any]) -> Run:
    """The run folded from these events (for ``--at``)."""
    run: Run = events[0].mutate(None)
    for event in events[1:]:
        event.mutate(run)
    return run


def state_at_point(events: list[Any], at: str, run_id: str) -> Run:
    """The run as it was at ``at``: a version number or an ISO timestamp (UTC if naive)."""
    if at.isdigit():
        chosen = [e for e in events if e.originator_version <= int(at)]
    else:
        try:
            moment = datetime.fromisoformat(at)
        except ValueError:
            raise RunStateError(f"--at {at!r} is neither a version nor an ISO time") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        chosen = [e for e in events if e.timestamp <= moment]
    if not chosen:
        raise RunStateError(f"run {run_id} did not exist yet at {at}")
    return state_at(chosen)
