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
    LeaveUndone,
    Recorded,
    ReopenSteps,
    RequestApproval,
    RunRemedy,
    SkipStep,
    StartCompensation,
    StartLoop,
    StartStep,
)
from saga.scheduler.policy import (
    compensation_order,
    cut_call,
    heal_decision,
    interrupted,
    is_loop_parent,
    max_attempts,
    namespace,
    retry_decision,
    retry_pending,
    undo_order,
)
from saga.scheduler.step_list import confirmation_message, confirmation_timeout, layer_report

if TYPE_CHECKING:
    from saga.composition.graph_form import GraphPlan
    from saga.scheduler import graph
else:
    graph = lazy("saga.scheduler.graph")  # the graph form's rules, for its runs only

__all__ = [
    "Action", "CompensateStep", "CompleteStep", "FailStep", "FinishRun", "LeaveUndone",
    "Recorded",
    "ReopenSteps", "RequestApproval", "RunRemedy", "SkipStep", "StartCompensation",
    "StartLoop", "StartStep",
    "compensation_order", "confirmation_message", "confirmation_timeout", "decide",
    "heal_decision", "interrupted",
    "is_loop_parent", "layer_report", "max_attempts", "namespace", "nothing_follows",
    "retry_decision", "retry_pending", "undo_order",
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


def nothing_follows(plan: Plan, actions: list[Action]) -> bool:
    """Whether recording ``actions`` (what :func:`decide` just returned) leaves nothing
    new to decide, so the executor need not decide again before it acts on them.

    True when each action starts an attempt of a step of a step list that neither sleeps
    (its wait is timed by the executor's next look at the waits) nor waits for a signal
    (one already received would complete it at once): a tool, compute or ``use:`` step,
    or an iteration of a loop or a repeat. Such a start only marks its step running, and
    a running step finishes nothing: it readies no dependent, frees no slot and ends no
    run, and :func:`decide` returned every start the run's state allowed (a loop's
    iterations up to its limits). A retry that is not due yet is not recorded by the
    executor; deciding again would return the same start, nothing new. Any other action
    may lead to more, and the run is decided again; so is every decision of a graph,
    whose transitions have rules of their own that neither this reasoning nor its
    tests (``tests/scheduler/test_nothing_follows.py``, ``tests/executor/test_advance.py``)
    cover."""
    if not actions or plan.form == "graph":
        return False
    for action in actions:
        if type(action) is not StartStep:
            return False
        step = plan.step(action.step_id)
        if step.sleep is not None or step.signal is not None:
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
    if run.deadline_undoes_cut:  # the calls it cut short may have acted: undone first
        cut = [key for key, s in run.steps.items() if cut_call(plan, s)
               and (s.get("error") or {}).get("type") == "RunTimeout"
               and not is_loop_parent(plan, s)
               and plan.step(s["step_id"]).compensation is not None]
        order = [*reversed(cut), *order]
    if order:
        return [StartCompensation(reason, order)]
    return [FinishRun("failed", None, {"type": "RunTimeout", "message": reason})]
