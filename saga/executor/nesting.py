"""Nested compositions: a ``use`` step runs a child run linked to its parent.

The child's id is derived from the parent's run id, step id and iteration, so a parent
step re-executed after a crash finds the child it already started and drives it on
instead of starting a second one. The child records its parent in ``RunStarted``
(``context.parent``, and the parent's trace: ``context.trace_id`` and, with tracing on,
the step's span as ``context.traceparent``); the parent's step records the child's id in
its parameters and output. Children are driven only through their parents (workers skip them).
"""

from __future__ import annotations

from typing import Any

from saga import secrets
from saga.composition import load_child, plan_of
from saga.composition.definition import resolve_inputs
from saga.domain import Run
from saga.errors import RunNotFoundError, ToolError
from saga.scheduler import compensation_order
from saga.telemetry import scope, tracing


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
                              "iteration": iteration},
                   # the parent's trace: under the step's span when tracing is on
                   **tracing.trace_context(scope.current().span.traceparent,
                                           parent.context.get("trace_id") or parent.id.hex)}
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
    child = executor.app.get_run(output["run_id"])
    if child.status == "completed":
        order = compensation_order(plan_of(child), child)
        child.start_compensation(f"parent run {parent.run_id} is compensating", order,
                                 parent.actor)
        executor.app.save_run(child)
    if not child.is_finished:  # also a compensation cut short by a crash
        child = await executor.drive_async(child)
    if child.status not in ("compensated", "failed", "cancelled"):
        raise ToolError(f"child run {child.run_id} could not be compensated: {child.status}")
    return {"run_id": child.run_id, "status": child.status}
