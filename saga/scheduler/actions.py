"""What the scheduler decides, each action with the event that records it.

An action is what a run does next; the executor performs it and the aggregate records
it. Each action names the event(s) that record it (``EVENTS``), says whether a recorded
event is the one it would produce (:meth:`matches`: replay uses this to check a history
against the current scheduler), and, for the decisions that need no tool, records itself
on the run (:meth:`record`: the executor uses this). One table, two users, so the
executor and the replayer cannot disagree on what an action means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from saga.domain import ENDINGS, Run
from saga.domain.revisions import key_of, reopen
from saga.domain.undos import leave_undone, start_undo


def brief(value: Any, limit: int = 120) -> str:
    """A value's repr, cut to ``limit`` characters (for messages)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


@dataclass(frozen=True)
class StartStep:
    """Record ``StepStarted`` and run the step (not before ``not_before``, an ISO time)."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepStarted",)
    step_id: str
    iteration: int
    attempt: int
    parameters: Any
    not_before: str | None = None

    def record(self, run: Run, worker: str | None) -> None:
        """Record the attempt's start (durable before the tool is called)."""
        run.start_step(self.step_id, self.iteration, self.attempt, self.parameters, worker)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return (kind == "StepStarted" and e.step_id == self.step_id
                and e.attempt == self.attempt and e.parameters == self.parameters)

    def describe(self) -> str:
        """The action in words."""
        return f"StartStep {self.step_id} attempt {self.attempt} with {brief(self.parameters)}"


@dataclass(frozen=True)
class StartLoop:
    """Record a for-each step's ``StepStarted`` with the items it will iterate over (or a
    repeat step's with its bound, ``{"repeat": N}``); its iterations (1-based) then start
    as steps of their own."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepStarted",)
    step_id: str
    items: list[Any] | dict[str, Any]

    @property
    def parameters(self) -> dict[str, Any]:
        """What the loop step's ``StepStarted`` records."""
        return self.items if isinstance(self.items, dict) else {"items": self.items}

    def record(self, run: Run, worker: str | None) -> None:
        """Record the loop step's start."""
        run.start_step(self.step_id, 0, 1, self.parameters, worker)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return (kind == "StepStarted" and e.step_id == self.step_id and e.iteration == 0
                and e.parameters == self.parameters)

    def describe(self) -> str:
        """The action in words."""
        return f"StartLoop {self.step_id}"


@dataclass(frozen=True)
class CompleteStep:
    """Record a ``StepCompleted`` the scheduler derives (a loop's list of outputs)."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepCompleted",)
    step_id: str
    iteration: int
    output: Any

    def record(self, run: Run, worker: str | None) -> None:
        """Record the derived output."""
        run.complete_step(self.step_id, self.iteration, 1, self.output, 0)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return (kind == "StepCompleted" and e.step_id == self.step_id
                and e.iteration == self.iteration and e.output == self.output)

    def describe(self) -> str:
        """The action in words."""
        return f"CompleteStep {self.step_id}"


@dataclass(frozen=True)
class RunRemedy:
    """Call the next remedy of a step's auto-heal (before its retry)."""

    EVENTS: ClassVar[tuple[str, ...]] = ("RemedyApplied",)
    step_id: str
    iteration: int
    index: int
    tool: str
    parameters: Any

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return kind == "RemedyApplied" and e.step_id == self.step_id and e.index == self.index

    def describe(self) -> str:
        """The action in words."""
        return f"RunRemedy {self.step_id} #{self.index} ({self.tool})"


@dataclass(frozen=True)
class SkipStep:
    """Record ``StepSkipped``."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepSkipped",)
    step_id: str
    iteration: int
    reason: str

    def record(self, run: Run, worker: str | None) -> None:
        """Record the skip and its reason."""
        run.skip_step(self.step_id, self.iteration, self.reason)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return kind == "StepSkipped" and e.step_id == self.step_id and e.reason == self.reason

    def describe(self) -> str:
        """The action in words."""
        return f"SkipStep {self.step_id} ({self.reason})"


@dataclass(frozen=True)
class FailStep:
    """Record a ``StepFailed`` that no tool reported: a template error before the call, a
    rejected approval, or an attempt interrupted by the death of its worker (which, when
    ``retry_at`` is set, runs again at once)."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepFailed",)
    step_id: str
    iteration: int
    attempt: int
    error_type: str
    message: str
    retry_at: str | None = None

    def record(self, run: Run, worker: str | None) -> None:
        """Record the failure (and its immediate retry, when it has one)."""
        run.fail_step(self.step_id, self.iteration, self.attempt, self.error_type,
                      self.message, self.retry_at is not None, self.retry_at)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return (kind == "StepFailed" and e.step_id == self.step_id
                and e.error_type == self.error_type)

    def describe(self) -> str:
        """The action in words."""
        return f"FailStep {self.step_id} ({self.error_type})"


@dataclass(frozen=True)
class RequestApproval:
    """Record ``ApprovalRequested``; the run waits."""

    EVENTS: ClassVar[tuple[str, ...]] = ("ApprovalRequested",)
    step_id: str
    message: str

    def record(self, run: Run, worker: str | None) -> None:
        """Record the request; the run waits for a person."""
        run.request_approval(self.step_id, self.message)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return kind == "ApprovalRequested" and e.step_id == self.step_id

    def describe(self) -> str:
        """The action in words."""
        return f"RequestApproval {self.step_id}"


