"""The rules both composition forms share: what a run's expressions see, retries and
their limits, interrupted attempts, auto-heal, and compensation (its order, each step's
undo, and how a rolled-back run ends). Pure, like the rest of the scheduler.
"""

from __future__ import annotations

from typing import Any

from saga import expressions
from saga.composition import Plan
from saga.composition.definition import Step
from saga.composition.plan import BASE_NAMES
from saga.domain import Run, StepState, step_key
from saga.domain.undos import undo_calls
from saga.errors import ExpressionError
from saga.scheduler.actions import CompensateStep, FailStep, FinishRun, LeaveUndone, ReopenSteps
from saga.secrets import SecretNames


def namespace(plan: Plan, run: Run) -> dict[str, Any]:
    """Everything expressions may read: inputs (also by bare name, seed 002, where no step
    output or base name shadows them), context, and each step's recorded value by output
    key and by id: its output once completed; for a step that failed for good (and the run
    went on, ``on_error: continue``) its error, ``{"failed": true, "error": {type,
    message}, "message": "❌ TYPE: MESSAGE"}`` (``"rejected: ..."`` for a rejected
    approval); else ``null``."""
    outputs: dict[str, Any] = {}
    for step in plan.definition.steps:
        state = run.steps.get(step_key(step.id))
        outputs[step.id] = None if state is None else step_value(state)
    names: dict[str, Any] = {}
    for spec in plan.definition.inputs:
        if spec.name not in BASE_NAMES:
            names[spec.name] = run.inputs.get(spec.name) if isinstance(run.inputs, dict) \
                else None
    for step in plan.definition.steps:
        value = names[step.key] = outputs[step.id]
        if step.key != step.id and isinstance(value, dict) and step.key not in value:
            value = {**value, step.key: value}  # seed 001: {{ step_id.output_key }}
        names[step.id] = value
    names.update(inputs=run.inputs, input=run.inputs, context=run_context(run),
                 steps=outputs, secret=SecretNames())
    return names


def step_value(state: StepState | dict[str, Any]) -> Any:
    """What expressions see of one step's execution (see :func:`namespace`)."""
    if state["status"] in ("completed", "compensated"):
        return state.get("output")
    if state["status"] == "failed" and not retry_pending(state):
        error = state.get("error") or {}
        # Seed 002 marks a tool's failure with ❌ (its auto-heal pattern looks for it); a
        # person's rejection is no failure to heal, so it carries no mark.
        mark = "rejected:" if error.get("type") == "ApprovalRejected" else \
            f"❌ {error.get('type')}:"
        return {"failed": True, "error": {"type": error.get("type"),
                                          "message": error.get("message")},
                "message": f"{mark} {error.get('message')}"}
    return None


def run_context(run: Run) -> dict[str, Any]:
    """The run's recorded context as expressions see it (seed 001): ``run_id`` (alias
    ``execution_id``), ``actor`` (alias ``user_id``), ``labels``, ``mode`` and
    ``scheduled_at`` always present (null when not set), and whatever else was recorded."""
    context = dict(run.context)
    context.setdefault("run_id", run.run_id)
    context.setdefault("labels", {})
    context.setdefault("mode", "normal")
    context.setdefault("scheduled_at", None)
    context.setdefault("actor", None)
    context["execution_id"] = context["run_id"]
    context["user_id"] = context["actor"]
    return context


def retry_pending(state: StepState | dict[str, Any]) -> bool:
    """A failed attempt that will run again (at ``retry_at``)."""
    return state["status"] == "failed" and state.get("retry_at") is not None


def is_loop_parent(plan: Plan, state: StepState | dict[str, Any]) -> bool:
    """True for the state of a for-each or repeat step itself (not one of its iterations)."""
    return state["iteration"] == 0 and plan.step(state["step_id"]).iterates


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


