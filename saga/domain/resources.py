"""The event of a step waiting for a resource slot, and the waits it leaves open.

A step naming a resource (``resource: NAME``, or its tool's default, such as the ``http``
tool's ``http:HOST``) that saga.toml limits (``[resources.NAME]``) starts only once it
holds a slot of each of its resources (:mod:`saga.store.resources`). When a slot is not
free, the drive records :class:`StepWaitingForResource` once per attempt, instead of
``StepStarted``, and leaves the step pending: the wait is in the log, from that event
(when it began and for what) to the attempt's ``StepStarted`` (when it ended). Nothing
else about the run changes: its status stays ``running`` (a worker picks it up again
when a slot frees), and the scheduler decides as before.

Attached to ``Run`` when this module is imported, as :mod:`saga.domain.waits` does.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.utils import register_topic

from saga.domain.run import Run
from saga.domain.vocabulary import iso, step_key


class StepWaitingForResource(Run.Event):
    """An attempt of a step is ready to start but waits for a slot of ``resources``
    (their concurrency or rate is used up by other calls, or earlier waiters are
    served first)."""

    TOPIC = "saga.StepWaitingForResource"
    step_id: str
    iteration: int
    attempt: int
    resources: list[str]

    def apply(self, aggregate: Any) -> None:
        waits = aggregate.__dict__.setdefault("resource_waits", {})
        waits[step_key(self.step_id, self.iteration)] = {
            "step_id": self.step_id, "iteration": self.iteration, "attempt": self.attempt,
            "resources": list(self.resources), "since": iso(self.timestamp)}

    def changed(self) -> list[str]:
        return []  # no step's state changes: the step stays pending


def wait_for_resource(run: Run, step_id: str, iteration: int, attempt: int,
                      resources: list[str]) -> bool:
    """Record that this attempt waits for ``resources``, unless that is recorded already
    (one event per attempt, however often its drive asks again); whether it recorded."""
    known = (run.__dict__.get("resource_waits") or {}).get(step_key(step_id, iteration))
    if known is not None and known["attempt"] == attempt \
            and known["resources"] == list(resources):
        return False
    run.trigger_event(StepWaitingForResource, step_id=step_id, iteration=iteration,
                      attempt=attempt, resources=list(resources))
    return True


def resource_waits(run: Run) -> list[dict[str, Any]]:
    """The steps of an unfinished run that wait for a resource now: each recorded wait
    whose attempt has not started since (``step``, ``resources``, ``since``)."""
    if run.is_finished or run.compensation is not None:
        return []
    open_: list[dict[str, Any]] = []
    for key, wait in (run.__dict__.get("resource_waits") or {}).items():
        state = run.steps.get(key) or {}
        if int(state.get("attempt") or 0) < wait["attempt"] \
                and state.get("status") not in ("completed", "skipped", "compensated"):
            open_.append({"step": key, "resources": wait["resources"], "since": wait["since"]})
    return open_


EVENTS = (StepWaitingForResource,)
for _cls in EVENTS:
    setattr(Run, _cls.__name__, _cls)
    register_topic(_cls.TOPIC, _cls)
