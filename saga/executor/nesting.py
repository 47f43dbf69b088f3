"""Nested compositions: a ``use`` step runs a child run linked to its parent.

The child's id is derived from the parent's run id, step id and iteration, so a parent
step re-executed after a crash finds the child it already started and drives it on
instead of starting a second one. The child records its parent in ``RunStarted``
(``context.parent``); the parent's step records the child's id in its parameters and
output. Children are driven only through their parents (workers skip them).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saga import secrets
from saga.definition import load_file, resolve_inputs
from saga.errors import DefinitionError, Problem, RunNotFoundError, ToolError

if TYPE_CHECKING:
    from saga.domain import Run

_NAMESPACE = uuid.UUID("0b7d2c1e-5a4f-4f7e-9d61-2f8a3c9e1b55")


def child_run_id(parent_run_id: str, step_id: str, iteration: int) -> str:
    """The id of the child run a ``use`` step starts (the same on every re-execution)."""
    return str(uuid.uuid5(_NAMESPACE, f"{parent_run_id}:{step_id}:{iteration}"))


def resolve(use: str) -> Path:
    """The composition a ``use`` names: a file (absolute or relative to the working
    directory), else a template by name."""
    path = Path(use)
    if path.is_file():
        return path
    try:
        from saga.templates import find_template
    except ImportError:  # pragma: no cover - the template library ships with saga
        find_template = None
    if find_template is not None:
        try:
            return find_template(use)
        except Exception as e:
            raise DefinitionError([Problem("use", f"no composition file or template {use!r}: "
                                                  f"{e}")]) from e
    raise DefinitionError([Problem("use", f"no composition file or template {use!r}")])


def load_child(use: str, tools: Any, seen: tuple[str, ...] = ()) -> Any:
    """Load and validate a nested composition (and, recursively, the ones it uses)."""
    from saga.plan import compile_any

    path = resolve(use)
    key = str(path.resolve())
    if key in seen:
        chain = " -> ".join([*seen, key])
        raise DefinitionError([Problem("use", f"compositions use each other in a cycle: {chain}")])
    plan = compile_any(load_file(path), tools=tools, source=str(path))
    for step in plan.definition.steps:
        if step.use is not None:
            load_child(step.use, tools, (*seen, key))
        if step.confirm or plan.definition.confirmations:
            raise DefinitionError([Problem("use", f"{path} waits for approvals, which a "
                                                  "nested composition cannot do")])
    return plan


async def run_child(executor: Any, parent: Run, step_id: str, iteration: int,
                    parameters: dict[str, Any]) -> dict[str, Any]:
    """Start (or find) the child run and drive it to its end; its outputs are the step's."""
    app = executor.app
    child_id = parameters["run"]
    try:
        child = app.get_run(child_id)
    except RunNotFoundError:
        plan = load_child(parameters["use"], executor.registry.tools())
        try:
            inputs = resolve_inputs(plan.definition, dict(parameters.get("inputs") or {}))
        except Exception as e:
            raise ToolError(str(e), error_type="ChildInputError", retryable=False) from e
        context = {"actor": parent.actor, "labels": {}, "mode": parent.context.get("mode"),
                   "parent": {"run_id": parent.run_id, "step_id": step_id,
                              "iteration": iteration}}
        child = app.start(plan, inputs, context, {}, run_id=child_id)
    secrets.share(parent.run_id, child_id)
    if not child.is_finished:
        child = await executor.drive_async(child)
    if child.status == "completed":
        return {"run_id": child.run_id, "status": child.status, "outputs": child.outputs}
    error = (child.error or {}).get("message", "")
    raise ToolError(f"child run {child.run_id} ended {child.status}: {error}",
                    error_type="ChildRunFailed", retryable=False,
                    details={"run_id": child.run_id})


async def compensate_child(executor: Any, parent: Run, output: Any) -> dict[str, Any]:
    """Undo a completed child run (its own compensations, in its own reverse order)."""
    from saga.scheduler import compensation_order

    child = executor.app.get_run(output["run_id"])
    if child.status == "completed":
        order = compensation_order(executor.plan_for(child), child)
        child.start_compensation(f"parent run {parent.run_id} is compensating", order,
                                 parent.actor)
        executor.app.save_run(child)
    if not child.is_finished:  # also a compensation cut short by a crash
        child = await executor.drive_async(child)
    if child.status not in ("compensated", "failed", "cancelled"):
        raise ToolError(f"child run {child.run_id} could not be compensated: {child.status}")
    return {"run_id": child.run_id, "status": child.status}
