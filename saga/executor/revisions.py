"""Revising a run in flight: moving it to a new definition when replay proves it safe,
resetting it to a step, changing its labels. Each records one event on the run's
exact history, behind the version fence (:class:`~saga.errors.ConcurrentWriteError`
when another writer appended first: the caller's check then runs again).

The decisions themselves are pure (:func:`saga.replay.check_migration`,
:func:`reset_plan`); this module loads, checks and appends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saga import replay
from saga.audit import redacted
from saga.composition import Plan, plan_of
from saga.domain import Run, check_labels, revisions
from saga.errors import ConcurrentWriteError, RunStateError
from saga.scheduler import compensation_order, is_loop_parent
from saga.store.application import SagaApplication
from saga.store.patience import patiently


@dataclass
class MigrationCheck:
    """The outcome of checking (and, unless a dry run, doing) one run's migration."""

    run_id: str
    from_hash: str
    to_hash: str
    divergence: replay.Divergence | None
    migrated: bool = False
    version: int = 0
    error: str | None = None  # in a bulk migration: why this run could not be checked

    @property
    def safe(self) -> bool:
        """Whether every recorded decision comes out the same with the new definition."""
        return self.divergence is None and self.error is None

    def describe(self) -> str:
        """One line: what happened, or would."""
        if self.error is not None:
            return f"{self.run_id}: not checked, {self.error}"
        if self.divergence is not None:
            return f"{self.run_id}: not safe, {self.divergence.as_migration()}"
        if self.from_hash == self.to_hash:
            return f"{self.run_id}: already on {self.to_hash[:12]}"
        verb = "migrated" if self.migrated else "safe: would migrate"
        return f"{self.run_id}: {verb} {self.from_hash[:12]} -> {self.to_hash[:12]}"

    def as_dict(self) -> dict[str, Any]:
        """The check as JSON."""
        return {"run_id": self.run_id, "safe": self.safe, "migrated": self.migrated,
                "from_hash": self.from_hash, "to_hash": self.to_hash, "version": self.version,
                "error": self.error,
                "divergence": None if self.divergence is None else {
                    **self.divergence.as_dict(), "message": self.divergence.as_migration()}}


def _refuse(run: Run, control: str) -> None:
    if redacted(run.inputs):  # retention (or a shredded key) took what its steps are given
        raise RunStateError(f"run {run.run_id} was redacted by retention; it cannot be "
                            f"{control}")


def migrate(app: SagaApplication, run_id: str, plan: Plan, *, actor: str,
            reason: str | None = None, dry_run: bool = False) -> MigrationCheck:
    """Check that ``run_id`` may move to ``plan``, and (unless ``dry_run``) record
    ``DefinitionMigrated``. The check runs on the run's history as it is at the version
    the event is appended at; a concurrent append makes it run again."""
    definition, to_hash = plan.record(), plan.digest()

    def attempt() -> MigrationCheck:
        run = app.get_run(run_id)
        _refuse(run, "migrated")
        if run.is_finished:
            raise RunStateError(f"run {run_id} already ended {run.status}; only a run in "
                                "flight moves to a new definition")
        check = MigrationCheck(run.run_id, run.definition_hash, to_hash, None,
                               version=run.version)
        if run.definition_hash == to_hash:
            return check
        events = app.domain_events(run_id)
        if not events or events[-1].originator_version != run.version:
            raise ConcurrentWriteError(run_id)  # appended between the two reads: again
        check.divergence = replay.check_migration(events, plan)
        if check.divergence is not None or dry_run:
            return check
        revisions.migrate(run, definition, to_hash, actor, reason)
        app.save_run(run)
        check.migrated, check.version = True, run.version
        return check
    return patiently(attempt)


def migrate_many(app: SagaApplication, run_ids: list[str], plan: Plan, *, actor: str,
                 reason: str | None = None, dry_run: bool = False) -> list[MigrationCheck]:
    """:func:`migrate` for each run; one that cannot be checked (it finished meanwhile,
    writers kept racing) is listed with why, and the others still move."""
    checks = []
    for run_id in run_ids:
        try:
            checks.append(migrate(app, run_id, plan, actor=actor, reason=reason,
                                  dry_run=dry_run))
        except (RunStateError, ConcurrentWriteError) as e:
            checks.append(MigrationCheck(run_id, "", plan.digest(), None, error=str(e)))
    return checks


def reset_plan(plan: Plan, run: Run, step_id: str) -> tuple[list[str], list[str]]:
    """For a reset of ``run`` to ``step_id``: the step executions to undo (completed,
    at or downstream of it, with an undo; most recently completed first) and those to
    reopen (every recorded execution at or downstream of it). Pure."""
    try:
        plan.step(step_id)
    except KeyError:
        raise RunStateError(f"run {run.run_id} has no step {step_id!r}") from None
    if step_id not in plan.graph:
        raise RunStateError(f"{step_id!r} is not a step a run can be reset to")
    downstream, frontier = {step_id}, [step_id]
    while frontier:  # every step reachable from it (either graph type has successors)
        for node in plan.graph.successors(frontier.pop()):
            if node not in downstream:
                downstream.add(node)
                frontier.append(node)
    reopen = [k for k, s in run.steps.items() if s["step_id"] in downstream]
    if not reopen:
        raise RunStateError(f"step {step_id!r} of run {run.run_id} has not run yet: "
                            "nothing to reset")
    # A step its compensation undid stays undone: a reset re-runs from it (or earlier),
    # never past it (the steps after it would wait for it for ever, and the run would
    # end with nothing run), and never undoes it a second time.
    undone = [k for k in run.completion_order if k not in reopen
              and run.steps[k]["status"] == "compensated"]
    if undone:
        first = run.steps[undone[0]]["step_id"]
        raise RunStateError(f"step {first!r} of run {run.run_id} was undone by its "
                            f"compensation and {step_id!r} follows it; reset to {first} "
                            "(or earlier) to run them again")
    undo = [k for k in compensation_order(plan, run)
            if k in reopen and run.steps[k]["status"] != "compensated"]
    return undo, reopen


def record_reset(run: Run, step_id: str, actor: str, reason: str | None) -> None:
    """Record a reset of ``run`` to ``step_id`` (refused when it cannot apply)."""
    _refuse(run, "reset")
    if run.status == "compensating":
        raise RunStateError(f"run {run.run_id} is compensating; reset it once that ends")
    busy = [k for k, s in run.steps.items() if s["status"] == "running" and not s.get("wait")
            and not is_loop_parent(plan_of(run), s)]
    if busy and not run.is_finished:
        raise RunStateError(f"run {run.run_id} has attempts in flight ({', '.join(busy)}); "
                            "pause it and reset it once they finish")
    undo, reopen = reset_plan(plan_of(run), run, step_id)
    revisions.reset(run, step_id, undo, reopen, actor, reason)


def relabel(app: SagaApplication, run_id: str, changes: dict[str, str],
            actor: str) -> Run:
    """Record a change of the run's labels (an empty value removes the label)."""
    changes = check_labels(changes)

    def attempt() -> Run:
        run = app.get_run(run_id)
        _refuse(run, "labelled")
        revisions.relabel(run, changes, actor)
        app.save_run(run)
        return run
    return patiently(attempt)
