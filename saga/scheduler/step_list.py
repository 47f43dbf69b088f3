"""Deciding what a run of the step-list form does next: ``decide(plan, run) -> actions``.

Pure: it reads only the plan and the run's folded state (recorded inputs, outputs,
context); never the clock, the environment or randomness, so replaying a history through
it reproduces the recorded decisions. Templates and conditions are evaluated here because
they are functions of recorded data; tools are called by the executor.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from saga import expressions
from saga.composition import Plan
from saga.composition.definition import Step, parse_duration
from saga.domain import Run, StepState, child_run_id, ms_between, step_key
from saga.errors import ExpressionError
from saga.scheduler.actions import (
    Action,
    CompleteStep,
    FailStep,
    FinishRun,
    RequestApproval,
    RunRemedy,
    SkipStep,
    StartCompensation,
    StartLoop,
    StartStep,
)
from saga.scheduler.policy import (
    CUT_SHORT,
    compensation_ending,
    compensation_order,
    is_loop_parent,
    namespace,
    next_compensation,
    retry_pending,
)


class _View:
    """What decide needs to know about the run, derived once per call (the expression
    namespace only when an expression is evaluated: most decisions need none)."""

    def __init__(self, plan: Plan, run: Run) -> None:
        self.plan, self.run = plan, run

    @functools.cached_property
    def namespace(self) -> dict[str, Any]:
        """What expressions see (see :func:`saga.scheduler.policy.namespace`)."""
        return namespace(self.plan, self.run)


def decide(plan: Plan, run: Run) -> list[Action]:
    """The actions that follow from the run's recorded state; empty when it must wait."""
    if run.is_finished:
        return []
    view = _View(plan, run)
    if run.compensation is not None:
        return _compensation(view)
    blocking = _blocking_failure(view)
    strategy = plan.definition.error_handling.failure_strategy
    if blocking is not None and strategy != "partial_success":
        if _busy(view):  # nothing new starts; attempts in flight (and due retries) finish
            return [_retry(plan.step(s["step_id"]), s["iteration"], s)
                    for s in run.unsettled.values() if retry_pending(s)]
        return _after_failure(view, blocking)
    actions = _step_actions(view)
    if actions or _busy(view) or run.pending_approvals:
        return actions
    if blocking is not None:
        return _after_failure(view, blocking)
    return [_complete(view)]


_PENDING: StepState = {"status": "pending", "attempt": 0}  # read only


def _state(view: _View, step_id: str) -> StepState:
    # A step's own execution is keyed by its id (step_key(id, 0) is the id).
    return view.run.steps.get(step_id) or _PENDING


def _busy(view: _View) -> bool:
    """An attempt is running, or a failed attempt waits for its retry (a loop step itself
    is not work in flight: its iterations are)."""
    return any((s["status"] == "running" or retry_pending(s))
               and not is_loop_parent(view.plan, s) for s in view.run.unsettled.values())


def _occupied(view: _View) -> int:
    """Slots taken: attempts running or waiting for their retry (loop parents take none)."""
    return sum(1 for s in view.run.unsettled.values()
               if (s["status"] == "running" or retry_pending(s))
               and not is_loop_parent(view.plan, s))


def _failed_for_good(view: _View, step: Step) -> bool:
    state = _state(view, step.id)
    return state["status"] == "failed" and not retry_pending(state) and not step.tolerates_failure


def _blocking_failure(view: _View) -> str | None:
    """The first step (in plan order) that failed for good and stops the run."""
    failed = [s["step_id"] for s in view.run.unsettled.values()
              if s["status"] == "failed" and s["iteration"] == 0]
    stopping = [f for f in failed if _failed_for_good(view, view.plan.step(f))]
    return min(stopping, key=view.plan.position.__getitem__) if stopping else None


def _finished(view: _View, step_id: str) -> bool:
    state = _state(view, step_id)
    return state["status"] in ("completed", "skipped") or (
        state["status"] == "failed" and not retry_pending(state))


