"""Deciding what a run does next: ``decide(plan, run) -> actions``. Pure.

The scheduler reads only the plan and the run's folded state (recorded inputs, outputs,
context); it never reads the clock, the environment or randomness, so replaying a history
through it reproduces the recorded decisions. Templates and conditions are evaluated here
because they are functions of recorded data; tools are called by the executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from saga import expressions
from saga.definition import Step
from saga.domain import Run, ms_between, step_key
from saga.errors import ExpressionError
from saga.nesting import child_run_id
from saga.plan import Plan
from saga.secrets import SecretNames


@dataclass(frozen=True)
class StartStep:
    """Record ``StepStarted`` and run the step (not before ``not_before``, an ISO time)."""

    step_id: str
    iteration: int
    attempt: int
    parameters: Any
    not_before: str | None = None


@dataclass(frozen=True)
class StartLoop:
    """Record a for-each step's ``StepStarted`` with the items it will iterate over (or a
    repeat step's with its bound, ``{"repeat": N}``); its iterations (1-based) then start
    as steps of their own."""

    step_id: str
    items: list[Any] | dict[str, Any]


@dataclass(frozen=True)
class CompleteStep:
    """Record a ``StepCompleted`` the scheduler derives (a loop's list of outputs)."""

    step_id: str
    iteration: int
    output: Any


@dataclass(frozen=True)
class RunRemedy:
    """Call the next remedy of a step's auto-heal (before its retry)."""

    step_id: str
    iteration: int
    index: int
    tool: str
    parameters: Any


@dataclass(frozen=True)
class SkipStep:
    """Record ``StepSkipped``."""

    step_id: str
    iteration: int
    reason: str


@dataclass(frozen=True)
class FailStep:
    """Record a ``StepFailed`` that no tool reported: a template error before the call, a
    rejected approval, or an attempt interrupted by the death of its worker (which, when
    ``retry_at`` is set, runs again at once)."""

    step_id: str
    iteration: int
    attempt: int
    error_type: str
    message: str
    retry_at: str | None = None


@dataclass(frozen=True)
class RequestApproval:
    """Record ``ApprovalRequested``; the run waits."""

    step_id: str
    message: str


@dataclass(frozen=True)
class StartCompensation:
    """Record ``CompensationStarted`` with the steps to undo, in order."""

    reason: str
    steps: list[str]


@dataclass(frozen=True)
class CompensateStep:
    """Run one step's compensation (with its parameters rendered); ``tool`` None means the
    step tool's own compensation, called with the step's recorded parameters and output."""

    step_id: str
    iteration: int
    tool: str | None
    parameters: Any
    error: str | None = None


@dataclass(frozen=True)
class FinishRun:
    """Record the run's outcome."""

    status: str
    outputs: Any = None
    error: dict[str, Any] | None = None
    failed_step: str | None = None
    actor: str | None = None


Action = (StartStep | StartLoop | CompleteStep | RunRemedy | SkipStep | FailStep
          | RequestApproval | StartCompensation | CompensateStep | FinishRun)


@dataclass
class _View:
    """What decide needs to know about the run, derived once per call."""

    plan: Plan
    run: Run
    namespace: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        self.namespace = namespace(self.plan, self.run)


def namespace(plan: Plan, run: Run) -> dict[str, Any]:
    """Everything expressions may read: inputs, context and each step's recorded output
    (by output key and by id; ``null`` for a step that has not completed)."""
    outputs: dict[str, Any] = {}
    for step in plan.definition.steps:
        state = run.steps.get(step_key(step.id))
        recorded = state is not None and state["status"] in ("completed", "compensated")
        outputs[step.id] = state["output"] if recorded else None
    names: dict[str, Any] = {}
    for step in plan.definition.steps:
        names[step.id] = outputs[step.id]
        names[step.key] = outputs[step.id]
    names.update(inputs=run.inputs, input=run.inputs, context=run.context, steps=outputs,
                 secret=SecretNames())
    return names


def decide(plan: Plan, run: Run) -> list[Action]:
    """The actions that follow from the run's recorded state; empty when it must wait."""
    if run.is_finished:
        return []
    own = getattr(plan, "decide", None)
    if own is not None:  # a plan of the graph form decides with its own readiness rules
        return list(own(run))
    view = _View(plan, run)
    if run.compensation is not None:
        return _compensation(view)
    blocking = _blocking_failure(view)
    strategy = plan.definition.error_handling.failure_strategy
    if blocking is not None and strategy != "partial_success":
        if _busy(view):  # nothing new starts; attempts in flight (and due retries) finish
            return [_retry(plan.step(s["step_id"]), s["iteration"], s)
                    for s in run.steps.values() if _retry_pending(s)]
        return _after_failure(view, blocking)
    actions = _step_actions(view)
    if actions or _busy(view) or run.pending_approvals:
        return actions
    if blocking is not None:
        return _after_failure(view, blocking)
    return [_complete(view)]


def _state(view: _View, step_id: str) -> dict[str, Any]:
    return view.run.step(step_key(step_id))


def _retry_pending(state: dict[str, Any]) -> bool:
    return state["status"] == "failed" and state.get("retry_at") is not None


def _busy(view: _View) -> bool:
    """An attempt is running, or a failed attempt waits for its retry (a loop step itself
    is not work in flight: its iterations are)."""
    return any((s["status"] == "running" or _retry_pending(s))
               and not is_loop_parent(view.plan, s) for s in view.run.steps.values())


def is_loop_parent(plan: Plan, state: dict[str, Any]) -> bool:
    """True for the state of a for-each or repeat step itself (not one of its iterations)."""
    return state["iteration"] == 0 and plan.step(state["step_id"]).iterates


def _occupied(view: _View) -> int:
    """Slots taken: attempts running or waiting for their retry (loop parents take none)."""
    return sum(1 for s in view.run.steps.values()
               if (s["status"] == "running" or _retry_pending(s))
               and not is_loop_parent(view.plan, s))


def _failed_for_good(view: _View, step: Step) -> bool:
    state = _state(view, step.id)
    return state["status"] == "failed" and not _retry_pending(state) and not step.tolerates_failure


def _blocking_failure(view: _View) -> str | None:
    """The first step (in plan order) that failed for good and stops the run."""
    for step_id, step in view.plan.steps.items():
        if _failed_for_good(view, step):
            return step_id
    return None


def _finished(view: _View, step_id: str) -> bool:
    state = _state(view, step_id)
    return state["status"] in ("completed", "skipped") or (
        state["status"] == "failed" and not _retry_pending(state))


def _step_actions(view: _View) -> list[Action]:
    actions: list[Action] = []
    slots = [view.plan.definition.max_concurrency - _occupied(view)]
    for step_id, step in view.plan.steps.items():
        state = _state(view, step_id)
        if step.loop is not None and state["status"] == "running":
            actions += _iteration_actions(view, step, state, slots)
            continue
        if step.until is not None and state["status"] == "running":
            actions += _repeat_actions(view, step, state)
            continue
        if _retry_pending(state):
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


def _iteration_actions(view: _View, step: Step, parent: dict[str, Any],
                       slots: list[int]) -> list[Action]:
    """A running for-each step: start, retry or wait for its iterations, then complete it
    with their outputs in item order (or fail it once an iteration failed for good)."""
    items = parent["parameters"]["items"]
    states = [view.run.step(step_key(step.id, i)) for i in range(1, len(items) + 1)]
    broken = [i for i, s in enumerate(states, 1) if s["status"] == "failed"
              and not _retry_pending(s) and not step.tolerates_failure]
    active = sum(1 for s in states if s["status"] == "running" or _retry_pending(s))
    limit = step.loop_concurrency or len(items) or 1
    actions: list[Action] = []
    for i, state in enumerate(states, 1):
        if _retry_pending(state):
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


def _retry(step: Step, iteration: int, state: dict[str, Any]) -> Action:
    """The next attempt of a failed step, after the remedies of an auto-heal if one runs."""
    healing = state.get("healing")
    if healing:
        index = len(healing["done"])
        remedy = healing["remedies"][index]
        return RunRemedy(step.id, iteration, index, remedy["tool"], remedy["parameters"])
    return StartStep(step.id, iteration, state["attempt"] + 1, state.get("parameters"),
                     not_before=state["retry_at"])


def heal_decision(plan: Plan, run: Run, step_id: str, iteration: int, error_type: str,
                  message: str) -> tuple[int, list[dict[str, Any]]] | None:
    """The auto-heal handler a failed attempt triggers, with its remedies rendered; None
    when no handler matches or every matching one has fired ``max`` times."""
    step = plan.step(step_id)
    if not step.heal:
        return None
    state = run.step(step_key(step_id, iteration))
    names = dict(namespace(plan, run), error={"type": error_type, "message": message})
    for index, handler in enumerate(step.heal):
        if state.get("heals", {}).get(str(index), 0) >= handler.max:
            continue
        try:
            if not expressions.evaluate(handler.when, names):
                continue
            remedies = [{"tool": call.tool, "parameters": expressions.render(call.parameters,
                                                                             names)}
                        for call in handler.do]
        except ExpressionError:
            continue
        return index, remedies
    return None


def _repeat_actions(view: _View, step: Step, parent: dict[str, Any]) -> list[Action]:
    """A running repeat-until step: run iteration k+1 until ``until`` holds over iteration
    k's output, at most ``max_iterations`` times; reaching the bound fails the step."""
    bound = parent["parameters"]["repeat"]
    done = 0
    while step_key(step.id, done + 1) in view.run.steps:
        done += 1
    if done == 0:
        return [_repeat_start(view, step, 1, None)]
    last = view.run.step(step_key(step.id, done))
    if _retry_pending(last):
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
        return [FailStep(step.id, 0, 1, "ExpressionError", f"until: {e}")]
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
        return StartStep(step.id, iteration, 1, expressions.render(step.parameters, names))
    except ExpressionError as e:
        return FailStep(step.id, iteration, 1, "ExpressionError", f"parameters: {e}")


def _use_start(view: _View, step: Step, iteration: int, names: dict[str, Any]) -> Action:
    """Start a nested composition: its inputs rendered, its child run id derived."""
    try:
        inputs = expressions.render(step.parameters, names)
    except ExpressionError as e:
        return FailStep(step.id, iteration, 1, "ExpressionError", f"parameters: {e}")
    return StartStep(step.id, iteration, 1, {
        "use": step.use, "inputs": inputs,
        "run": child_run_id(view.run.run_id, step.id, iteration)})


def _iteration_start(view: _View, step: Step, iteration: int, item: Any) -> Action:
    names = dict(view.namespace, **{step.loop_var: item, "loop_index": iteration - 1})
    if step.use is not None:
        return _use_start(view, step, iteration, names)
    try:
        return StartStep(step.id, iteration, 1, expressions.render(step.parameters, names))
    except ExpressionError as e:
        return FailStep(step.id, iteration, 1, "ExpressionError", f"parameters: {e}")


def _ready_action(view: _View, step: Step) -> Action | None:
    """What to do with a step whose dependencies have all finished."""
    if step.layer == "enhancement" and view.run.context.get("mode") == "eco":
        return SkipStep(step.id, 0, "eco mode")
    if step.condition is not None:
        try:
            if not expressions.evaluate(step.condition, view.namespace):
                return SkipStep(step.id, 0, "condition false")
        except ExpressionError as e:
            return FailStep(step.id, 0, 1, "ExpressionError", f"condition: {e}")
    approval = _approval(view, step)
    if approval is not None:
        return approval if isinstance(approval, RequestApproval | FailStep) else None
    if step.compute is not None:
        return StartStep(step.id, 0, 1, {"compute": step.compute})
    if step.until is not None:
        return StartLoop(step.id, {"repeat": step.max_iterations})
    if step.use is not None and step.loop is None:
        return _use_start(view, step, 0, view.namespace)
    if step.loop is not None:
        try:
            items = expressions.render(step.loop, view.namespace)
        except ExpressionError as e:
            return FailStep(step.id, 0, 1, "ExpressionError", f"loop: {e}")
        if not isinstance(items, list):
            return FailStep(step.id, 0, 1, "ExpressionError",
                            f"loop: expected a list, got {type(items).__name__}")
        return StartLoop(step.id, items)
    try:
        parameters = expressions.render(step.parameters, view.namespace)
    except ExpressionError as e:
        return FailStep(step.id, 0, 1, "ExpressionError", f"parameters: {e}")
    return StartStep(step.id, 0, 1, parameters)


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
    if maybe_done and step.compensation is not None:
        # The interrupted attempt may have had its effect: undo it first, at least once.
        to_undo.insert(0, step_key(failed_step))
    reason = f"step {failed_step!r} failed: {error.get('message', '')}"
    if to_undo:
        return [StartCompensation(reason, to_undo)]
    return [FinishRun("failed", _partial_outputs(view), dict(error, step=failed_step),
                      failed_step)]


def compensation_order(plan: Plan, run: Run) -> list[str]:
    """Completed steps (each completed loop iteration on its own) that declare a
    compensation, most recently completed first."""
    return [key for key in reversed(run.completion_order)
            if plan.step(run.steps[key]["step_id"]).compensation is not None
            and not is_loop_parent(plan, run.steps[key])]


def _compensation(view: _View) -> list[Action]:
    comp = view.run.compensation
    assert comp is not None
    # An attempt cut short after the compensation order was fixed (its driver lost the
    # race to a cancel) may have had its effect: undo it too, after the others.
    maybe_done = [k for k, s in view.run.steps.items() if k not in comp["steps"]
                  and s["status"] == "failed" and (s.get("error") or {}).get("type")
                  == "Interrupted" and view.plan.step(s["step_id"]).compensation is not None]
    for key in [*comp["steps"], *maybe_done]:
        if key in comp["done"]:
            continue
        state = view.run.steps[key]
        step = view.plan.step(state["step_id"])
        compensation = step.compensation
        assert compensation is not None
        names = dict(view.namespace, output=state["output"],
                     parameters=state.get("parameters"), error=view.run.error)
        if step.loop is not None and state["iteration"] > 0:
            items = view.run.steps[step_key(step.id)]["parameters"]["items"]
            names.update({step.loop_var: items[state["iteration"] - 1],
                          "loop_index": state["iteration"] - 1})
        if compensation.uses_tool_compensation:
            return [CompensateStep(step.id, state["iteration"], None, state.get("parameters"))]
        try:
            parameters = expressions.render(compensation.parameters, names)
        except ExpressionError as e:
            return [CompensateStep(step.id, state["iteration"], compensation.tool, None,
                                   error=str(e))]
        return [CompensateStep(step.id, state["iteration"], compensation.tool, parameters)]
    failed_step = _blocking_failure(view)
    error = dict(_state(view, failed_step).get("error") or {}, step=failed_step) \
        if failed_step else {"message": comp["reason"]}
    broken = [k for k, v in comp["done"].items() if v == "failed"]
    if broken:
        error = dict(error, compensation_failed=broken)
        return [FinishRun("failed", _partial_outputs(view), error, failed_step)]
    if comp.get("cancel"):
        return [FinishRun("cancelled", error={"message": comp["reason"]},
                          actor=comp.get("actor"))]
    return [FinishRun("compensated", _partial_outputs(view), error, failed_step)]


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
    """Per layer: how many steps, which failed or were skipped, and the span of time its
    steps took (from their recorded start and finish); ``degraded`` when an enhancement
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



def interrupted(plan: Plan, run: Run) -> list[FailStep]:
    """What to do with attempts a dead worker started and never finished.

    Called when a worker takes a run over: every step still ``running`` was interrupted.
    An idempotent step, or one with ``on_interrupt: retry`` (the default), runs again at
    once with the same idempotency key; ``fail`` and ``compensate`` fail it for good (the
    latter also undoing the step itself, since its effect may have happened).
    """
    actions = []
    for state in run.steps.values():
        if state["status"] != "running" or is_loop_parent(plan, state):
            continue
        step = plan.step(state["step_id"])
        again = step.idempotent or step.on_interrupt == "retry"
        actions.append(FailStep(state["step_id"], state["iteration"], state["attempt"],
                                "Interrupted", "the worker running this attempt stopped",
                                retry_at=state["attempt_started_at"] if again else None))
    return actions


def retry_decision(plan: Plan, step_id: str, attempt: int, error_type: str,
                   tool_says_retryable: bool = True) -> bool:
    """Whether a failed attempt gets another: the step's policy, pure."""
    step = plan.step(step_id)
    if not tool_says_retryable or attempt >= max_attempts(plan, step):
        return False
    policy = step.retry
    if policy is not None:
        if error_type in policy.non_retryable:
            return False
        if policy.retry_on is not None and error_type not in policy.retry_on:
            return False
    return error_type not in ("ExpressionError", "ApprovalRejected", "UnknownToolError")


def max_attempts(plan: Plan, step: Step) -> int:
    """How many attempts a step gets: retry policy, retry_count, on_error retry:N, or the
    composition's ``error_handling.max_retries`` (3 under the ``retry`` strategy)."""
    if step.retry is not None:
        return step.retry.max_attempts
    if step.retry_count is not None:
        return step.retry_count + 1
    if step.on_error.startswith("retry:"):
        return int(step.on_error.split(":", 1)[1]) + 1
    handling = plan.definition.error_handling
    retries = handling.max_retries
    if (handling.failure_strategy == "retry" or step.layer == "execution") and retries == 0:
        retries = 3  # execution-layer steps retry with backoff unless told otherwise
    return retries + 1
