"""The event that keeps what a long call last reported of itself: its heartbeat.

A tool reports progress with ``ctx.heartbeat(details)``. Beats are many and cheap, so
they are not events: the executor keeps the last details of each attempt in a side table
(:mod:`saga.store.heartbeats`) for other processes to read live. When the attempt ends
(completed, failed, cut short, or found interrupted by the worker that takes the run
over), the details in force are recorded once, by :class:`HeartbeatRecorded`, right
before the event that ends the attempt: replay, audit and reports see them, and the
next attempt of the step is handed them as ``ctx.last_heartbeat``.

Attached to :class:`~saga.domain.run.Run` when this module is imported, as
:mod:`saga.domain.waits` attaches its events (``run.py`` is at its size limit).
"""

from __future__ import annotations

from typing import Any

from eventsourcing.utils import register_topic

from saga.domain.run import Run


class HeartbeatRecorded(Run.Event):
    """What an attempt's tool last reported by ``ctx.heartbeat``: its ``details`` (the
    last given; JSON), how many ``beats`` it sent, and when the last one came (``at``,
    ISO, the beating worker's clock). Recorded once per attempt that beat, just before
    the event that ends the attempt; changes no status."""

    TOPIC = "saga.HeartbeatRecorded"
    step_id: str
    iteration: int
    attempt: int
    details: Any
    beats: int
    at: str | None

    def apply(self, aggregate: Any) -> None:
        # Kept past the attempt (a StepStarted leaves it): the next attempt resumes from it.
        aggregate._step(self.step_id, self.iteration)["heartbeat"] = {
            "attempt": self.attempt, "details": self.details, "beats": self.beats,
            "at": self.at}


EVENTS = (HeartbeatRecorded,)
for _cls in EVENTS:
    setattr(Run, _cls.__name__, _cls)
    register_topic(_cls.TOPIC, _cls)