def frontier(plan: Plan, run: Run) -> list[str]:
    """The steps nothing is recorded for yet whose dependencies all have a record: the
    only untouched steps that can be ready (any other waits for an untouched, so pending,
    step).

    A fold over the run's :attr:`~saga.domain.Run.touched` log, which only grows: what
    was folded is kept with the run object (:meth:`~saga.domain.Run.derived`) and each
    call folds only the steps recorded since, so a decision costs what changed, not the
    length of the run. The result depends on the plan and the log alone."""
    log, room = run.touched, run.derived()
    known = room.get("frontier")
    if known is None or known[0] is not plan or known[1] > len(log):
        known = (plan, 0, dict.fromkeys(plan.roots))
    folded, found = known[1], known[2]
    recorded = run.steps
    for step_id in log[folded:]:
        found.pop(step_id, None)
        for dependent in plan.dependents(step_id):
            if dependent not in recorded and \
                    all(d in recorded for d in plan.dependencies(dependent)):
                found[dependent] = None
    room["frontier"] = (plan, len(log), found)
    return list(found)


def _open_steps(view: _View) -> list[str]:
    """The steps a decision looks at, in plan order: those recorded and not settled, and
    the :func:`frontier`. Every other step is settled, or waits for a pending step."""
    run, plan = view.run, view.plan
    ids = {s["step_id"] for s in run.unsettled.values() if s["iteration"] == 0}
    ids.update(frontier(plan, run))
    return sorted(ids, key=plan.position.__getitem__)


def _step_actions(view: _View) -> list[Action]:
    actions: list[Action] = []
    slots = [view.plan.definition.max_concurrency - _occupied(view)]
    handed: dict[str, int] = {}  # signals given to waiting steps in this call, by name
    for step_id in _open_steps(view):
        step = view.plan.step(step_id)
        state = _state(view, step_id)
        wait = state.get("wait") if state["status"] == "running" else None
        if wait and wait.get("signal"):
            action = _signal_delivery(view, step, state, wait["signal"], handed)
            actions += [action] if action is not None else []
            continue
        if step.loop is not None and state["status"] == "running":
            actions += _iteration_actions(view, step, state, slots)
            continue
        if step.until is not None and state["status"] == "running":
            actions += _repeat_actions(view, step, state)
            continue
        if retry_pending(state):
            actions.append(_retry(step, 0, state))
            continue
        if state["status"] != "pending":
            continue
        deps = view.plan.dependencies(step_id)
        if not all(_finished(view, d) for d in deps):
            continue
        failed = [d for d in deps if _failed_for_good(view, view.plan.step(d))]
        if failed:
            actions.append(SkipStep(step_id, 0, f"upstream step {failed[0]!r} failed"))
            continue
        action = _ready_action(view, step)
        if isinstance(action, StartStep):
            if slots[0] <= 0:
                continue
            slots[0] -= 1
        if action is not None:
            actions.append(action)
    return actions


def _iteration_actions(view: _View, step: Step, parent: StepState,
                       slots: list[int]) -> list[Action]:
    """A running for-each step: start, retry or wait for its iterations, then complete it
    with their outputs in item order (or fail it once an iteration failed for good)."""
    items = parent["parameters"]["items"]
    states = [view.run.step(step_key(step.id, i)) for i in range(1, len(items) + 1)]
    broken = [i for i, s in enumerate(states, 1) if s["status"] == "failed"
              and not retry_pending(s) and not step.tolerates_failure]
    active = sum(1 for s in states if s["status"] == "running" or retry_pending(s))
    limit = step.loop_concurrency or len(items) or 1
    actions: list[Action] = []
    for i, state in enumerate(states, 1):
        if retry_pending(state):
            actions.append(_retry(step, i, state))
        elif state["status"] == "pending" and not broken and active < limit and slots[0] > 0:
            active, slots[0] = active + 1, slots[0] - 1
            actions.append(_iteration_start(view, step, i, items[i - 1]))
    if actions or active:
        return actions
    if broken:
        error = states[broken[0] - 1].get("error") or {}
        return [FailStep(step.id, 0, 1, error.get("type", "IterationFailed"),
                         f"iteration {broken[0]}: {error.get('message', '')}")]
    done = all(s["status"] in ("completed", "failed", "skipped") for s in states)
    if not done:
        return []
    return [CompleteStep(step.id, 0, [s["output"] if s["status"] == "completed" else None
                                      for s in states])]


