"""Events of a run's undo calls: a compensation call about to be made, and a step left
not undone because its undo cannot be said.

They are events of :class:`~saga.domain.run.Run` like any other, declared here (as
:mod:`saga.domain.waits` declares its own) because ``run.py`` is at its size limit, and
attached to ``Run`` when this module is imported (``saga.domain`` imports it). Their
handlers only change state.

A compensation is recorded as a step attempt is: ``StepCompensationStarted`` is durable
before the undo is called, with the rendered parameters and the idempotency key the tool
sees. So a worker that takes the run over from one that died (or was stopped past its
lease) in the middle of an undo knows the undo was in flight: ``RunTakenOver`` counts it
interrupted (see :meth:`~saga.domain.steps.StepStates._interrupt`), and the undo runs
again, knowingly, under the same key (at least once, as an interrupted step does). A
run recorded before these events has none: its undos are simply undone or failed.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.utils import register_topic

from saga.domain.run import Run
from saga.domain.vocabulary import step_key


def undo_calls(comp: dict[str, Any] | None) -> dict[str, int]:
    """The undo calls a rollback started, by step key: how many times each was started
    (its last attempt's number). Empty for a rollback recorded before the calls were."""
    return (comp or {}).get("calls") or {}


def undos_in_flight(comp: dict[str, Any] | None) -> list[str]:
    """The keys of the undo calls a rollback started and has not recorded the end of."""
    if not comp:
        return []
    return [key for key in undo_calls(comp) if key not in comp["done"]]


class StepCompensationStarted(Run.Event):
    """A step execution's compensation is about to be called: ``attempt`` (1 first, one
    more after each interruption), the ``tool`` (None: the step tool's own undo, or a
    child run's), its rendered ``parameters`` and the ``idempotency_key`` the tool sees.
    Durable before the call, so a worker that takes the run over knows it was in flight.
    (``CompensationStarted`` is the rollback's, for the run as a whole.)"""

    TOPIC = "saga.StepCompensationStarted"
    step_id: str
    iteration: int
    attempt: int
    tool: str | None
    parameters: Any
    idempotency_key: str
    worker: str | None

    def apply(self, aggregate: Any) -> None:
        comp = aggregate.compensation
        key = step_key(self.step_id, self.iteration)
        comp.setdefault("calls", {})[key] = self.attempt


class StepNotUndone(Run.Event):
    """A step execution the rollback leaves in place, and why: its attempt was cut short
    before its output was recorded, and its compensation reads that output, so it cannot
    be said. The step is named not undone (it may have acted); the other undos go on,
    and the run is not failed for it, as for a step with no compensation."""

    TOPIC = "saga.StepNotUndone"
    step_id: str
    iteration: int
    reason: str

    def apply(self, aggregate: Any) -> None:
        key = step_key(self.step_id, self.iteration)
        aggregate.compensation["done"][key] = "not_undone"
        aggregate.steps[key]["not_undone"] = self.reason


def start_undo(run: Run, step_id: str, iteration: int, attempt: int, tool: str | None,
               parameters: Any, key: str, worker: str | None) -> None:
    """Record that a compensation call is about to be made (see the event)."""
    run.trigger_event(StepCompensationStarted, step_id=step_id, iteration=iteration,
                      attempt=attempt, tool=tool, parameters=parameters, idempotency_key=key,
                      worker=worker, actor=run._undoer())


def leave_undone(run: Run, step_id: str, iteration: int, reason: str) -> None:
    """Record that a step execution is left not undone, and why (see the event)."""
    run.trigger_event(StepNotUndone, step_id=step_id, iteration=iteration, reason=reason,
                      actor=run._undoer())


EVENTS = (StepCompensationStarted, StepNotUndone)
for _cls in EVENTS:
    setattr(Run, _cls.__name__, _cls)
    register_topic(_cls.TOPIC, _cls)
