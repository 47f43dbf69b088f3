"""Every error saga raises, rooted in :class:`SagaError`, each with its CLI exit code.

Exit codes: 1 a run ended badly or a generic failure, 2 bad usage or bad input
(definitions, inputs, configuration), 3 the store cannot be reached, 4 an unknown run,
5 a concurrent writer won the race.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def first_line(error: BaseException) -> str:
    """A driver error's first line (its later lines are context a user rarely needs)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class SagaError(Exception):
    """Base of every error saga raises on purpose."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a definition: where (a dotted/indexed path) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    def to_json(self) -> dict[str, str]:
        """The problem as a plain JSON object."""
        return {"path": self.path, "message": self.message}


class DefinitionError(SagaError):
    """Raised when a composition is invalid; carries every problem found, not just the first."""

    exit_code = 2

    def __init__(self, problems: list[Problem], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        where = f"{source} " if source else ""
        n = len(self.problems)
        summary = f"{where}is invalid for {n} reason{'s' if n != 1 else ''}"
        detail = "; ".join(str(p) for p in self.problems)
        super().__init__(f"{summary}: {detail}")


class CompositionNotFoundError(DefinitionError):
    """Raised when the composition a command names is neither a file nor a template: said
    as that, rather than as a composition with something wrong inside it."""

    def __init__(self, problem: Problem) -> None:
        super().__init__([Problem("", problem.message)])
        self.message = problem.message


class InputError(SagaError):
    """Raised when run inputs do not match the composition's input schema."""

    exit_code = 2

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("invalid inputs: " + "; ".join(str(p) for p in self.problems))


class ExpressionError(SagaError):
    """Raised when a template, condition or compute block cannot be parsed, is refused by
    the sandbox, or fails while being evaluated."""

    exit_code = 2

    def __init__(self, message: str, expression: str | None = None) -> None:
        self.expression = expression
        super().__init__(message)


class ExpressionLimit(ExpressionError):
    """Raised when an evaluation exceeds a limit of the sandbox (its time, the size of a
    value it would build); the message says which."""


class ConfigError(SagaError):
    """Raised when configuration (environment, saga.toml, --tools modules) is unusable."""

    exit_code = 2


class ToolError(SagaError):
    """Raised by a tool to fail a step with a typed, readable error."""

    def __init__(self, message: str, *, error_type: str = "ToolError",
                 retryable: bool = True, details: Any = None) -> None:
        self.error_type = error_type
        self.retryable = retryable
        self.details = details
        super().__init__(message)


class HeartbeatTimeout(ToolError):
    """Raised, and recorded as the attempt's error type, when a step with
    ``heartbeat_timeout`` heard no ``ctx.heartbeat`` from its tool for that long: the
    attempt fails and is retried by the step's retry policy."""

    def __init__(self, step_id: str, seconds: float, last_beat: str | None) -> None:
        self.step_id = step_id
        self.seconds = seconds
        since = f"since its last at {last_beat}" if last_beat else "since it started"
        super().__init__(f"step {step_id!r}: no heartbeat for {seconds:g}s ({since})",
                         error_type="HeartbeatTimeout", retryable=True)


class UnknownToolError(SagaError):
    """Raised when a definition or a call names a tool that is not registered."""

    exit_code = 2


class ToolsMissingError(UnknownToolError):
    """Raised before a run is driven when this process lacks tools the run names (its
    ``--tools`` module was not given): an operator's mistake, so nothing was recorded.
    ``modules``: the modules the run was started with, when it recorded them."""

    def __init__(self, run_id: str, tools: list[str], modules: list[str]) -> None:
        self.run_id = run_id
        self.tools = list(tools)
        self.modules = list(modules)
        names = ", ".join(repr(t) for t in self.tools)
        given = " ".join(f"--tools {m}" for m in self.modules) or "--tools MODULE"
        listed = ", ".join(f'"{m}"' for m in self.modules) or '"MODULE"'
        super().__init__(
            f"run {run_id} needs tool{'s' if len(self.tools) != 1 else ''} {names}, which "
            f"this process does not have; nothing was changed: give {given} or list it in "
            f"saga.toml (tools = [{listed}])")


class StoreUnavailableError(SagaError):
    """Raised when the event store cannot be opened or reached. ``lost``: the connection
    was lost in the middle of an operation, which a new connection may cure (see
    :mod:`saga.store.reconnect`)."""

    exit_code = 3

    def __init__(self, message: str, *, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


class RunNotFoundError(SagaError):
    """Raised when a run id does not name a recorded run."""

    exit_code = 4

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in the store")


class ConcurrentWriteError(SagaError):
    """Raised when another writer appended to a run first (the version fence held)."""

    exit_code = 5

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} was changed by another writer; reload and retry")


class RunIdConflictError(SagaError):
    """Raised when a run id a caller chose exists with another definition or inputs."""

    exit_code = 6

    def __init__(self, run_id: str, what: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} already exists with {what}; nothing was started "
                         "(choose another --id, or start it with what it was started with)")


class DoctoredSnapshotError(SagaError):
    """Raised when a stored snapshot of a run is not the state its events produce: its
    seal does not match (it was edited), so it is not trusted."""

    exit_code = 1


class RunStateError(SagaError):
    """Raised when a command does not apply to a run in its current state."""

    exit_code = 2


class MigrationRefusedError(RunStateError):
    """Raised when a run cannot move to a new definition: replaying its history with it
    does not reproduce a recorded decision (nothing was appended)."""

    exit_code = 7

    def __init__(self, run_id: str, divergence: str, check: object = None) -> None:
        self.run_id = run_id
        self.check = check  # the MigrationCheck, for callers that report it
        super().__init__(f"run {run_id} cannot migrate: {divergence}; nothing was changed")


class LeaseLostError(SagaError):
    """Raised when a worker's lease on a run expired and another worker took the run."""

    exit_code = 5

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"lost the lease on run {run_id} to another worker")


class LeaseHeldError(SagaError):
    """Raised when a run is being driven by another worker (its lease has not expired)."""

    exit_code = 5

    def __init__(self, run_id: str, worker: str) -> None:
        self.run_id = run_id
        self.worker = worker
        # a live holder is never taken over: it carries the run on, with any command
        # recorded here, and this process leaves the driving to it
        super().__init__(f"run {run_id} is being driven by worker {worker!r}, which carries "
                         "it on; left to it (to drive it here, try again once its lease "
                         "expires)")


class EncryptionKeyError(SagaError):
    """Raised when a run's payloads are sealed at rest and cannot be opened here: no key is
    configured, the key is not the one that wrapped the run's data key, or a sealed value
    fails its authentication (it was changed)."""

    exit_code = 2


class NotificationNotFoundError(SagaError):
    """Raised when an id (or a prefix of one) names no notification in the outbox, or
    more than one."""

    exit_code = 4
