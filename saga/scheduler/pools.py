"""Which pool each step start and compensation the scheduler decides needs (pure).

A step's ``pool`` names the workers that may run it (``saga worker --pool NAME``); its
compensation runs in the same pool (the undo needs the host the deed needed). The
executor asks :func:`needs` which of a run's next actions it may perform itself; replay
and the views ask :func:`waiting` which recorded ``StepAwaitingPool`` waits still hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saga.composition import Plan
from saga.domain import Run
from saga.domain.pools import recorded_waits
from saga.scheduler import decide
from saga.scheduler.actions import Action, CompensateStep, StartStep


@dataclass(frozen=True)
class PoolNeed:
    """One step start (``attempt``) or compensation the scheduler decides now, and the
    pool its step names (None: unpooled)."""

    step_id: str
    iteration: int
    attempt: int
    pool: str | None
    compensation: bool


def pool_of(plan: Plan, step_id: str) -> str | None:
    """The pool a step names (None: any worker that runs unpooled steps)."""
    try:
        return plan.step(step_id).pool
    except KeyError:  # a step the plan lacks is no pool's
        return None


def pooled(plan: Plan) -> bool:
    """Whether any step of the plan names a pool (a plan without one needs no look)."""
    return any(step.pool is not None for step in plan.definition.steps)


def need_of(plan: Plan, action: Action) -> PoolNeed | None:
    """The pool need of one action (None: not a step start or compensation)."""
    if isinstance(action, StartStep):
        return PoolNeed(action.step_id, action.iteration, action.attempt,
                        pool_of(plan, action.step_id), False)
    if isinstance(action, CompensateStep) and action.error is None:
        return PoolNeed(action.step_id, action.iteration, 0, pool_of(plan, action.step_id),
                        True)
    return None


def needs(plan: Plan, actions: list[Action]) -> list[PoolNeed]:
    """The pool needs of these actions (the scheduler's decision), in their order."""
    return [need for action in actions if (need := need_of(plan, action)) is not None]


def matches(need: PoolNeed, wait: dict[str, Any]) -> bool:
    """Whether a recorded wait (``StepAwaitingPool``) is for this need."""
    return (wait["step_id"], wait["iteration"], bool(wait["compensation"]), wait["pool"]) \
        == (need.step_id, need.iteration, need.compensation, need.pool) \
        and (need.compensation or wait["attempt"] == need.attempt)


def waiting(plan: Plan, run: Run, actions: list[Action] | None = None
            ) -> list[dict[str, Any]]:
    """The recorded pool waits that still hold: the scheduler would start the step's
    attempt (or its compensation) now, and no worker of its pool has yet. ``actions``:
    the scheduler's decision, if the caller has it already."""
    recorded = recorded_waits(run)
    if not recorded or run.is_finished:
        return []
    if actions is None:
        actions = decide(plan, run)
    now = needs(plan, actions)
    return [wait for wait in recorded.values() if any(matches(n, wait) for n in now)]