def undo_order(plan: Plan, run: Run) -> list[str]:
    """What a rollback someone requests (a cancel, ``saga compensate``) undoes, in order:
    first the attempts in flight of steps with an undo, the latest first (their driver
    cuts them short, or records how they ended; either way they may have acted), then
    :func:`compensation_order`."""
    flying = [key for key, s in run.unsettled.items() if s["status"] == "running"
              and not s.get("wait") and not is_loop_parent(plan, s)
              and plan.step(s["step_id"]).compensation is not None]
    return [*reversed(flying), *compensation_order(plan, run)]


def compensation_order(plan: Plan, run: Run) -> list[str]:
    """The steps to undo, in order: first those whose interrupted attempt may have acted
    (:func:`maybe_done`), then completed steps (each completed loop iteration on its
    own) that declare a compensation, most recently completed first."""
    maybe = [key for key, state in run.steps.items() if maybe_done(plan, state)] \
        if run.takeovers else []
    return [*maybe, *(key for key in reversed(run.completion_order)
                      if plan.step(run.steps[key]["step_id"]).compensation is not None
                      and not is_loop_parent(plan, run.steps[key]))]


#: The failures of an attempt its worker's death cut short (see :func:`interrupted`).
CUT_SHORT = frozenset({"Interrupted", "Quarantined"})


def maybe_done(plan: Plan, state: StepState | dict[str, Any]) -> bool:
    """A step execution with an undo whose last attempt was cut short by its worker's
    death (failed for good, or waiting for a retry): that attempt may have acted, so it
    counts as done for undo (DESIGN promise 5); its undo gets the step's idempotency key.
    One whose later attempt, under the same key, came back with a recorded answer is not:
    that answer is the tool's for the key (a tool that deduplicates gives it for every
    call with the key)."""
    return state["status"] == "failed" and (state.get("error") or {}).get("type") \
        in CUT_SHORT and not is_loop_parent(plan, state) \
        and plan.step(state["step_id"]).compensation is not None


#: The failures of an attempt a cancel (or a requested compensation) or the run's deadline
#: cut short while it ran (or, for a sleep or a signal wait, while it waited).
CANCELLED = frozenset({"RunCancelled", "RunCompensating", "RunTimeout"})


def cut_call(plan: Plan, state: StepState | dict[str, Any]) -> bool:
    """A failed attempt whose call may have acted though it never answered: its worker
    died (``Interrupted``), or a cancel stopped its tool (a tool in a thread runs on; a
    wait ended the same way acted on nothing, and a child run is undone on its own)."""
    kind = (state.get("error") or {}).get("type")
    return state["status"] == "failed" and (kind == "Interrupted" or (
        kind in CANCELLED and plan.step(state["step_id"]).tool is not None))


