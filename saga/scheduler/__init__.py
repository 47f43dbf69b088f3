"""Deciding what a run does next: ``decide(plan, run) -> actions``. Pure.

The scheduler reads only the compiled plan and the run's folded state; it never reads
the clock, the environment or randomness, so replaying a history through it reproduces
the recorded decisions. Each composition form has its own readiness rules
(:mod:`~saga.scheduler.step_list`, :mod:`~saga.scheduler.graph`); what they share
(retries, interrupts, auto-heal, compensation) is :mod:`~saga.scheduler.policy`, and
what they decide is :mod:`~saga.scheduler.actions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from saga.composition import Plan
from saga.domain import Run
from saga.lazy import lazy
from saga.scheduler import step_list
from saga.scheduler.actions import (
    Action,
    CompensateStep,
    CompleteStep,
    FailStep,
    FinishRun,
    Recorded,
    RequestApproval,
    RunRemedy,
    SkipStep,
    StartCompensation,
    StartLoop,
    StartStep,
)
from saga.scheduler.policy import (
    compensation_order,
    heal_decision,
    interrupted,
    is_loop_parent,
    max_attempts,
    namespace,
    retry_decision,
    retry_pending,
)
from saga.scheduler.step_list import confirmation_message, confirmation_timeout, layer_report

if TYPE_CHECKING:
    from saga.composition.graph_form import GraphPlan
    from saga.scheduler import graph
else:
    graph = lazy("saga.scheduler.graph")  # the graph form's rules, for its runs only

__all__ = [
    "Action", "CompensateStep", "CompleteStep", "FailStep", "FinishRun", "Recorded",
    "RequestApproval", "RunRemedy", "SkipStep", "StartCompensation", "StartLoop", "StartStep",
    "compensation_order", "confirmation_message", "confirmation_timeout", "decide",
    "heal_decision", "interrupted",
    "is_loop_parent", "layer_report", "max_attempts", "namespace", "retry_decision",
    "retry_pending", "settles",
]


#: What a paused run does not do: start work (steps, loops, remedies, compensations).
_WORK = (StartStep, StartLoop, RunRemedy, CompensateStep, StartCompensation)


def decide(plan: Plan, run: Run) -> list[Action]:
    """The actions that follow from the run's recorded state; empty when it must wait."""
    if run.is_finished:
        return []
    if run.timed_out and run.compensation is None:
        return _timed_out(plan, run)
    actions = graph.decide(cast("GraphPlan", plan), run) if plan.form == "graph" \
        else step_list.decide(plan, run)
    if run.paused:
        return [a for a in actions if not isinstance(a, _WORK)]
    return actions


def settles(plan: Plan, actions: list[Action]) -> bool:
    """Whether a run that has just recorded ``actions`` (all that :func:`decide`
    returned) has nothing new to decide, so its executor need not ask again.

    True when each action starts an attempt of a plain step of a step list (no loop,
    repeat, sleep or signal wait). Such a start only marks its step running: a running
    step finishes nothing, so it readies no dependent, frees no slot and ends no run,
    and :func:`decide` returned every start the run's state allowed. Any other action,
    or a step of a graph (whose transitions have rules of their own), may lead to more,
    and the run is decided again."""
    if not actions or plan.form == "graph":
        return False
    for action in actions:
        if type(action) is not StartStep or action.iteration != 0:
            return False
        step = plan.step(action.step_id)
        if step.loop is not None or step.until is not None or step.sleep is not None \
                or step.signal is not None:
            return False
    return True


def _timed_out(plan: Plan, run: Run) -> list[Action]:
    """A run past its deadline: once no attempt is in flight, undo what it did (or fail
    when there is nothing to undo)."""
    if any(s["status"] == "running" and not s.get("wait") and not is_loop_parent(plan, s)
           for s in run.steps.values()):
        return []
    reason = f"the run's deadline {run.timed_out} passed"
    order = compensation_order(plan, run)
    if order:
        return [StartCompensation(reason, order)]
    return [FinishRun("failed", None, {"type": "RunTimeout", "message": reason})]