def _retry(step: Step, iteration: int, state: StepState) -> Action:
    """The next attempt of a failed step, after the remedies of an auto-heal if one runs."""
    healing = state.get("healing")
    if healing:
        index = len(healing["done"])
        remedy = healing["remedies"][index]
        return RunRemedy(step.id, iteration, index, remedy["tool"], remedy["parameters"])
    return StartStep(step.id, iteration, state["attempt"] + 1, state.get("parameters"),
                     not_before=state["retry_at"])


def _repeat_actions(view: _View, step: Step, parent: StepState) -> list[Action]:
    """A running repeat-until step: run iteration k+1 until ``until`` holds over iteration
    k's output, at most ``max_iterations`` times; reaching the bound fails the step."""
    bound = parent["parameters"]["repeat"]
    done = 0
    while step_key(step.id, done + 1) in view.run.steps:
        done += 1
    if done == 0:
        return [_repeat_start(view, step, 1, None)]
    last = view.run.step(step_key(step.id, done))
    if retry_pending(last):
        return [_retry(step, done, last)]
    if last["status"] == "running":
        return []
    if last["status"] == "failed":
        error = last.get("error") or {}
        return [FailStep(step.id, 0, 1, error.get("type", "IterationFailed"),
                         f"iteration {done}: {error.get('message', '')}")]
    names = dict(view.namespace, output=last["output"], iteration=done)
    try:
        finished = bool(expressions.evaluate(step.until or "", names))
    except ExpressionError as e:
        return [FailStep(step.id, 0, 1, type(e).__name__, f"until: {e}")]
    if finished:
        return [CompleteStep(step.id, 0, last["output"])]
    if done >= bound:
        return [FailStep(step.id, 0, 1, "MaxIterationsReached",
                         f"'{step.until}' still false after {bound} iterations")]
    return [_repeat_start(view, step, done + 1, last["output"])]


def _repeat_start(view: _View, step: Step, iteration: int, previous: Any) -> Action:
    names = dict(view.namespace, iteration=iteration, previous=previous)
    if step.use is not None:
        return _use_start(view, step, iteration, names)
    try:
        return StartStep(step.id, iteration, 1, render_parameters(step, names))
    except ExpressionError as e:
        return FailStep(step.id, iteration, 1, type(e).__name__, f"parameters: {e}")


def render_parameters(step: Step, names: dict[str, Any]) -> Any:
    """A step's parameters rendered; a whole-value template must render to a mapping."""
    with expressions.time_limit(step.timeout_seconds):  # the step's timeout covers them
        parameters = expressions.render(step.parameters, names)
    if isinstance(step.parameters, str) and not isinstance(parameters, dict):
        raise ExpressionError(f"{step.parameters.strip()} rendered a "
                              f"{type(parameters).__name__}, not a mapping")
    return parameters


def _use_start(view: _View, step: Step, iteration: int, names: dict[str, Any]) -> Action:
    """Start a nested composition: its inputs rendered, its child run id derived."""
    try:
        inputs = render_parameters(step, names)
    except ExpressionError as e:
        return FailStep(step.id, iteration, 1, type(e).__name__, f"parameters: {e}")
    return StartStep(step.id, iteration, 1, {
        "use": step.use, "inputs": inputs,
        "run": child_run_id(view.run.run_id, step.id, iteration,
                            (view.run.__dict__.get("generations") or {}).get(step.id, 0))})


def _iteration_start(view: _View, step: Step, iteration: int, item: Any) -> Action:
    names = dict(view.namespace, **{step.loop_var: item, "loop_index": iteration - 1})
    if step.use is not None:
        return _use_start(view, step, iteration, names)
    try:
        return StartStep(step.id, iteration, 1, render_parameters(step, names))
    except ExpressionError as e:
        return FailStep(step.id, iteration, 1, type(e).__name__, f"parameters: {e}")


