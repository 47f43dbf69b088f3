"""The run's vocabulary: statuses, event names, the one status rule, typed state, the
ids every stage uses, and recorded-time arithmetic. Pure."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal, TypedDict, get_args
from uuid import UUID, uuid5

from saga.errors import InputError, Problem, RunNotFoundError

RunStatus = Literal["running", "waiting", "paused", "completed", "failed", "compensating",
                   "compensated", "cancelled"]


StepStatus = Literal["pending", "running", "completed", "failed", "skipped", "compensated"]


RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)


TERMINAL: frozenset[RunStatus] = frozenset({"completed", "failed", "compensated", "cancelled"})

#: Every event a run records, by name: the log's vocabulary (a stored topic is
#: ``TOPIC_PREFIX + name``). Other modules name events through these, never by spelling.


EVENT_TYPES = (
    "RunStarted", "StepStarted", "StepCompleted", "StepFailed", "StepSkipped",
    "HealStarted", "RemedyApplied", "ApprovalRequested", "ApprovalGranted",
    "ApprovalRejected", "CompensationStarted", "StepCompensated", "CompensationFailed",
    "RunRetried", "RunCompleted", "RunFailed", "RunCompensated", "RunCancelled",
    "RunPaused", "RunUnpaused", "StepWaiting", "SignalReceived", "RunTimedOut",
    "RetentionApplied", "RunTakenOver", "DefinitionMigrated", "RunLabelled", "RunReset",
    "StepsReopened", "HeartbeatRecorded",
    "StepAwaitingPool",
    "StepWaitingForResource",
    "StepCompensationStarted", "StepNotUndone")


TOPIC_PREFIX = "saga."
#: The events that end a run, with the status each leaves.


ENDINGS: dict[str, RunStatus] = {"RunCompleted": "completed", "RunFailed": "failed",
                                 "RunCompensated": "compensated", "RunCancelled": "cancelled"}


DECISIONS = frozenset({"ApprovalGranted", "ApprovalRejected"})
#: The events another process may record on a run while its driver holds it: commands
#: (a rollback only when requested) and revisions (``saga label``, ``saga migrate``, a
#: reset of a run whose only steps in flight wait). The driver takes them in
#: (saga.executor.incoming); anything else recorded there meanwhile is a second driver's,
#: turned away by the fence. (The rest comes from a run's driver only: its decisions,
#: its calls' outcomes, the beats it settles; retention and a retry only touch a finished
#: run, and notifications and live heartbeats are kept beside the log.)
COMMANDS = DECISIONS | {"RunPaused", "RunUnpaused", "SignalReceived", "CompensationStarted",
                        "RunLabelled", "DefinitionMigrated", "RunReset"}
#: Events after which a waiting run may be waiting no longer.
RESOLVING = DECISIONS | {"StepCompleted", "StepFailed", "StepSkipped"}


class StepState(TypedDict, total=False):
    """One execution of a step (``step[i]`` for iteration i) as the run's fold holds it."""

    step_id: str
    iteration: int
    status: StepStatus
    attempt: int
    parameters: Any
    output: Any
    error: dict[str, Any] | None
    reason: str
    retry_at: str | None
    attempt_started_at: str
    running_since: str | None  # the attempt in flight's start (None when none runs)
    heartbeat: dict[str, Any]  # what an attempt's tool last beat (saga.domain.heartbeats)
    started_at: str | None
    finished_at: str | None
    duration_ms: int | None
    worker: str | None
    healing: dict[str, Any] | None
    heals: dict[str, int]
    cache: dict[str, Any] | None
    wait: dict[str, Any] | None  # a timer or a signal the step waits for
    retryable: bool
    compensation_error: dict[str, Any] | None
    interrupted: int  # attempts a worker's death cut short (see Run.RunTakenOver)
    blamed: int  # of those, the deaths the attempt itself likely caused


