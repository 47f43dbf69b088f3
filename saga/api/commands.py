"""The commands :class:`~saga.api.Saga` records on a run: retry, compensate, cancel,
signal, pause, revise (migrate, reset, label) and decide an approval; each appends its
event, reloading on a concurrent write, and some then drive the run."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saga.chain import json_safe
from saga.composition import Plan, plan_of
from saga.config import Settings
from saga.domain import Run, check_signal_name
from saga.errors import (
    ConcurrentWriteError,
    LeaseHeldError,
    MigrationRefusedError,
    RunStateError,
)
from saga.executor import EventHook, check_tools
from saga.lazy import lazy
from saga.scheduler import controls, is_loop_parent, undo_order
from saga.store import SagaApplication
from saga.store.patience import PATIENCE, patiently
from saga.telemetry import metrics
from saga.tools import Registry
from saga.views import waiting_child, waits_of

if TYPE_CHECKING:
    from saga import audit
    from saga.executor import revisions as revise
else:  # loaded when first used: a run started here needs none of them (saga.lazy)
    audit, revise = lazy("saga.audit"), lazy("saga.executor.revisions")


log = logging.getLogger("saga.api")


class RunCommands:
    """The commands of :class:`~saga.api.Saga` that change a run."""

    # Provided by the Saga these commands belong to.
    settings: Settings

    #: How long (seconds) a command keeps trying to land on a run other writers keep
    #: appending to before it gives up (ConcurrentWriteError, exit code 5).
    append_patience: float = PATIENCE

    if TYPE_CHECKING:
        @property
        def app(self) -> SagaApplication: ...
        @property
        def registry(self) -> Registry: ...
        def get(self, run_id: str, version: int | None = None) -> Run: ...
        def resolve(self, run_id: str) -> str: ...
        def load(self, source: str | Path | Mapping[str, Any]) -> Plan: ...
        def select(self, *, statuses: tuple[str, ...], definition: str | None = None,
                   failed_step: str | None = None, since: str | None = None,
                   labels: Mapping[str, str] | None = None) -> list[str]: ...
        def drive(self, run: Run, *, on_events: EventHook | None = None,
                  wait: float | None = None) -> Run: ...
        def resume(self, run_id: str, *, on_events: EventHook | None = None) -> Run: ...
        def _driving_parent(self, run: Run) -> str | None: ...
        def executor_plan(self, run: Run) -> Plan: ...

    def retry(self, run_id: str, *, actor: str | None = None, reason: str | None = None,
              on_events: EventHook | None = None, drive: bool = True) -> Run:
        """Redrive a failed run from its failed steps, keeping completed work (``drive``:
        here and now; else a worker continues it)."""
        def record(run: Run) -> None:
            _refuse(run, "retry")
            keys = [k for k, s in run.steps.items() if s["status"] == "failed"
                    or (s["status"] == "skipped" and "upstream" in (s.get("reason") or ""))]
            plan = self.executor_plan(run)
            loops = [k for k in keys if is_loop_parent(plan, run.steps[k])]
            run.retry(actor or self.settings.actor, [k for k in keys if k not in loops], loops,
                      reason)
        return self._command(run_id, record, on_events) if drive else \
            self._append(run_id, record)

    def compensate(self, run_id: str, *, actor: str | None = None, reason: str | None = None,
                   on_events: EventHook | None = None, drive: bool = True) -> Run:
        """Undo a run's completed steps (those that declare a compensation; ``drive``: here
        and now, else a worker does it)."""
        return self._undo(run_id, actor, reason or "compensation requested", False, on_events,
                          drive)

    def cancel(self, run_id: str, *, actor: str | None = None, reason: str | None = None,
               on_events: EventHook | None = None, drive: bool = True) -> Run:
        """Cancel an unfinished run: undo its completed steps, then record RunCancelled."""
        return self._undo(run_id, actor, reason or "cancelled", True, on_events, drive)

    def _undo(self, run_id: str, actor: str | None, reason: str, cancel: bool,
              on_events: EventHook | None, drive: bool = True) -> Run:
        who = actor or self.settings.actor

        def record(run: Run) -> None:
            _refuse(run, "cancel" if cancel else "compensate")
            order = undo_order(plan_of(run), run)
            run.start_compensation(f"{reason} (by {who})", order, who, cancel)
        return self._command(run_id, record, on_events) if drive else \
            self._append(run_id, record)

    def signal(self, run_id: str, name: str, data: Any = None, *, actor: str | None = None) -> Run:
        """Send a signal to a run: the first step waiting for ``name`` (now or later)
        completes with ``data`` as its output. Refused for a finished run."""
        check_signal_name(name)
        run = self.get(run_id)
        if not any(w.get("signal") == name for w in waits_of(run)):
            # Not waited for here, but by a child run its step waits for: the child's.
            child = waiting_child(run, self.get, lambda c: any(
                w.get("signal") == name for w in waits_of(c)))
            run_id = child.run_id if child is not None else run_id

        def record(run: Run) -> None:
            if run.is_finished:
                raise RunStateError(f"run {run_id} is {run.status}; a signal can only be "
                                    "sent to an unfinished run")
            run.receive_signal(name, json_safe(data), actor or self.settings.actor)
        return self._append(run_id, record)

    def pause(self, run_id: str, *, actor: str | None = None, reason: str | None = None) -> Run:
        """Pause a run: no new step starts; attempts in flight finish."""
        def record(run: Run) -> None:
            _refuse(run, "pause")
            run.pause(actor or self.settings.actor, reason)
        return self._append(run_id, record)

    def unpause(self, run_id: str, *, actor: str | None = None) -> Run:
        """Let a paused run go on (a worker continues it)."""
        def record(run: Run) -> None:
            _refuse(run, "unpause")
            run.unpause(actor or self.settings.actor)
        return self._append(run_id, record)

    # -- revising a run in flight (saga.executor.revisions) -----------------------------

    def migrate(self, run_id: str, to: Plan | str | Path, *, dry_run: bool = False,
                reason: str | None = None, actor: str | None = None) -> revise.MigrationCheck:
        """Move a run in flight to the definition ``to`` when replaying its history with it
        reproduces every recorded decision; ``dry_run``: only say whether it would.
        MigrationRefusedError (nothing appended) names the first divergence."""
        plan = to if isinstance(to, Plan) else self.load(to)
        check = revise.migrate(self.app, self.resolve(run_id), plan, dry_run=dry_run,
                               actor=actor or self.settings.actor, reason=reason)
        if check.divergence is not None and not dry_run:
            raise MigrationRefusedError(check.run_id, check.divergence.as_migration(), check)
        return check

    def migrate_all(self, definition: str, to: Plan | str | Path, *,
                    statuses: tuple[str, ...] = ("waiting", "running", "paused"),
                    dry_run: bool = False, reason: str | None = None,
                    actor: str | None = None) -> list[revise.MigrationCheck]:
        """Check every run of ``definition`` in one of ``statuses``; migrate the safe ones
        (unless ``dry_run``). The others are returned with their first divergence."""
        plan = to if isinstance(to, Plan) else self.load(to)
        return revise.migrate_many(self.app, self.select(statuses=statuses,
                                                         definition=definition),
                                   plan, dry_run=dry_run, reason=reason,
                                   actor=actor or self.settings.actor)

    def reset(self, run_id: str, step_id: str, *, actor: str | None = None,
              reason: str | None = None, on_events: EventHook | None = None,
              drive: bool = True) -> Run:
        """Re-run ``step_id`` and every step downstream of it: first undo those of them
        that completed and can be undone (latest first), then run them again with new
        idempotency keys (``drive``: here and now; else a worker continues it)."""
        who = actor or self.settings.actor

        def record(run: Run) -> None:
            revise.record_reset(run, step_id, who, reason)
        return self._command(run_id, record, on_events) if drive else \
            self._append(run_id, record)

    def label(self, run_id: str, changes: Mapping[str, str], *,
              actor: str | None = None) -> Run:
        """Change a run's labels as it runs: each key set to its value, removed when the
        value is empty."""
        return revise.relabel(self.app, self.resolve(run_id), dict(changes),
                              actor or self.settings.actor)

    def _append(self, run_id: str, record: Any, run: Run | None = None) -> Run:
        """Append a command's event, reloading on a concurrent write (a worker recorded a
        step meanwhile: ``record`` checks the command still applies to the run as it is
        now, and records it again); drive nothing. ``run``: as the caller read it.

        Tried again for :attr:`append_patience` seconds, not a number of times: a busy
        run's driver may append every few milliseconds, and on a loaded machine a fixed
        count of read-then-append tries can all lose; an operator's command must not be
        given up because the run is busy (the driver takes it in once it lands:
        saga.executor.incoming). The waits between tries are short and jittered, so a
        command does not fall into step with the driver's appends."""
        given = run

        def attempt() -> Run:
            nonlocal given
            current, given = given if given is not None else self.get(run_id), None
            _refuse_redacted(current)
            record(current)
            pending = list(current.pending_events)
            self.app.save_run(current)
            metrics.recorded(current.name, pending)
            return current
        return patiently(attempt, self.append_patience)

    def _command(self, run_id: str, record: Any, on_events: EventHook | None) -> Run:
        """Append a command's event (reloading on a concurrent write), then drive the run
        (nothing is appended when this process lacks a tool the drive needs)."""
        def checked(run: Run) -> None:
            record(run)  # a command that does not apply says so first
            check_tools(self.registry, run, get_run=self.app.get_run)
        self._append(run_id, checked)
        run = self.get(run_id)
        try:
            parent = self._driving_parent(run)
            if parent is not None:  # a child run moves with its parent, whose step drives it
                self.resume(parent, on_events=on_events)
                return self.get(run_id)
            return self.drive(run, on_events=on_events)
        except (LeaseHeldError, ConcurrentWriteError) as e:
            # The command is recorded: a live driver took the run (it holds the lease, or
            # appended first) and carries the command out, as it takes in any command.
            log.info("run %s: %s; its driver carries the command out", run_id, e)
            return self.get(run_id)

    def approve(self, run_id: str, step_id: str, *, actor: str | None = None,
                comment: str | None = None) -> Run:
        """Grant the approval a waiting step asked for (a worker then continues the run)."""
        return self._decide(run_id, step_id, True, actor, comment)

    def reject(self, run_id: str, step_id: str, *, actor: str | None = None,
               comment: str | None = None) -> Run:
        """Reject the approval a waiting step asked for: the step fails with
        ``ApprovalRejected`` and the run follows its failure policy."""
        return self._decide(run_id, step_id, False, actor, comment)

    def _decide(self, run_id: str, step_id: str, approved: bool, actor: str | None,
                comment: str | None) -> Run:
        run = self.get(run_id)
        approval = run.approvals.get(step_id)
        if approval is None or approval["status"] != "requested":
            # A parent waiting for a child run that asks for it: the decision is the child's.
            child = waiting_child(run, self.get, lambda c: step_id in c.pending_approvals)
            if child is None:
                raise RunStateError(f"step {step_id!r} of run {run_id} is not waiting for "
                                    "approval")
            run = child
        asked = run.approvals[step_id].get("requested_at")  # the request being decided
        who = actor or self.settings.actor

        def record(now: Run) -> None:
            # Read again after a worker's append: decide only the same request, still open.
            approval = now.approvals.get(step_id) or {}
            if approval.get("status") != "requested" or approval.get("requested_at") != asked:
                raise RunStateError(f"step {step_id!r} of run {now.run_id} is not waiting for "
                                    "approval (it was decided or asked again meanwhile)")
            now.decide_approval(step_id, approved, who, comment)
        return self._append(run.run_id, record, run)


def _refuse(run: Run, control: str) -> None:
    """Raise RunStateError when ``control`` does not apply to ``run`` now (the rules the
    run's ``actions`` list is computed by: saga.scheduler.controls)."""
    why = controls.refusal(run, control)
    if why is not None:
        raise RunStateError(why)


def _refuse_redacted(run: Run) -> None:
    """A run whose user data retention removed cannot be driven: its tools would get
    ``{"_redacted": true}`` where parameters and outputs were."""
    if audit.redacted(run.inputs):
        raise RunStateError(f"run {run.run_id} was redacted by retention; it can no longer "
                            "be resumed, retried, compensated or cancelled")


