"""The event of a step that waits for a worker of its pool.

A step may name a ``pool`` (``pool: vpn``): only a worker started with ``--pool vpn``
runs it (see :mod:`saga.executor.pools`). When the steps a run can start next all belong
to pools the worker driving it does not serve, that worker records
:class:`StepAwaitingPool` for each and gives the run's lease up with that append; the
workers that serve one of those pools claim the run next (see
:class:`saga.worker.index.RunIndex`). The event is what ``saga status`` shows as
``waiting: pool NAME``, and what replay checks: a step waits for its own pool, and only
when the scheduler would start it.

Attached to :class:`~saga.domain.run.Run` when this module is imported, as
:mod:`saga.domain.waits` attaches its events (``run.py`` is at its size limit).
"""

from __future__ import annotations

from typing import Any

from eventsourcing.utils import register_topic

from saga.domain.run import Run
from saga.domain.vocabulary import iso, step_key


class StepAwaitingPool(Run.Event):
    """The next ``attempt`` of a step (or, with ``compensation``, its undo) waits for a
    worker of ``pool`` (None: a worker that runs unpooled steps, one started without
    ``--only-pools``); ``worker`` drove the run and gave it up. Changes no status: the
    step starts (``StepStarted``) on whichever worker of the pool claims the run."""

    TOPIC = "saga.StepAwaitingPool"
    step_id: str
    iteration: int
    attempt: int
    pool: str | None
    compensation: bool
    worker: str | None

    def apply(self, aggregate: Any) -> None:
        # Kept per step execution, the last wait recorded; whether it still holds is
        # derived (saga.scheduler.pools.waiting): the scheduler would start it now.
        waits = aggregate.__dict__.setdefault("pool_waits", {})
        waits[_key(self.step_id, self.iteration, self.compensation)] = {
            "step_id": self.step_id, "iteration": self.iteration, "attempt": self.attempt,
            "pool": self.pool, "compensation": self.compensation, "worker": self.worker,
            "since": iso(self.timestamp)}


def _key(step_id: str, iteration: int, compensation: bool) -> str:
    key = step_key(step_id, iteration)
    return f"undo:{key}" if compensation else key


def await_pool(run: Run, step_id: str, iteration: int, attempt: int, pool: str | None,
               compensation: bool, worker: str | None) -> None:
    """Record that a step's next attempt (or its compensation) waits for ``pool``."""
    run.trigger_event(StepAwaitingPool, step_id=step_id, iteration=iteration,
                      attempt=attempt, pool=pool, compensation=compensation, worker=worker)


def recorded_waits(run: Run) -> dict[str, dict[str, Any]]:
    """The pool waits recorded on the run, the last per step execution (by key, an undo's
    prefixed ``undo:``), whether or not they still hold."""
    waits: dict[str, dict[str, Any]] = run.__dict__.get("pool_waits") or {}
    return waits


EVENTS = (StepAwaitingPool,)
for _cls in EVENTS:
    setattr(Run, _cls.__name__, _cls)
    register_topic(_cls.TOPIC, _cls)