def _signal_delivery(view: _View, step: Step, state: StepState, name: str,
                     handed: dict[str, int]) -> Action | None:
    """A step waiting for a signal completes with the oldest signal of that name no step
    took yet (steps waiting for the same name take them in plan order)."""
    available = view.run.unconsumed_signals(name)
    index = handed.get(name, 0)
    if index >= len(available):
        return None
    handed[name] = index + 1
    return CompleteStep(step.id, state["iteration"], available[index])


def _ready_action(view: _View, step: Step) -> Action | None:
    """What to do with a step whose dependencies have all finished."""
    if step.skipped_in_eco and view.run.context.get("mode") == "eco":
        return SkipStep(step.id, 0, "eco mode")
    if step.condition is not None:
        try:
            if not expressions.evaluate(step.condition, view.namespace):
                return SkipStep(step.id, 0, "condition false")
        except ExpressionError as e:
            return FailStep(step.id, 0, 1, type(e).__name__, f"condition: {e}")
    approval = _approval(view, step)
    if approval is not None:
        return approval if isinstance(approval, RequestApproval | FailStep) else None
    if step.compute is not None:
        return StartStep(step.id, 0, 1, {"compute": step.compute})
    if step.sleep is not None:
        return StartStep(step.id, 0, 1, {"sleep": step.sleep_seconds})
    if step.signal is not None:
        return StartStep(step.id, 0, 1, {"signal": step.signal,
                                         "timeout": step.timeout_seconds})
    if step.until is not None:
        return StartLoop(step.id, {"repeat": step.max_iterations})
    if step.use is not None and step.loop is None:
        return _use_start(view, step, 0, view.namespace)
    if step.loop is not None:
        try:
            items = expressions.render(step.loop, view.namespace)
        except ExpressionError as e:
            return FailStep(step.id, 0, 1, type(e).__name__, f"loop: {e}")
        if not isinstance(items, list):
            return FailStep(step.id, 0, 1, "ExpressionError",
                            f"loop: expected a list, got {type(items).__name__}")
        return StartLoop(step.id, items)
    if not _templated(step.parameters):
        return StartStep(step.id, 0, 1, copy.deepcopy(step.parameters))  # nothing to render
    try:
        parameters = render_parameters(step, view.namespace)
    except ExpressionError as e:
        return FailStep(step.id, 0, 1, type(e).__name__, f"parameters: {e}")
    return StartStep(step.id, 0, 1, parameters)


