"""Events that revise a run in flight: moving it to a new definition, resetting it to a
step, changing its labels.

They are events of :class:`~saga.domain.run.Run` like any other (its nested classes are
the same thing): declared here because ``run.py`` is at its size limit, and attached to
``Run`` when this module is imported (``saga.domain`` imports it, so any process that
loads a run knows them). Their handlers only change state.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.utils import register_topic

from saga.domain.run import Run
from saga.domain.vocabulary import idempotency_key, iso


class DefinitionMigrated(Run.Event):
    """The run moved to a new definition: replaying its history with it reproduced every
    recorded decision. From here on it runs on ``definition`` (``to_hash``)."""

    TOPIC = "saga.DefinitionMigrated"
    from_hash: str
    to_hash: str
    definition: dict[str, Any]
    reason: str | None

    def apply(self, aggregate: Any) -> None:
        aggregate.definition = self.definition
        aggregate.definition_hash = self.to_hash
        migrations = aggregate.__dict__.setdefault("migrations", [])
        migrations.append({"from_hash": self.from_hash, "to_hash": self.to_hash,
                           "version": str(self.definition.get("version", "1")),
                           "actor": self.actor, "reason": self.reason,
                           "at": iso(self.timestamp)})
        aggregate.__dict__.pop("_derived", None)  # a frontier folded with the old plan


class RunLabelled(Run.Event):
    """Someone changed the run's labels: each key set to its value, or removed when the
    value is empty."""

    TOPIC = "saga.RunLabelled"
    changes: dict[str, str]

    def apply(self, aggregate: Any) -> None:
        labels = dict(aggregate.context.get("labels") or {})
        for key, value in self.changes.items():
            if value:
                labels[key] = value
            else:
                labels.pop(key, None)
        aggregate.context = {**aggregate.context, "labels": labels}


class RunReset(Run.Event):
    """Someone reset the run to ``step``: the steps in ``undo`` (completed, downstream of
    it, with an undo) are compensated first, most recently completed first; then the step
    executions in ``reopen`` start over (see ``StepsReopened``)."""

    TOPIC = "saga.RunReset"
    step: str
    undo: list[str]
    reopen: list[str]
    reason: str | None

    def apply(self, aggregate: Any) -> None:
        aggregate.paused = False
        aggregate.compensation = {
            "reason": f"reset to {self.step}" + (f": {self.reason}" if self.reason else ""),
            "steps": list(self.undo), "done": {}, "actor": self.actor, "cancel": False,
            "requested": True,
            "reset": {"step": self.step, "reopen": list(self.reopen), "reason": self.reason}}
        aggregate.finished_at = None


class StepsReopened(Run.Event):
    """A reset's undo finished: these step executions start over, with new idempotency
    keys (their ``generation`` is part of the key, so a tool tells a reset from a
    retry)."""

    TOPIC = "saga.StepsReopened"
    step: str
    steps: list[str]
    generation: int

    def apply(self, aggregate: Any) -> None:
        reopened = set(self.steps)
        ids = {aggregate.steps[k]["step_id"] for k in self.steps if k in aggregate.steps}
        for key in self.steps:
            aggregate.steps.pop(key, None)
        aggregate.completion_order = [k for k in aggregate.completion_order
                                      if k not in reopened]
        for step_id in ids:
            aggregate.approvals.pop(step_id, None)  # a confirmation is asked again
        generations = dict(aggregate.__dict__.get("generations") or {})
        for step_id in ids:
            generations[step_id] = self.generation
        aggregate.generations = generations
        aggregate.compensation = None
        aggregate.error, aggregate.failed_step, aggregate.finished_at = None, None, None
        aggregate.outputs = None
        aggregate.resets = self.generation
        # The indexes over steps assume steps only grow: rebuilt from steps on first use.
        for name in ("_unsettled", "_touched", "_derived"):
            aggregate.__dict__.pop(name, None)


EVENTS = (DefinitionMigrated, RunLabelled, RunReset, StepsReopened)
for _cls in EVENTS:
    setattr(Run, _cls.__name__, _cls)
    register_topic(_cls.TOPIC, _cls)


def key_of(run: Any, step_id: str, iteration: int) -> str:
    """The idempotency key of a step execution's attempts: stable across retries and
    re-executions, new after each reset that reopened the step."""
    return idempotency_key(run.run_id, step_id, iteration,
                           (run.__dict__.get("generations") or {}).get(step_id, 0))


def migrate(run: Any, definition: dict[str, Any], to_hash: str, actor: str,
            reason: str | None) -> None:
    """Record that ``run`` moves to ``definition`` (its check already passed)."""
    run.trigger_event(DefinitionMigrated, from_hash=run.definition_hash, to_hash=to_hash,
                      definition=definition, reason=reason, actor=actor)


def relabel(run: Any, changes: dict[str, str], actor: str) -> None:
    """Record a change of the run's labels (an empty value removes one)."""
    run.trigger_event(RunLabelled, changes=changes, actor=actor)


def reset(run: Any, step: str, undo: list[str], reopen: list[str], actor: str,
          reason: str | None) -> None:
    """Record a reset to ``step``: undo these, then reopen those."""
    run.trigger_event(RunReset, step=step, undo=undo, reopen=reopen, reason=reason,
                      actor=actor)


def reopen(run: Any, step: str, steps: list[str]) -> None:
    """Record that a reset's step executions start over (the next generation)."""
    run.trigger_event(StepsReopened, step=step, steps=steps,
                      generation=int(run.__dict__.get("resets") or 0) + 1)


__all__ = ["EVENTS", "DefinitionMigrated", "RunLabelled", "RunReset", "StepsReopened",
           "key_of", "migrate", "relabel", "reopen", "reset"]
