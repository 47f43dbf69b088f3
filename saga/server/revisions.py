"""Revising a run in flight over HTTP (``/api/v1``): migrate it to a new definition when
replay proves it safe, reset it to a step, change its labels (see
:mod:`saga.executor.revisions`). A refused migration is a 409 naming the first
divergence; nothing was recorded."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from saga.composition import plan_of
from saga.executor.revisions import reset_plan
from saga.server.runs import Reason, _Body, load_plan, service

router = APIRouter(prefix="/api/v1", tags=["runs"])


class MigrateRequest(_Body):
    """The definition to move a run (or every matching run) to, inline or a template."""

    composition: dict[str, Any] | None = Field(default=None,
                                               description="The new composition itself.")
    template: str | None = Field(default=None, description="A template's name.")
    dry_run: bool = Field(default=False, description="Only say whether it would migrate.")
    reason: str | None = None


class BulkMigrateRequest(MigrateRequest):
    """Every run of ``definition`` in one of ``statuses``: the safe ones migrate."""

    definition: str
    statuses: list[str] = Field(default_factory=lambda: ["waiting", "running", "paused"])


class ResetRequest(Reason):
    """The step a run is reset to (it and every step downstream run again)."""

    step: str


class LabelsRequest(_Body):
    """Labels to set (an empty value removes the label)."""

    labels: dict[str, str]


@router.post("/runs/{run_id}/migrate")
def migrate(request: Request, run_id: str, body: MigrateRequest) -> dict[str, Any]:
    """Move a run in flight to a new definition when replaying its history with it
    reproduces every recorded decision (``dry_run``: only check). 409 when it does not,
    with the first divergence: nothing is recorded."""
    svc = service(request)
    plan = load_plan(svc.saga, body.composition, body.template)
    check = svc.saga.migrate(run_id, plan, dry_run=body.dry_run, reason=body.reason,
                             actor=svc.actor(request))
    return check.as_dict()


@router.post("/migrate")
def migrate_many(request: Request, body: BulkMigrateRequest) -> list[dict[str, Any]]:
    """Check every run of a composition in the given statuses; migrate the safe ones
    (unless ``dry_run``); the others are listed with their first divergence."""
    svc = service(request)
    plan = load_plan(svc.saga, body.composition, body.template)
    checks = svc.saga.migrate_all(body.definition, plan, statuses=tuple(body.statuses),
                                  dry_run=body.dry_run, reason=body.reason,
                                  actor=svc.actor(request))
    return [c.as_dict() for c in checks]


@router.get("/runs/{run_id}/reset/{step_id}")
def reset_preview(request: Request, run_id: str, step_id: str) -> dict[str, Any]:
    """What a reset to ``step_id`` would do: the step executions it undoes (in order) and
    those it runs again. Changes nothing."""
    run = service(request).saga.get(run_id)
    undo, reopen = reset_plan(plan_of(run), run, step_id)
    return {"run_id": run.run_id, "step": step_id, "undo": undo, "reopen": reopen}


@router.post("/runs/{run_id}/reset")
def reset(request: Request, run_id: str, body: ResetRequest) -> dict[str, Any]:
    """Reset a run to a step: undo the steps from there that can be undone, then run them
    again with new idempotency keys (the service's worker does it)."""
    svc = service(request)
    run = svc.saga.reset(run_id, body.step, actor=svc.actor(request), reason=body.reason,
                         drive=False)
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/labels")
def labels(request: Request, run_id: str, body: LabelsRequest) -> dict[str, Any]:
    """Change a run's labels as it runs (an empty value removes one)."""
    svc = service(request)
    run = svc.saga.label(run_id, body.labels, actor=svc.actor(request))
    return svc.saga.status(run.run_id)
