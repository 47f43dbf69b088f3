"""What can be done to a run: each command records exactly one event (see
:class:`saga.domain.run.Run`, which they are part of)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from saga.domain.vocabulary import idempotency_key


class RunCommands:
    """The commands of :class:`~saga.domain.run.Run`; each triggers one of its events."""

    # Provided by the aggregate these commands belong to.
    options: dict[str, Any]
    started_at: str
    trigger_event: Any
    StepStarted: Any
    StepCompleted: Any
    StepFailed: Any
    StepSkipped: Any
    HealStarted: Any
    RemedyApplied: Any
    ApprovalRequested: Any
    ApprovalGranted: Any
    ApprovalRejected: Any
    CompensationStarted: Any
    RunRetried: Any
    StepCompensated: Any
    CompensationFailed: Any
    RunCompleted: Any
    RunCompensated: Any
    RunFailed: Any
    RunCancelled: Any
    StepWaiting: Any
    SignalReceived: Any
    RunTimedOut: Any
    RunPaused: Any
    RunUnpaused: Any
    RetentionApplied: Any
    RunTakenOver: Any

    def start_step(self, step_id: str, iteration: int, attempt: int, parameters: Any,
                   worker: str | None = None) -> None:
        """Record that an attempt is about to run."""
        self.trigger_event(self.StepStarted, step_id=step_id, iteration=iteration,
                           attempt=attempt, parameters=parameters, worker=worker,
                           idempotency_key=idempotency_key(
                               self.run_id, step_id, iteration,
                               (self.__dict__.get("generations") or {}).get(step_id, 0)))

    def complete_step(self, step_id: str, iteration: int, attempt: int, output: Any,
                      duration_ms: int, cache: dict[str, Any] | None = None) -> None:
        """Record an attempt's output (``cache``: it came from an earlier run's call)."""
        self.trigger_event(self.StepCompleted, step_id=step_id, iteration=iteration,
                           attempt=attempt, output=output, duration_ms=duration_ms, cache=cache)

    def fail_step(self, step_id: str, iteration: int, attempt: int, error_type: str,
                  message: str, retryable: bool = False, next_retry_at: str | None = None) -> None:
        """Record a failed attempt, and when it will be retried (if it will)."""
        self.trigger_event(self.StepFailed, step_id=step_id, iteration=iteration,
                           attempt=attempt, error_type=error_type, message=message,
                           retryable=retryable, next_retry_at=next_retry_at)

    def skip_step(self, step_id: str, iteration: int, reason: str) -> None:
        """Record that a step will not run, and why."""
        self.trigger_event(self.StepSkipped, step_id=step_id, iteration=iteration, reason=reason)

    def start_heal(self, step_id: str, iteration: int, attempt: int, handler: int,
                   remedies: list[dict[str, Any]]) -> None:
        """Record that an auto-heal handler fires for a failed attempt."""
        self.trigger_event(self.HealStarted, step_id=step_id, iteration=iteration,
                           attempt=attempt, handler=handler, remedies=remedies)

    def remedy_applied(self, step_id: str, iteration: int, index: int, ok: bool, output: Any,
                       error: str | None) -> None:
        """Record one remedy's outcome."""
        self.trigger_event(self.RemedyApplied, step_id=step_id, iteration=iteration,
                           index=index, ok=ok, output=output, error=error)

    def request_approval(self, step_id: str, message: str, until: str | None = None) -> None:
        """Record that a step waits for a decision (until ``until``, if it times out)."""
        self.trigger_event(self.ApprovalRequested, step_id=step_id, message=message,
                           until=until)

    def decide_approval(self, step_id: str, approved: bool, actor: str,
                        comment: str | None = None) -> None:
        """Record a person's decision on a waiting step."""
        cls = self.ApprovalGranted if approved else self.ApprovalRejected
        self.trigger_event(cls, step_id=step_id, actor=actor, comment=comment)

    def start_compensation(self, reason: str, steps: list[str], actor: str | None = None,
                           cancel: bool = False) -> None:
        """Record the start of rollback and its order: automatic, or ``actor``'s request
        (``cancel``: the run ends cancelled)."""
        self.trigger_event(self.CompensationStarted, reason=reason, steps=steps, actor=actor,
                           requested=actor is not None, cancel=cancel)

    def retry(self, actor: str, steps: list[str], reopened: list[str] | None = None,
              reason: str | None = None) -> None:
        """Record a redrive of the given failed (and upstream-skipped) steps, reopening the
        loop steps whose iterations those are. A step a person (or a confirmation's
        default) rejected is asked again: a redrive never overrides a rejection."""
        approvals: dict[str, dict[str, Any]] = getattr(self, "approvals", {})
        asked = [k for k in steps if approvals.get(k, {}).get("status") == "rejected"]
        self.trigger_event(self.RunRetried, actor=actor, steps=steps,
                           reopened=list(reopened or []), reason=reason, asked_again=asked)

    def compensated(self, step_id: str, iteration: int, output: Any) -> None:
        """Record a successful compensation."""
        self.trigger_event(self.StepCompensated, step_id=step_id, iteration=iteration,
                           output=output, actor=self._undoer())

    def compensation_failed(self, step_id: str, iteration: int, error_type: str,
                            message: str) -> None:
        """Record a failed compensation."""
        self.trigger_event(self.CompensationFailed, step_id=step_id, iteration=iteration,
                           error_type=error_type, message=message, actor=self._undoer())

    def _undoer(self) -> str | None:
        """Who a compensation is recorded for: a reset's undo is its actor's (None: the
        run's own actor, as for every other rollback)."""
        comp: dict[str, Any] | None = getattr(self, "compensation", None)
        return comp.get("actor") if comp and comp.get("reset") else None

    def finish(self, status: str, outputs: Any = None, error: dict[str, Any] | None = None,
               failed_step: str | None = None, actor: str | None = None) -> None:
        """Record the run's outcome: completed, failed, compensated or cancelled."""
        if status == "completed":
            self.trigger_event(self.RunCompleted, outputs=outputs)
        elif status == "cancelled":
            self.cancel(actor or "unknown", (error or {}).get("message"))
        else:
            cls = self.RunCompensated if status == "compensated" else self.RunFailed
            self.trigger_event(cls, error=error or {}, failed_step=failed_step, outputs=outputs)

    def wait(self, step_id: str, iteration: int, until: str | None,
             signal: str | None, child: str | None = None) -> None:
        """Record that a started step waits for a time, a signal, or both; or (``child``)
        for its child run, which waits, and ``until`` that child's own next time."""
        self.trigger_event(self.StepWaiting, step_id=step_id, iteration=iteration, until=until,
                           signal=signal, child=child)

    def receive_signal(self, name: str, data: Any, actor: str) -> None:
        """Record a signal sent to the run."""
        self.trigger_event(self.SignalReceived, name=name, data=data, actor=actor)

    @property
    def deadline(self) -> str | None:
        """When the run must have finished (its ``timeout`` after it started), if ever."""
        seconds = self.options.get("timeout")
        if not seconds:
            return None
        return (datetime.fromisoformat(self.started_at) + timedelta(seconds=seconds)).isoformat()

    def time_out(self) -> None:
        """Record that the run's deadline passed."""
        self.trigger_event(self.RunTimedOut, deadline=self.deadline or "", undo_cut=True)

    @property
    def run_id(self) -> str:  # pragma: no cover - the aggregate's own property wins
        """The run's id (see :attr:`saga.domain.run.Run.run_id`)."""
        raise NotImplementedError

    def record_retention(self, versions: dict[str, str]) -> None:
        """Record which events retention rewrites, and the hash each will have."""
        self.trigger_event(self.RetentionApplied, versions=versions, actor="retention")

    def take_over(self, worker: str | None, seen: dict[str, Any] | None = None) -> None:
        """Record that ``worker`` takes the run over from a worker that died (``seen``:
        what it saw of the lease it took; see ``Run.RunTakenOver``)."""
        self.trigger_event(self.RunTakenOver, worker=worker, seen=seen)

    def pause(self, actor: str, reason: str | None = None) -> None:
        """Record that no new step may start."""
        self.trigger_event(self.RunPaused, actor=actor, reason=reason)

    def unpause(self, actor: str) -> None:
        """Record that the run may go on."""
        self.trigger_event(self.RunUnpaused, actor=actor)

    def cancel(self, actor: str, reason: str | None = None) -> None:
        """Record that the run was cancelled."""
        self.trigger_event(self.RunCancelled, actor=actor, reason=reason)