class RunState(TypedDict, total=False):
    """A run as a JSON object (:func:`saga.views.run_summary`'s shape, without its steps)."""

    run_id: str
    definition: str  # the composition's name, under the field every command uses
    name: str  # the same, under its older field name (kept for compatibility)
    status: RunStatus
    actor: str | None
    started_at: str
    finished_at: str | None
    outputs: Any
    error: dict[str, Any] | None
    failed_step: str | None


def event_name(topic: str) -> str:
    """An event's name from its stored topic (``saga.StepStarted`` -> ``StepStarted``)."""
    return topic.removeprefix(TOPIC_PREFIX)


def status_after(event: str, status: RunStatus, *,
                 still_waiting: bool | Callable[[], bool] = False) -> RunStatus:
    """The run status an event leaves, from the status before it: the one rule the
    aggregate, the read model and the worker's index all fold with.

    ``still_waiting``: after an event that may end a wait (:data:`RESOLVING`), an
    approval, a timer or a signal is still awaited. A callable is asked only when the
    answer matters: the aggregate's own answer walks its open steps, on every event.
    """
    if event in ENDINGS:
        return ENDINGS[event]
    if event == "RunPaused":
        return "paused"
    if event in ("CompensationStarted", "RunReset"):
        return "compensating"
    if status == "paused" and event != "RunUnpaused":
        return status
    if event in ("ApprovalRequested", "StepWaiting"):
        return "waiting"
    if event in ("RunStarted", "RunRetried", "RunUnpaused", "StepsReopened") or (
            status == "waiting" and event in RESOLVING):
        waiting = still_waiting() if callable(still_waiting) else still_waiting
        return "waiting" if waiting else "running"
    return status


def step_key(step_id: str, iteration: int = 0) -> str:
    """The key of one execution of a step in the run's state."""
    return step_id if iteration == 0 else f"{step_id}[{iteration}]"


def idempotency_key(run_id: str, step_id: str, iteration: int = 0, generation: int = 0) -> str:
    """The stable key a tool sees on every attempt and re-execution of one step
    (``generation``: how many resets reopened the step; each gives it a new key)."""
    key = f"{run_id}:{step_id}:{iteration}"
    return key if not generation else f"{key}:reset{generation}"


_CHILD_NAMESPACE = UUID("0b7d2c1e-5a4f-4f7e-9d61-2f8a3c9e1b55")


_NAME_NAMESPACE = UUID("5d3c8f0e-2b71-4c9a-8e4f-6a1d9b7c3e20")


def run_uuid(run_id: str | UUID) -> UUID:
    """The store key of a run: its id when that is a UUID, else derived from the name a
    caller chose (``ORDER-42``), so a name always finds the same run."""
    if isinstance(run_id, UUID):
        return run_id
    try:
        return UUID(run_id)
    except ValueError:
        pass
    try:
        return uuid5(_NAME_NAMESPACE, run_id)
    except UnicodeEncodeError:  # a lone surrogate: no run was ever named so
        raise RunNotFoundError(run_id) from None


def child_run_id(parent_run_id: str, step_id: str, iteration: int, generation: int = 0) -> str:
    """The id of the child run a ``use`` step starts: derived from its parent's id, step
    and iteration, so a step re-executed after a crash finds the child it started (and,
    after a reset reopened the step, ``generation``: a new child)."""
    name = f"{parent_run_id}:{step_id}:{iteration}" + (f":reset{generation}" if generation
                                                       else "")
    return str(uuid5(_CHILD_NAMESPACE, name))


#: The last time :func:`iso` formatted, and its text: a new event's time is formatted for
#: its hash and then again by the handler that applies it. Held by the value itself, so
#: an ``is`` match is that very object (one tuple, so threads read a matching pair).
_LAST_ISO: tuple[Any, str] = (None, "None")


def iso(value: Any) -> str:
    """A recorded time as ISO text."""
    global _LAST_ISO
    last = _LAST_ISO
    if last[0] is value:
        return last[1]
    text = value.isoformat() if hasattr(value, "isoformat") else str(value)
    _LAST_ISO = (value, text)
    return text


