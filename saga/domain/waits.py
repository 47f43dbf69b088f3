"""Events of a run's waits: a step waiting for a time, a signal or a child run, the
signals sent to the run, and its deadline passing.

They are events of :class:`~saga.domain.run.Run` like any other, declared here (as
:mod:`saga.domain.revisions` declares its own) because ``run.py`` is at its size limit,
and attached to ``Run`` when this module is imported (``saga.domain`` imports it, so any
process that loads a run knows them). Their handlers only change state; the queries that
read the waits (``Run.is_waiting``, ``Run.unconsumed_signals``) stay on ``Run``.
"""

from __future__ import annotations

from typing import Any

from eventsourcing.utils import register_topic

from saga.domain.run import Run
from saga.domain.vocabulary import iso


class StepWaiting(Run.Event):
    """A started ``sleep`` or ``signal`` step waits: until a time (the worker's clock
    read once, recorded here), for a signal, or both (a signal with a timeout). A
    ``use:`` step whose child run waits records the ``child`` it waits for, and
    ``until`` when the child's own next time comes (its timer, retry or deadline)."""

    TOPIC = "saga.StepWaiting"
    step_id: str
    iteration: int
    until: str | None
    signal: str | None
    child: str | None = None

    def apply(self, aggregate: Any) -> None:
        wait = {"until": self.until, "signal": self.signal}
        if self.child is not None:  # absent from the waits of sleeps and signals
            wait["child"] = self.child
        aggregate._step(self.step_id, self.iteration)["wait"] = wait


class SignalReceived(Run.Event):
    """A signal was sent to the run; the first step waiting for its name (now or
    later) consumes it, in the order signals arrived."""

    TOPIC = "saga.SignalReceived"
    name: str
    data: Any

    def apply(self, aggregate: Any) -> None:
        received = aggregate.__dict__.setdefault("signals", [])
        received.append({"name": self.name, "data": self.data, "actor": self.actor,
                         "at": iso(self.timestamp)})


class RunTimedOut(Run.Event):
    """The run's deadline (its ``timeout``) passed before it finished: it stops and
    undoes what it did, wherever it was."""

    TOPIC = "saga.RunTimedOut"
    deadline: str
    #: the rollback also undoes the calls the deadline cut short (they may have acted);
    #: false in histories recorded before, which replay as they were decided
    undo_cut: bool = False

    def apply(self, aggregate: Any) -> None:
        aggregate.timed_out = self.deadline
        aggregate.deadline_undoes_cut = self.undo_cut


EVENTS = (StepWaiting, SignalReceived, RunTimedOut)
for _cls in EVENTS:
    setattr(Run, _cls.__name__, _cls)
    register_topic(_cls.TOPIC, _cls)