@dataclass(frozen=True)
class StartCompensation:
    """Record ``CompensationStarted`` with the steps to undo, in order."""

    EVENTS: ClassVar[tuple[str, ...]] = ("CompensationStarted",)
    reason: str
    steps: list[str]

    def record(self, run: Run, worker: str | None) -> None:
        """Record the rollback and its order."""
        run.start_compensation(self.reason, self.steps)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return kind == "CompensationStarted" and list(e.steps) == list(self.steps)

    def describe(self) -> str:
        """The action in words."""
        return f"StartCompensation of {self.steps}"


@dataclass(frozen=True)
class CompensateStep:
    """Run one step's compensation (with its parameters rendered); ``tool`` None means the
    step tool's own compensation, called with the step's recorded parameters and output.
    ``attempt``: 1, one more for each earlier call an interruption cut short. ``error``:
    it cannot be called (``error_type``), and fails as it is recorded."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepCompensationStarted", "StepCompensated",
                                         "CompensationFailed")
    step_id: str
    iteration: int
    tool: str | None
    parameters: Any
    error: str | None = None
    attempt: int = 1
    error_type: str = "ExpressionError"

    def start(self, run: Run, worker: str | None) -> None:
        """Record the call's start (durable before the undo is called), under the step's
        idempotency key with ``:compensate``."""
        key = key_of(run, self.step_id, self.iteration) + ":compensate"
        start_undo(run, self.step_id, self.iteration, self.attempt, self.tool,
                   self.parameters, key, worker)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action (a run recorded before undo calls had
        their start has only their ends)."""
        if kind == "StepCompensationStarted":
            return bool(e.step_id == self.step_id and e.iteration == self.iteration
                        and e.attempt == self.attempt and e.parameters == self.parameters)
        return kind in self.EVENTS and e.step_id == self.step_id

    def describe(self) -> str:
        """The action in words."""
        return f"CompensateStep {self.step_id}"


@dataclass(frozen=True)
class LeaveUndone:
    """Record ``StepNotUndone``: a step whose compensation cannot be said (it reads an
    output its interrupted attempt never recorded) is named not undone, with ``reason``."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepNotUndone",)
    step_id: str
    iteration: int
    reason: str
    #: what a compensation would call: nothing (read by whoever compares compensations)
    tool: ClassVar[None] = None
    parameters: ClassVar[None] = None

    def record(self, run: Run, worker: str | None) -> None:
        """Record the step as not undone."""
        leave_undone(run, self.step_id, self.iteration, self.reason)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action. A run recorded before saga said so
        recorded the template error as a failed compensation instead: that is it too."""
        if kind == "CompensationFailed":
            return bool(e.step_id == self.step_id and e.error_type == "ExpressionError")
        return kind == "StepNotUndone" and e.step_id == self.step_id \
            and e.iteration == self.iteration

    def describe(self) -> str:
        """The action in words."""
        return f"LeaveUndone {self.step_id}: {self.reason}"


@dataclass(frozen=True)
class FinishRun:
    """Record the run's outcome."""

    EVENTS: ClassVar[tuple[str, ...]] = tuple(ENDINGS)
    status: str
    outputs: Any = None
    error: dict[str, Any] | None = None
    failed_step: str | None = None
    actor: str | None = None

    def record(self, run: Run, worker: str | None) -> None:
        """Record the outcome."""
        run.finish(self.status, self.outputs, self.error, self.failed_step, self.actor)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action (the same ending, the same outputs)."""
        # The kind first: another event has no outputs to compare.
        return ENDINGS.get(kind) == self.status and (
            self.status == "cancelled" or e.outputs == self.outputs)

    def describe(self) -> str:
        """The action in words."""
        return f"FinishRun {self.status} with outputs {brief(self.outputs)}"


@dataclass(frozen=True)
class ReopenSteps:
    """Record ``StepsReopened``: a reset's undo is done, its steps start over."""

    EVENTS: ClassVar[tuple[str, ...]] = ("StepsReopened",)
    step: str
    steps: list[str]

    def record(self, run: Run, worker: str | None) -> None:
        """Record the reopening (the run's next reset generation)."""
        reopen(run, self.step, self.steps)

    def matches(self, kind: str, e: Any) -> bool:
        """Whether a recorded event is this action."""
        return kind == "StepsReopened" and list(e.steps) == list(self.steps)

    def describe(self) -> str:
        """The action in words."""
        return f"ReopenSteps {self.steps} (reset to {self.step})"


Action = (StartStep | StartLoop | CompleteStep | RunRemedy | SkipStep | FailStep
          | RequestApproval | StartCompensation | CompensateStep | LeaveUndone | FinishRun
          | ReopenSteps)
#: Actions that only record an event: the executor calls ``record`` and nothing else.
Recorded = StartLoop | CompleteStep | SkipStep | FailStep | RequestApproval \
    | StartCompensation | LeaveUndone | FinishRun | ReopenSteps