def interrupted(plan: Plan, run: Run) -> list[FailStep]:
    """What to do with attempts a dead worker started and never finished.

    Called when a worker takes a run over (after it recorded ``RunTakenOver``): every
    step still ``running`` was interrupted.
    Only deaths the run's own attempt likely caused count against it: a step's
    ``blamed`` interruptions (see ``Run.RunTakenOver``), not those of a worker that died
    for another reason while the run was in it. An idempotent step, or one with
    ``on_interrupt: retry`` (the default), runs again at once with the same idempotency
    key until its blamed interruptions reach the step's ``max_attempts`` (or
    :data:`INTERRUPT_ATTEMPTS` when the step sets no retry policy). ``fail`` and
    ``compensate`` fail it for good. A step that ends failed after an interruption is
    undone, since its effect may have happened (:func:`maybe_done`).

    The run is quarantined (every attempt in flight fails with ``Quarantined``, and the
    run is undone) once one step has ``quarantine_after`` blamed interruptions, or, as a
    safety net for a run whose deaths are never blamed on it (a tool that kills its
    worker only after a while), :data:`QUARANTINE_NET` times as many of any kind.
    """
    actions: list[FailStep] = []
    left = [s for s in run.steps.values() if s["status"] == "running"
            and not is_loop_parent(plan, s) and not s.get("wait")]  # a wait outlives workers
    limit = int(run.options.get("quarantine_after", QUARANTINE_AFTER))
    worst = max(left, key=lambda s: (s.get("blamed", 0), s.get("interrupted", 0)),
                default=None)
    if worst is not None and (worst.get("blamed", 0) >= limit or max(
            s.get("interrupted", 0) for s in left) >= QUARANTINE_NET * limit):
        # Workers keep dying under this run: stop feeding it workers, whatever step.
        return [FailStep(s["step_id"], s["iteration"], s["attempt"], "Quarantined",
                         f"quarantined: the workers driving this run died "
                         f"{run.takeovers} times ({worst.get('blamed', 0)} at once after "
                         f"starting {worst['step_id']!r})") for s in left]
    for state in left:
        step = plan.step(state["step_id"])
        again = (step.idempotent or step.on_interrupt == "retry") \
            and state.get("blamed", 0) < interrupt_attempts(plan, step)
        actions.append(FailStep(state["step_id"], state["iteration"], state["attempt"],
                                "Interrupted", "the worker running this attempt stopped",
                                retry_at=state["attempt_started_at"] if again else None))
    return actions


#: Blamed interruptions of one step (its worker died at once after starting it, while
#: driving the run alone; see ``Run.RunTakenOver``) after which the run is quarantined:
#: failed with ``Quarantined`` and undone, so one poison run cannot take worker after
#: worker down. Configured per run as ``quarantine_after``.
QUARANTINE_AFTER = 3

#: The safety net: a step interrupted this many times ``quarantine_after`` quarantines its
#: run whoever is to blame (workers dying at random die during one step this often only
#: when they die far more often than the step takes).
QUARANTINE_NET = 3


#: Attempts a step without a retry policy gets when its worker keeps dying under it.
INTERRUPT_ATTEMPTS = 3


def interrupt_attempts(plan: Plan, step: Step) -> int:
    """How many attempts a step gets when attempts are interrupted: its own limit when it
    declares one, else :data:`INTERRUPT_ATTEMPTS` (at-least-once, but not forever)."""
    declared = step.retry is not None or step.retry_count is not None \
        or step.on_error.startswith("retry:")
    return max_attempts(plan, step) if declared else max(INTERRUPT_ATTEMPTS,
                                                         max_attempts(plan, step))


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
    return error_type not in ("ExpressionError", "ExpressionLimit", "ApprovalRejected",
                              "UnknownToolError")


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


def next_compensation(plan: Plan, run: Run,
                      names: dict[str, Any]) -> CompensateStep | LeaveUndone | None:
    """The next compensation a compensating run performs, None once all are done.

    ``names`` is the run's expression namespace; each compensation also sees its step's
    recorded ``output`` and ``parameters`` and the run's ``error``. An undo call an
    interruption cut short is called again (its next ``attempt``, the same key). A step
    cut short before it recorded an output is still undone when its compensation can be
    said without it; when it reads that output, it is left not undone (:data:`UNSAID`).
    """
    comp = run.compensation
    assert comp is not None
    # An attempt cut short after the compensation order was fixed (its driver lost the
    # race to a cancel) may have had its effect: undo it too, after the others.
    late = [k for k, s in run.steps.items() if k not in comp["steps"] and maybe_done(plan, s)]
    for key in [*comp["steps"], *late]:
        if key in comp["done"]:
            continue
        state = run.steps[key]
        step = plan.step(state["step_id"])
        compensation = step.compensation
        assert compensation is not None
        scope = dict(names, output=state["output"], parameters=state.get("parameters"),
                     error=run.error)
        if step.loop is not None and state["iteration"] > 0:
            items = run.steps[step_key(step.id)]["parameters"]["items"]
            scope.update({step.loop_var: items[state["iteration"] - 1],
                          "loop_index": state["iteration"] - 1})
        attempt = undo_calls(comp).get(key, 0) + 1
        if compensation.uses_tool_compensation:
            return CompensateStep(step.id, state["iteration"], None, state.get("parameters"),
                                  attempt=attempt)
        try:
            parameters = expressions.render(compensation.parameters, scope)
        except ExpressionError as e:
            if cut_short(state):
                return LeaveUndone(step.id, state["iteration"], f"{UNSAID} ({e})")
            return CompensateStep(step.id, state["iteration"], compensation.tool, None,
                                  error=str(e))
        return CompensateStep(step.id, state["iteration"], compensation.tool, parameters,
                              attempt=attempt)
    return None


