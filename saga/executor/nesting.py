"""Nested compositions: a ``use`` step runs a child run linked to its parent.

The child's id is derived from the parent's run id, step id and iteration, so a parent
step re-executed after a crash finds the child it already started and drives it on
instead of starting a second one. The child records its parent in ``RunStarted``
(``context.parent``, and the parent's trace: ``context.trace_id`` and, with tracing on,
the step's span as ``context.traceparent``); the parent's step records the child's id in
its parameters and output. Children are driven only through their parents (workers skip them).
A child that waits (an approval, a signal, a timer) makes its parent's step wait for it
(:class:`ChildWaits`); a worker drives it on through its parent when the child is approved
or signalled or its time comes. A parent never ends leaving its child unfinished: a child
whose parent's step ended without it, or whose parent ends, is cancelled and undone
(:func:`compensate_child`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from saga import secrets
from saga.composition import Plan, load_child, plan_of
from saga.composition.definition import resolve_inputs
from saga.domain import Run
from saga.errors import RunNotFoundError, ToolError
from saga.scheduler import compensation_order, is_loop_parent, retry_pending
from saga.telemetry import scope, tracing

log = logging.getLogger("saga.executor")


@dataclass(frozen=True)
class ChildWaits:
    """A child run's drive ended with the child waiting: its parent's step waits for it
    (recorded as a wait naming the child), holding no worker, and is driven on when the
    child is approved or signalled or ``until`` (the child's own next time) comes."""

    run_id: str
    until: str | None


def next_time(run: Run) -> str | None:
    """When a waiting run's own next time comes (ISO): a timer, a signal's or an
    approval's timeout, a retry or its deadline; None when it waits only for someone."""
    times = [w["until"] for w in run.waits.values() if w.get("until")]
    times += [a["until"] for a in run.approvals.values()
              if a["status"] == "requested" and a.get("until")]
    times += [s["retry_at"] for s in run.unsettled.values()
              if s["status"] == "failed" and s.get("retry_at")]
    if run.deadline is not None and run.compensation is None:
        times.append(run.deadline)
    return min(times, key=datetime.fromisoformat) if times else None


async def run_child(executor: Any, parent: Run, step_id: str, iteration: int,
                    parameters: dict[str, Any]) -> dict[str, Any] | ChildWaits:
    """Start (or find) the child run and drive it until it ends (its outputs are the
    step's) or waits (:class:`ChildWaits`)."""
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
    if not child.is_finished:  # it waits (a person, a signal, a time): its parent waits too
        return ChildWaits(child.run_id, next_time(child))
    if child.status == "completed":
        return {"run_id": child.run_id, "status": child.status, "outputs": child.outputs}
    error = (child.error or {}).get("message", "")
    raise ToolError(f"child run {child.run_id} ended {child.status}: {error}",
                    error_type="ChildRunFailed", retryable=False,
                    details={"run_id": child.run_id})


async def compensate_child(executor: Any, parent: Run, child_id: str) -> dict[str, Any]:
    """Undo a child run: a completed one by its own compensations, in its own reverse
    order; one not finished (it waits, or its parent's step was cut short) is cancelled,
    its completed steps undone the same way."""
    child = executor.app.get_run(child_id)
    if child.status == "completed" or (not child.is_finished and child.compensation is None):
        order = compensation_order(plan_of(child), child)
        cancel = not child.is_finished
        reason = f"parent run {parent.run_id} is {'ending' if cancel else 'compensating'}"
        # Always a request (an actor): the child's own scheduler would not decide it.
        child.start_compensation(reason, order, parent.actor or "saga", cancel)
        executor.app.save_run(child)
    if not child.is_finished:  # also a compensation cut short by a crash
        child = await executor.drive_async(child)
    if child.status not in ("compensated", "failed", "cancelled"):
        raise ToolError(f"child run {child.run_id} could not be compensated: {child.status}")
    return {"run_id": child.run_id, "status": child.status}


async def end_child(executor: Any, parent: Run, child_id: str) -> None:
    """End a child run its parent is leaving behind: cancelled, its completed steps undone
    (nothing when it is not there, or has ended already)."""
    try:
        child = executor.app.get_run(child_id)
    except RunNotFoundError:
        return  # its parent's worker died before the child was recorded
    if not child.is_finished:
        await compensate_child(executor, parent, child_id)


async def end_children(executor: Any, plan: Plan, run: Run, done: set[str],
                       flying: list[tuple[str, str, int, int]]) -> None:
    """Nothing outlives its parent (promise 7): the child run of a ``use:`` step that
    ended without it (failed for good: interrupted, quarantined, timed out), or that
    waits while its parent ends (fails, compensates, is cancelled or times out), is
    cancelled and its completed steps undone, before the parent's end is recorded. A
    child that a call in ``flying`` (the drive's step calls in flight) drives is left
    to it; ``done`` keeps the ones ended already (as ``ended:KEY``)."""
    ending = run.compensation is not None or run.is_finished or bool(run.timed_out)
    busy = {(step_id, iteration) for _, step_id, iteration, _ in flying}
    for key, state in list(run.unsettled.items()):
        child = (state.get("parameters") or {}).get("run")
        if state["status"] not in ("failed", "running") or not child \
                or f"ended:{key}" in done or (state["step_id"], state["iteration"]) in busy \
                or plan.step(state["step_id"]).use is None or is_loop_parent(plan, state):
            continue
        if state["status"] == "failed":
            cut = ending or not retry_pending(state)
        else:
            cut = ending and bool(state.get("wait"))
        if not cut:
            continue
        done.add(f"ended:{key}")
        try:
            await end_child(executor, run, child)
        except Exception as e:  # the parent still ends; the child shows what it is
            log.warning("run %s: could not end its child run %s: %s", run.run_id, child, e)
