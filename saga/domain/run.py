"""The ``Run`` aggregate: one run of a composition, as a fold over its events.

Every decision and result of a run is one of the past-tense events below (or in
:mod:`~saga.domain.revisions` and :mod:`~saga.domain.waits`); the state
(status of the run and of each step, outputs, attempts, compensation progress) is built
from them and nothing else. Payloads are plain JSON values so SQL and other languages can
read the log. Event handlers only change state: no clock, no I/O, no randomness (the
library stamps each event with its ``timestamp`` when it is triggered, and the fold reads
it from there).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, ClassVar
from uuid import uuid4

from eventsourcing.domain import Aggregate
from eventsourcing.domain import Snapshot as LibrarySnapshot
from eventsourcing.utils import register_topic

from saga.chain import (
    GENESIS,
    event_hash,
    genesis,
    link_fields,
    new_event,
    payload_defaults,
    seal,
)
from saga.domain.commands import RunCommands
from saga.domain.steps import DERIVED, StepStates
from saga.domain.vocabulary import (
    TERMINAL,
    RunStatus,
    StepState,
    iso,
    ms_between,
    priority_of,
    queue_of,
    run_uuid,
    status_after,
    step_key,
)
from saga.errors import DoctoredSnapshotError


class Run(RunCommands, StepStates, Aggregate):
    """One run of a composition: the event-sourced unit of consistency (one writer).

    Every event carries the hash of its predecessor (``prev_hash``), the hash of its own
    payload and the actor it was recorded for; with an audit key configured, also an
    HMAC of its own link, so an edited, deleted, inserted or reordered event is detected.
    """

    TOPIC = "saga.Run"
    #: HMAC key for event links, set once per process from configuration (never stored).
    audit_key: ClassVar[bytes | None] = None
    #: Defaults for state added since runs were first recorded (an older snapshot lacks it).
    paused = False
    takeovers = 0  # attempts a dead worker left behind, over the run's life
    suspect = False  # taken over since a step last completed: driven alone
    timed_out: str | None = None
    deadline_undoes_cut = False  # (see RunTimedOut.undo_cut)

    class Event(Aggregate.Event):
        """Base of every run event: the audit chain fields, then the payload."""

        actor: str | None
        prev_hash: str
        payload_hash: str
        mac: str | None

        def apply(self, aggregate: Any) -> None:  # pragma: no cover - overridden
            """Change the run's state to reflect this event."""

        def link(self) -> str:
            """This event's hash in its run's chain."""
            return event_hash(type(self).__name__, self.originator_version,
                              iso(self.timestamp), self.actor, self.payload_hash,
                              self.prev_hash)

        def changed(self) -> list[str]:
            """The keys of the step executions whose state this event may change."""
            iteration = getattr(self, "iteration", None)
            step_id = getattr(self, "step_id", None)
            return [] if iteration is None or step_id is None else [step_key(step_id, iteration)]

        def mutate(self, aggregate: Any) -> Any:
            return self.chain_onto(aggregate, self.link())

        def chain_onto(self, aggregate: Any, link: str) -> Any:
            """:meth:`mutate`, with this event's link already known (a new event's is:
            its chain fields were computed from it)."""
            before: RunStatus = aggregate.status if aggregate is not None else "running"
            aggregate = super().mutate(aggregate)
            aggregate._reindex(self.changed())
            aggregate.status = status_after(type(self).__name__, before,
                                            still_waiting=lambda: aggregate.is_waiting)
            aggregate.head_hash = link
            return aggregate

    class Snapshot(LibrarySnapshot):
        """A snapshot sealed with a digest of its state (an HMAC with the audit key), so
        an edited snapshot is refused instead of trusted (see :func:`seal`)."""

        TOPIC = "saga.Run.Snapshot"

        @classmethod
        def take(cls, aggregate: Any) -> Any:
            snapshot = super().take(aggregate)
            for name in DERIVED:  # rebuilt from steps when the snapshot loads
                snapshot.state.pop(name, None)
            snapshot.state["seal"] = seal(snapshot.state, Run.audit_key)
            return snapshot

        def mutate(self, _: None) -> Any:
            state = dict(self.state)
            if seal(state, Run.audit_key) != state.get("seal"):
                raise DoctoredSnapshotError(
                    f"the snapshot of run {self.originator_id} at version "
                    f"{self.originator_version} does not match its seal")
            return super().mutate(_)

    class Created(Event, Aggregate.Created):
        TOPIC = "saga.Run.Created"

    class RunStarted(Created):
        """The run was accepted: its definition (normalised), inputs, context and options."""

        TOPIC = "saga.RunStarted"
        definition: dict[str, Any]
        definition_hash: str
        inputs: dict[str, Any]
        context: dict[str, Any]
        options: dict[str, Any]

    @classmethod
    def begin(cls, definition: dict[str, Any], definition_hash: str, inputs: dict[str, Any],
              context: dict[str, Any], options: dict[str, Any],
              run_id: str | None = None) -> Run:
        """Start a new run (the first link of its chain), with a new id unless given."""
        fields = {"definition": definition, "definition_hash": definition_hash,
                  "inputs": inputs, "context": context, "options": options}
        timestamp = cls.RunStarted.create_timestamp()
        uid = run_uuid(run_id) if run_id else uuid4()
        chain, _ = link_fields("RunStarted", 1, iso(timestamp), context.get("actor"), fields,
                               genesis(str(uid)), cls.audit_key)
        return cls._create(cls.RunStarted, id=uid, timestamp=timestamp, **fields, **chain)

    def trigger_event(self, event_class: Any, **kwargs: Any) -> None:
        """Trigger an event as the next link of the run's chain."""
        # Defaults are spelled out so the payload hash covers exactly what is stored.
        for name, default, factory in payload_defaults(event_class):
            if name not in kwargs:
                kwargs[name] = default if factory is None else factory()
        timestamp = event_class.create_timestamp()
        actor = kwargs.pop("actor", None) or self.actor
        version = self.version + 1
        chain, link = link_fields(event_class.__name__, version, iso(timestamp), actor,
                                  kwargs, self.head_hash, self.audit_key)
        # What the library's trigger_event does, but the event joins the chain with the
        # link just computed: its mutate would hash it (and format its time) again.
        event = new_event(event_class, self.id, version, timestamp, kwargs, chain)
        event.chain_onto(self, link)
        self._pending_events.append(event)

    def __init__(self, definition: dict[str, Any], definition_hash: str,
                 inputs: dict[str, Any], context: dict[str, Any], options: dict[str, Any]) -> None:
        self.head_hash = GENESIS
        self.definition = definition
        self.definition_hash = definition_hash
        self.inputs = inputs
        self.context = context
        self.options = options
        self.status = "running"
        self.steps: dict[str, StepState] = {}
        self.completion_order: list[str] = []
        self.compensation: dict[str, Any] | None = None
        self.approvals: dict[str, dict[str, Any]] = {}
        self.signals: list[dict[str, Any]] = []
        self.paused = False
        self.outputs: Any = None
        self.error: dict[str, Any] | None = None
        self.failed_step: str | None = None
        self.started_at = iso(self.created_on)
        self.finished_at: str | None = None
        self.actor: str | None = context.get("actor")

    @property
    def run_id(self) -> str:
        """The run's id as text: the name its caller chose, else its UUID."""
        # Asked a few times per step (keys, spans): a UUID's text is not free. Not 3.11's
        # cached_property, whose one lock for every instance cost 0.8% of a step here.
        found: str | None = self.__dict__.get("_run_id")
        if found is None:
            found = self.__dict__["_run_id"] = str(self.context.get("run_id") or self.id)
        return found

    @property
    def name(self) -> str:
        """The composition's name."""
        return str(self.definition.get("name", ""))

    @property
    def queue(self) -> str | None:
        """The queue workers claim the run from (recorded in ``RunStarted``); None for a
        child run, which its parent drives."""
        return None if self.context.get("parent") else queue_of(self.options, self.definition)

    @property
    def priority(self) -> int:
        """The run's priority in its queue: higher is claimed first."""
        return priority_of(self.options)

    @property
    def is_finished(self) -> bool:
        """True once the run reached a terminal status."""
        return self.status in TERMINAL

    # -- step events -------------------------------------------------------------------

    class StepStarted(Event):
        """An attempt of a step began; durable before the tool is called."""

        TOPIC = "saga.StepStarted"
        step_id: str
        iteration: int
        attempt: int
        parameters: Any
        idempotency_key: str
        worker: str | None

        def apply(self, aggregate: Any) -> None:
            s = aggregate._step(self.step_id, self.iteration)
            s.update(status="running", attempt=self.attempt, parameters=self.parameters,
                     idempotency_key=self.idempotency_key, worker=self.worker, retry_at=None,
                     error=None, wait=None, duration_ms=None)
            at = iso(self.timestamp)
            s["started_at"] = s["started_at"] or at
            s["attempt_started_at"] = at
            s["running_since"] = at  # until this attempt ends

    class StepCompleted(Event):
        """An attempt succeeded; its output exists only once this event is durable."""

        TOPIC = "saga.StepCompleted"
        step_id: str
        iteration: int
        attempt: int
        output: Any
        duration_ms: int
        cache: dict[str, Any] | None = None

        def apply(self, aggregate: Any) -> None:
            s = aggregate._step(self.step_id, self.iteration)
            s.update(status="completed", output=self.output, finished_at=iso(self.timestamp),
                     error=None, retry_at=None)
            if aggregate.suspect:
                aggregate.suspect = False  # it moves on: driven beside others again
            if self.cache is not None:
                s["cache"] = self.cache
            # The attempt's own duration, as measured around the call (never the time the
            # step waited for a retry or an approval before it). One recorded as 0 (a loop's
            # outputs the scheduler derives, a cache hit, a call under a millisecond) counts
            # from the attempt's StepStarted instead.
            s["duration_ms"] = self.duration_ms or ms_between(s.get("running_since"),
                                                              s["finished_at"])
            s["running_since"] = None
            aggregate.completion_order.append(step_key(self.step_id, self.iteration))

    class StepFailed(Event):
        """An attempt (or the step, before any attempt) failed; says whether it will retry."""

        TOPIC = "saga.StepFailed"
        step_id: str
        iteration: int
        attempt: int
        error_type: str
        message: str
        retryable: bool
        next_retry_at: str | None

        def apply(self, aggregate: Any) -> None:
            s = aggregate._step(self.step_id, self.iteration)
            s.update(status="failed", attempt=self.attempt, retry_at=self.next_retry_at,
                     error={"type": self.error_type, "message": self.message},
                     finished_at=iso(self.timestamp), retryable=self.retryable)
            if s.get("running_since") is not None:  # the failed attempt's own duration
                s["duration_ms"] = ms_between(s["running_since"], s["finished_at"])
                s["running_since"] = None

    class StepSkipped(Event):
        """A step did not run: its condition was false, or what it needs did not happen."""

        TOPIC = "saga.StepSkipped"
        step_id: str
        iteration: int
        reason: str

        def apply(self, aggregate: Any) -> None:
            s = aggregate._step(self.step_id, self.iteration)
            s.update(status="skipped", reason=self.reason, finished_at=iso(self.timestamp))

    class HealStarted(Event):
        """A failed attempt matched an auto-heal handler: its remedies run, then a retry."""

        TOPIC = "saga.HealStarted"
        step_id: str
        iteration: int
        attempt: int
        handler: int
        remedies: list[dict[str, Any]]

        def apply(self, aggregate: Any) -> None:
            s = aggregate._step(self.step_id, self.iteration)
            s["healing"] = {"handler": self.handler, "remedies": self.remedies, "done": []}
            heals = s.setdefault("heals", {})
            heals[str(self.handler)] = heals.get(str(self.handler), 0) + 1

    class RemedyApplied(Event):
        """One remedy of an auto-heal ran (successfully or not; the retry follows anyway)."""

        TOPIC = "saga.RemedyApplied"
        step_id: str
        iteration: int
        index: int
        ok: bool
        output: Any
        error: str | None

        def apply(self, aggregate: Any) -> None:
            s = aggregate._step(self.step_id, self.iteration)
            healing = s["healing"]
            healing["done"].append({"ok": self.ok, "output": self.output, "error": self.error})
            if len(healing["done"]) >= len(healing["remedies"]):
                s.setdefault("healed", []).append(healing)
                s["healing"] = None

    class ApprovalRequested(Event):
        """A step waits for a person's decision before it runs."""

        TOPIC = "saga.ApprovalRequested"
        step_id: str
        message: str
        until: str | None = None  # when the confirmation's default applies, if it has one

        def apply(self, aggregate: Any) -> None:
            aggregate.approvals[self.step_id] = {"status": "requested", "message": self.message,
                                                 "requested_at": iso(self.timestamp),
                                                 "until": self.until}

    class ApprovalGranted(Event):
        """Someone approved a waiting step."""

        TOPIC = "saga.ApprovalGranted"
        step_id: str
        actor: str
        comment: str | None

        def apply(self, aggregate: Any) -> None:
            aggregate.approvals[self.step_id].update(status="granted", actor=self.actor,
                                                     comment=self.comment)

    class ApprovalRejected(Event):
        """Someone rejected a waiting step; the step fails and follows its on_error."""

        TOPIC = "saga.ApprovalRejected"
        step_id: str
        actor: str
        comment: str | None

        def apply(self, aggregate: Any) -> None:
            aggregate.approvals[self.step_id].update(status="rejected", actor=self.actor,
                                                     comment=self.comment)

    # -- takeovers and pauses (the waits' events are in saga.domain.waits) -----------

    class RunTakenOver(Event):
        """A worker took the run over from one that died with attempts in hand (they are
        recorded as interrupted right after). ``seen``: what the taker saw of the lease
        it took, ``{"worker", "expired_at", "renewed_at"}`` (ISO; ``renewed_at``: the
        dead worker's last renewal, the last sign of life it left), or null. Each
        attempt in flight counts an interruption, blamed on it or not (see
        :meth:`~saga.domain.steps.StepStates._interrupt`)."""

        TOPIC = "saga.RunTakenOver"
        worker: str | None
        seen: dict[str, Any] | None = None

        def apply(self, aggregate: Any) -> None:
            aggregate.takeovers = aggregate.takeovers + 1
            aggregate._interrupt(self.seen or {})

    class RunPaused(Event):
        """Someone paused the run: no new step starts; attempts in flight finish."""

        TOPIC = "saga.RunPaused"
        reason: str | None

        def apply(self, aggregate: Any) -> None:
            aggregate.paused = True

    class RunUnpaused(Event):
        """Someone let a paused run go on."""

        TOPIC = "saga.RunUnpaused"

        def apply(self, aggregate: Any) -> None:
            aggregate.paused = False

    # -- compensation ------------------------------------------------------------------

    class CompensationStarted(Event):
        """Rollback began: the completed steps to undo, in the order they will be undone."""

        TOPIC = "saga.CompensationStarted"
        reason: str
        steps: list[str]
        requested: bool
        cancel: bool

        def apply(self, aggregate: Any) -> None:
            aggregate.paused = False  # undoing is what was asked: nothing holds it back
            aggregate.compensation = {"reason": self.reason, "steps": list(self.steps),
                                      "done": {}, "actor": self.actor, "cancel": self.cancel,
                                      "requested": self.requested}
            aggregate.finished_at = None

    class StepCompensated(Event):
        """A completed step's compensation ran."""

        TOPIC = "saga.StepCompensated"
        step_id: str
        iteration: int
        output: Any

        def apply(self, aggregate: Any) -> None:
            key = step_key(self.step_id, self.iteration)
            aggregate.compensation["done"][key] = "compensated"
            aggregate.steps[key].update(status="compensated", compensation_output=self.output,
                                        compensated_at=iso(self.timestamp))

    class CompensationFailed(Event):
        """A completed step's compensation failed; the remaining ones still run."""

        TOPIC = "saga.CompensationFailed"
        step_id: str
        iteration: int
        error_type: str
        message: str

        def apply(self, aggregate: Any) -> None:
            key = step_key(self.step_id, self.iteration)
            aggregate.compensation["done"][key] = "failed"
            aggregate.steps[key]["compensation_error"] = {"type": self.error_type,
                                                          "message": self.message}

    class RunRetried(Event):
        """Someone redrove a failed run: its failed steps get new attempts, completed work
        is kept."""

        TOPIC = "saga.RunRetried"
        actor: str
        steps: list[str]
        reopened: list[str] = dataclasses.field(default_factory=list)
        reason: str | None = None
        #: steps failed by a rejected approval: their decision is dropped and they wait
        #: for a new one (none in histories written before this field)
        asked_again: list[str] = dataclasses.field(default_factory=list)

        def changed(self) -> list[str]:
            return [*self.reopened, *self.steps]

        def apply(self, aggregate: Any) -> None:
            for key in self.reopened:  # a loop step whose failed iterations get retried
                aggregate.steps[key].update(status="running", error=None, retry_at=None,
                                            finished_at=None)
            for key in self.asked_again:
                aggregate.approvals.pop(key, None)
            for key in self.steps:
                s = aggregate.steps[key]
                if key in self.asked_again:
                    s.update(status="pending", error=None, retry_at=None, finished_at=None)
                elif s["status"] == "failed":
                    s.update(retry_at=iso(self.timestamp), retryable=True)
                else:  # skipped because something upstream failed: decide again
                    s.update(status="pending", reason=None)
            aggregate.error, aggregate.failed_step, aggregate.finished_at = None, None, None
            aggregate.outputs = None
            aggregate.retried = getattr(aggregate, "retried", 0) + 1

    class RunCompleted(Event):
        """Every step finished and the outputs were built."""

        TOPIC = "saga.RunCompleted"
        outputs: Any

        def apply(self, aggregate: Any) -> None:
            aggregate._finish(self)
            aggregate.outputs = self.outputs

    class RunFailed(Event):
        """The run ended with a failure it did not (or could not fully) undo."""

        TOPIC = "saga.RunFailed"
        error: dict[str, Any]
        failed_step: str | None
        outputs: Any

        def apply(self, aggregate: Any) -> None:
            aggregate._finish(self)
            aggregate.error, aggregate.failed_step = self.error, self.failed_step
            aggregate.outputs = self.outputs

    class RunCompensated(Event):
        """The run failed and every compensation it owed ran."""

        TOPIC = "saga.RunCompensated"
        error: dict[str, Any]
        failed_step: str | None
        outputs: Any

        def apply(self, aggregate: Any) -> None:
            aggregate._finish(self)
            aggregate.error, aggregate.failed_step = self.error, self.failed_step
            aggregate.outputs = self.outputs

    class RetentionApplied(Event):
        """Retention is about to remove user data from this finished run: for each event
        it rewrites (by version), the hash of the payload it leaves, so an auditor can
        tell a redaction from an edit."""

        TOPIC = "saga.RetentionApplied"
        versions: dict[str, str]

        def apply(self, aggregate: Any) -> None:
            aggregate.retained = True

    class RunCancelled(Event):
        """Someone cancelled the run."""

        TOPIC = "saga.RunCancelled"
        actor: str
        reason: str | None

        def apply(self, aggregate: Any) -> None:
            aggregate._finish(self)
            aggregate.error = {"type": "cancelled", "message": self.reason or "cancelled"}

    @property
    def is_waiting(self) -> bool:
        """Waiting for a person, a time or a signal."""
        return bool(self.pending_approvals or self.waits)

    def unconsumed_signals(self, name: str) -> list[Any]:
        """The data of the signals of this name no step has taken yet, oldest first."""
        return [x["data"] for x in self._unconsumed(name)]

    def signal_arrived_by(self, name: str, moment: str) -> bool:
        """Whether the oldest signal of this name no step has taken yet was received at or
        before ``moment`` (an ISO time): a wait timing out then has its signal."""
        left = self._unconsumed(name)
        return bool(left) and datetime.fromisoformat(left[0]["at"]) \
            <= datetime.fromisoformat(moment)

    def _unconsumed(self, name: str) -> list[dict[str, Any]]:
        sent = [x for x in getattr(self, "signals", []) if x["name"] == name]
        taken = sum(1 for s in self.steps.values()
                    if s["status"] in ("completed", "compensated")
                    and (s.get("wait") or {}).get("signal") == name)
        return sent[taken:]

    @property
    def pending_approvals(self) -> list[str]:
        """Steps waiting for an approval decision."""
        return [k for k, v in self.approvals.items() if v["status"] == "requested"]

    def _finish(self, e: Any) -> None:
        self.finished_at = iso(e.timestamp)


# The library registers the topics of an aggregate's events when the class is made, but
# a snapshot class's only when a snapshot is first taken: a process that only reads
# (a CLI command, another worker) could not resolve the topic of a stored snapshot.
register_topic(Run.Snapshot.TOPIC, Run.Snapshot)