#: Why a step is left not undone when its compensation cannot be rendered without the
#: output its interrupted attempt never recorded.
UNSAID = "interrupted before its output was recorded: its compensation needs that output"


def cut_short(state: StepState | dict[str, Any]) -> bool:
    """A step execution undone though it never completed: its last attempt was cut short
    (a worker's death, a quarantine, a cancel) and may have acted, with no output."""
    return state["status"] == "failed" and (state.get("error") or {}).get("type") \
        in CUT_SHORT | CANCELLED


def compensation_ending(run: Run, failed: str | None,
                        outputs: Any) -> FinishRun | ReopenSteps:
    """How a run whose compensations all ran ends: ``failed`` if one of them failed
    (listing which), ``cancelled`` if a person cancelled it, else ``compensated``.
    ``failed`` is the key of the step whose failure started the rollback, if any.
    A reset's undo does not end the run: its steps are reopened."""
    comp = run.compensation
    assert comp is not None
    reset = comp.get("reset")
    if reset is not None and not any(v == "failed" for v in comp["done"].values()):
        return ReopenSteps(reset["step"], list(reset["reopen"]))
    if failed is None and not comp.get("requested") and not run.timed_out:
        # The step whose failure started it may be undone itself now (an interrupted
        # attempt may have acted): its error is still the run's.
        failed = next((k for k in comp["steps"] if (run.steps[k].get("error") or {})
                       .get("type") in CUT_SHORT), None)
    error = dict(run.step(failed).get("error") or {}, step=failed) if failed \
        else {"message": comp["reason"]}
    broken = [k for k, v in comp["done"].items() if v == "failed"]
    if broken:
        return FinishRun("failed", outputs, dict(error, compensation_failed=broken), failed)
    if comp.get("cancel"):
        return FinishRun("cancelled", error={"message": comp["reason"]}, actor=comp.get("actor"))
    return FinishRun("compensated", outputs, error, failed)


def not_undone(plan: Plan, run: Run) -> list[str]:
    """Once a rollback has begun, or a run ended failed or cancelled without one: the step
    executions that may have acted and are not (or not yet) undone, in completion order,
    then those cut short (a worker's death, a cancel): no compensation of their own, one
    that failed, one that could not be said (``StepNotUndone``), or no rollback at all.
    Compute, sleep and signal steps act on nothing and are never named (promise 5: what
    cannot be undone is named)."""
    comp = run.compensation or {"done": {}}
    if run.compensation is None and run.status not in ("failed", "cancelled"):
        return []
    interrupted_ = [k for k, s in run.steps.items() if cut_call(plan, s)]
    unsaid = [k for k, v in comp["done"].items() if v == "not_undone"]  # StepNotUndone
    left: list[str] = []
    for key in dict.fromkeys([*run.completion_order, *interrupted_, *unsaid]):
        state = run.steps.get(key)
        if state is None or is_loop_parent(plan, state):
            continue
        step = plan.step(state["step_id"])
        if step.tool is None and step.use is None:
            continue
        if comp["done"].get(key) == "compensated" or state["status"] not in (
                "completed", "failed"):
            continue
        left.append(key)
    return left