def ms_between(start: str | None, end: str) -> int | None:
    """Milliseconds between two recorded ISO times (None without a start)."""
    if start is None:
        return None
    delta = datetime.fromisoformat(end) - datetime.fromisoformat(start)
    return round(delta.total_seconds() * 1000)


# \Z, not $: "$" also matches before a final newline, which no id or key may end with.
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,199}\Z")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}\Z")


def names_a_run(text: str) -> bool:
    """Whether ``text`` can be a run's id or chosen name, or the prefix of one; anything
    else (a lone surrogate from a mangled command line, say) names no run."""
    if not isinstance(text, str):
        return False
    try:
        UUID(text)
    except ValueError:
        return bool(_RUN_ID.match(text))
    return True


def check_run_id(run_id: str) -> str:
    """A run id a caller chose: 1-200 letters, digits and ``._:@/+-``, starting with a
    letter or digit (it is shown, typed and used in file names and URLs)."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise InputError([Problem("--id", f"{str(run_id)[:80]!r} is not a run id: use 1-200 "
                                          "letters, digits and ._:@/+- (starting with a "
                                          "letter or digit)")])
    return run_id


_SIGNAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,99}\Z")


def check_signal_name(name: Any) -> str:
    """A signal's name: 1-100 letters, digits and ``._:-``, starting with one of the first
    two."""
    if not isinstance(name, str) or not _SIGNAL.match(name):
        raise InputError([Problem("signal", f"{str(name)[:80]!r} is not a signal name: "
                                            "letters, digits and ._:-")])
    return name


def check_labels(labels: Mapping[str, Any]) -> dict[str, str]:
    """Labels as recorded: short keys, text values."""
    problems = [Problem(f"--label {k}", "a label key is 1-63 letters, digits and ._/-")
                for k in labels if not isinstance(k, str) or not _LABEL_KEY.match(k)]
    problems += [Problem(f"--label {k}", "a label value is at most 200 characters, no NUL")
                 for k, v in labels.items() if len(str(v)) > 200 or "\x00" in str(v)]
    if problems:
        raise InputError(problems)
    return {k: str(v) for k, v in labels.items()}


#: The queue of a run that names none (neither its composition nor its submit).
DEFAULT_QUEUE = "default"
_QUEUE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def check_queue(queue: Any) -> str:
    """A queue's name: 1-63 letters, digits and ``._-``, starting with a letter or digit."""
    if not isinstance(queue, str) or not _QUEUE.match(queue):
        raise InputError([Problem("--queue", f"{str(queue)[:80]!r} is not a queue name: use "
                                             "1-63 letters, digits and ._- (starting with a "
                                             "letter or digit)")])
    return queue


def check_priority(priority: Any) -> int:
    """A run's priority: an integer (higher is claimed first), within ±1,000,000."""
    if isinstance(priority, str) and re.fullmatch(r"[+-]?\d{1,7}", priority.strip()):
        priority = int(priority)
    if isinstance(priority, bool) or not isinstance(priority, int) \
            or abs(priority) > 1_000_000:
        raise InputError([Problem("--priority", f"{str(priority)[:80]!r} is not an integer "
                                                "within ±1000000")])
    return priority


def queue_of(options: Mapping[str, Any] | None, definition: Mapping[str, Any] | None) -> str:
    """The queue a run is in, from its ``RunStarted``: the ``options`` recorded when it was
    started, else its composition's ``queue`` (runs recorded before queues), else
    :data:`DEFAULT_QUEUE`."""
    return str((options or {}).get("queue") or (definition or {}).get("queue")
               or DEFAULT_QUEUE)


def priority_of(options: Mapping[str, Any] | None) -> int:
    """A run's priority from its recorded ``options`` (0 when it has none)."""
    value = (options or {}).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def queue_options(queue: str | None, priority: Any) -> dict[str, Any]:
    """The options a run records to be claimed from a queue: its queue (checked;
    :data:`DEFAULT_QUEUE` when None) and its priority (checked; 0 when None)."""
    return {"queue": check_queue(queue or DEFAULT_QUEUE),
            "priority": check_priority(0 if priority is None else priority)}
