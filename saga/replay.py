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
from saga.scheduler import policy, pools
from saga.scheduler.actions import brief

_WORLD = {"StepCompleted", "ApprovalGranted", "ApprovalRejected", "RunRetried",
          "RemedyApplied", "StepWaiting", "SignalReceived", "RunPaused", "RunUnpaused",
          "RunTimedOut", "RetentionApplied", "RunTakenOver", "DefinitionMigrated",
          "RunLabelled", "RunReset", "HeartbeatRecorded"}


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

    @property
    def step(self) -> str | None:
        """The step the diverging event is about, if it is about one."""
        step = self.recorded.get("step_id")
        return str(step) if step is not None else None

    def as_migration(self) -> str:
        """This divergence as a refused migration names it: the step, what the run's
        definition decided (recorded), what the new one decides."""
        expected = "; ".join(self.expected) or "nothing (wait)"
        where = f"step {self.step}" if self.step else f"event {self.version}"
        shown = {k: v for k, v in self.recorded.items()
                 if k not in ("step_id", "worker", "idempotency_key")}
        if "parameters" in shown:
            shown = {"parameters": shown["parameters"]}
        return (f"{where}: the run's definition decided {self.event_type} "
                f"{brief(shown)} (event {self.version}); the new definition decides "
                f"{expected}")

    def as_dict(self) -> dict[str, Any]:
        """The divergence as JSON."""
        return {"version": self.version, "event_type": self.event_type, "step": self.step,
                "recorded": self.recorded, "expected": self.expected}


def verify(events: list[Any], plan: Plan | None = None) -> Divergence | None:
    """Fold ``events`` (domain events of one run, in order) through the scheduler; return
    the first divergence, or None when every decision is reproduced. Each decision is
    checked against the definition in force when it was made (a ``DefinitionMigrated``
    changes it)."""
    run: Run = events[0].mutate(None)
    plan = plan or compile_any(run.definition)
    for event in events[1:]:
        divergence = _check(plan, run, event)
        if divergence is not None:
            return divergence
        event.mutate(run)
        if type(event).__name__ == "DefinitionMigrated":
            plan = compile_any(run.definition)
    return None


def check_migration(events: list[Any], new: Plan) -> Divergence | None:
    """Whether the run of ``events`` may move to ``new``: its history folded through the
    scheduler with ``new`` must reproduce every recorded decision (the same steps started,
    in the same order, with the same rendered parameters, the same skips, approvals and
    compensations). Returns the first divergence, None when the move is safe. A ``use:``
    step whose child run already started diverges when ``new`` changes its target."""
    run: Run = events[0].mutate(None)
    old = compile_any(run.definition)
    for event in events[1:]:
        kind = type(event).__name__
        divergence = _missing_step(new, event) or _check(new, run, event) \
            or _changed_target(old, new, event) or _changed_compensation(old, new, run, event)
        if divergence is not None:
            return divergence
        event.mutate(run)
        if kind == "DefinitionMigrated":
            old = compile_any(run.definition)
    return None


def _missing_step(new: Plan, event: Any) -> Divergence | None:
    step_id = getattr(event, "step_id", None)
    if step_id is None or _has(new, step_id):
        return None
    return Divergence(event.originator_version, type(event).__name__, _payload(event),
                      [f"nothing: it has no step {step_id!r}"])


def _has(plan: Plan, step_id: str) -> bool:
    try:
        plan.step(step_id)
    except KeyError:
        return False
    return True


def _changed_target(old: Plan, new: Plan, event: Any) -> Divergence | None:
    if type(event).__name__ != "StepStarted" or not _has(old, event.step_id):
        return None
    was, now = old.step(event.step_id).use, new.step(event.step_id).use
    if was == now:
        return None
    return Divergence(event.originator_version, "StepStarted", _payload(event),
                      [f"StartStep {event.step_id} using {now!r} (its child run, of "
                       f"{was!r}, already started)"])


def _changed_compensation(old: Plan, new: Plan, run: Run, event: Any) -> Divergence | None:
    """A recorded compensation must be the one the new definition would run."""
    kind = type(event).__name__
    if kind not in ("StepCompensated", "CompensationFailed") or run.compensation is None:
        return None
    was = policy.next_compensation(old, run, scheduler.namespace(old, run))
    now = policy.next_compensation(new, run, scheduler.namespace(new, run))
    if was is None or now is None or (was.tool, was.parameters) == (now.tool, now.parameters):
        return None
    return Divergence(event.originator_version, kind, _payload(event),
                      [f"CompensateStep {now.step_id} with {now.tool} {brief(now.parameters)}"])


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
    if kind == "StepAwaitingPool":  # a step the scheduler starts now waits for its pool
        return None if any(pools.matches(need, event.__dict__) for need in
                           pools.needs(plan, expected)) else Divergence(
            event.originator_version, kind, _payload(event), [a.describe() for a in expected])
    if kind == "StepWaitingForResource":  # a start the scheduler decides waits for a slot
        start = (event.step_id, event.iteration, event.attempt)
        if any(isinstance(a, scheduler.StartStep)
               and (a.step_id, a.iteration, a.attempt) == start for a in expected):
            return None
        return Divergence(event.originator_version, kind, _payload(event),
                          [a.describe() for a in expected])
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