def _templated(value: Any) -> bool:
    """Whether a value holds a template anywhere (rendering needs the namespace)."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, dict):
        return any(_templated(k) or _templated(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_templated(v) for v in value)
    return False


def _approval(view: _View, step: Step) -> Action | bool | None:
    """None when no approval is needed or it was granted; an action or True (wait) otherwise."""
    message = confirmation_message(view.plan, step)
    if message is None:
        return None
    decision = view.run.approvals.get(step.id)
    if decision is None:
        try:
            rendered = expressions.render(message, view.namespace)
        except ExpressionError:
            rendered = message
        return RequestApproval(step.id, str(rendered))
    if decision["status"] == "granted":
        return None
    if decision["status"] == "rejected":
        comment = f": {decision['comment']}" if decision.get("comment") else ""
        return FailStep(step.id, 0, 1, "ApprovalRejected",
                        f"rejected by {decision['actor']}{comment}")
    return True


def confirmation_timeout(plan: Plan, step_id: str) -> tuple[float, bool] | None:
    """(seconds, default) of a confirmation with a timeout: when the seconds pass with no
    decision, ``default`` is applied (True approves, False rejects)."""
    for confirmation in plan.definition.confirmations:
        if confirmation.step == step_id and confirmation.timeout is not None:
            seconds = parse_duration(confirmation.timeout)
            return (seconds, confirmation.default) if seconds else None
    return None


def confirmation_message(plan: Plan, step: Step) -> str | None:
    """The approval message for a step that needs one, else None."""
    for confirmation in plan.definition.confirmations:
        if confirmation.step == step.id:
            return confirmation.message or f"Run step {step.id}?"
    if step.confirm:
        return step.confirm if isinstance(step.confirm, str) else f"Run step {step.id}?"
    return None


def _after_failure(view: _View, failed_step: str) -> list[Action]:
    """Compensate if the policy says so and something can be undone; else fail."""
    handling = view.plan.definition.error_handling
    step = view.plan.step(failed_step)
    error = _state(view, failed_step).get("error") or {}
    maybe_done = error.get("type") == "Interrupted" and step.on_interrupt == "compensate"
    rollback = (handling.rollback_on_failure or handling.failure_strategy == "rollback"
                or step.on_error == "compensate" or maybe_done)
    to_undo = compensation_order(view.plan, view.run) if rollback else []
    interrupted = error.get("type") in CUT_SHORT  # a dead worker's attempt may have acted
    if interrupted and step.compensation is not None \
            and step_key(failed_step) not in to_undo:
        # An interrupted attempt may have had its effect: undo it first, at least once.
        to_undo.insert(0, step_key(failed_step))
    reason = f"step {failed_step!r} failed: {error.get('message', '')}"
    if to_undo:
        return [StartCompensation(reason, to_undo)]
    return [FinishRun("failed", _partial_outputs(view), dict(error, step=failed_step),
                      failed_step)]


def _compensation(view: _View) -> list[Action]:
    action = next_compensation(view.plan, view.run, view.namespace)
    if action is not None:
        return [action]
    return [compensation_ending(view.run, _blocking_failure(view), _partial_outputs(view))]


def _partial_outputs(view: _View) -> dict[str, Any]:
    """Outputs of the steps that completed, by output name."""
    return {step.key: view.namespace["steps"][step.id] for step in view.plan.definition.steps
            if _state(view, step.id)["status"] in ("completed", "compensated")}


def _complete(view: _View) -> FinishRun:
    outputs_spec = view.plan.definition.outputs
    if outputs_spec is None:
        outputs = _partial_outputs(view)
    else:
        try:
            outputs = expressions.render(outputs_spec, view.namespace)
        except ExpressionError as e:
            return FinishRun("failed", _partial_outputs(view),
                             {"type": "ExpressionError", "message": f"outputs: {e}"})
    layers = layer_report(view.plan, view.run)
    if layers and isinstance(outputs, dict):
        outputs = dict(outputs, _layers=layers)
    return FinishRun("completed", outputs)


def layer_report(plan: Plan, run: Run) -> dict[str, Any]:
    """Per layer: how many steps, which failed or were skipped, the span of time its
    steps took (from their recorded start and finish) and, when its tools reported usage
    (an output's ``_usage``), the ``tokens`` they used; ``degraded`` when an enhancement
    failed. Empty when the composition uses no layers."""
    report: dict[str, Any] = {}
    for step in plan.definition.steps:
        if step.layer is None:
            continue
        entry = report.setdefault(step.layer, {"steps": 0, "completed": 0, "failed": [],
                                               "skipped": [], "duration_ms": 0,
                                               "_start": None, "_end": None})
        state = run.step(step_key(step.id))
        entry["steps"] += 1
        status = state["status"]
        if status in ("completed", "compensated"):
            entry["completed"] += 1
            usage = state.get("output")
            usage = usage.get("_usage") if isinstance(usage, dict) else None
            if isinstance(usage, dict) and isinstance(usage.get("tokens"), int | float):
                entry["tokens"] = entry.get("tokens", 0) + usage["tokens"]
        elif status in ("failed", "skipped"):
            entry[status].append(step.id)
        for edge, pick in (("_start", min), ("_end", max)):
            moment = state.get("started_at" if edge == "_start" else "finished_at")
            if moment is not None:
                entry[edge] = moment if entry[edge] is None else pick(entry[edge], moment)
    for entry in report.values():
        start, end = entry.pop("_start"), entry.pop("_end")
        if start and end:
            entry["duration_ms"] = ms_between(start, end)
    if report:
        report["degraded"] = bool(report.get("enhancement", {}).get("failed"))
    return report
