"""Runs as JSON: the shape ``saga status``, ``saga list``, the API and the viewer show."""

from __future__ import annotations

import json
from typing import Any, TypedDict

from saga.domain import Run, RunStatus


def row_summary(row: dict[str, Any]) -> dict[str, Any]:
    """A read-model row in the shape of :func:`run_summary` (without steps)."""
    error = json.loads(row["error"]) if row.get("error") else None
    return {"run_id": row.get("run_name") or row["run_id"], "name": row["definition_name"],
            "version": row["version"], "labels": json.loads(row.get("labels") or "{}"),
            "status": row["status"], "actor": row["actor"],
            "definition_hash": row["definition_hash"], "started_at": row["started_at"],
            "finished_at": row["finished_at"], "duration_ms": row["duration_ms"],
            "error": error, "failed_step": row["failed_step"]}


class RunState(TypedDict, total=False):
    """A run as a JSON object (:func:`run_summary`'s shape, without its steps)."""

    run_id: str
    name: str
    status: RunStatus
    actor: str | None
    started_at: str
    finished_at: str | None
    outputs: Any
    error: dict[str, Any] | None
    failed_step: str | None


def run_summary(run: Run, steps: bool = True) -> dict[str, Any]:
    """A run as a JSON object: id, name, status, times, outputs, error, and its steps."""
    out: dict[str, Any] = {
        "run_id": run.run_id,
        "name": run.name,
        "version": run.version,
        "status": run.status,
        "actor": run.actor,
        "definition_hash": run.definition_hash,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "outputs": run.outputs,
        "error": run.error,
        "failed_step": run.failed_step,
    }
    if run.pending_approvals and not run.is_finished:  # a finished run waits for nobody
        out["waiting_for"] = run.pending_approvals
    if steps:
        out["inputs"] = run.inputs
        out["steps"] = {
            key: {k: s.get(k) for k in ("status", "attempt", "duration_ms", "output", "error",
                                        "reason", "compensation_error")
                  if s.get(k) is not None}
            for key, s in run.steps.items()
        }
        for step_id, approval in run.approvals.items():
            out["steps"].setdefault(step_id, {"status": "pending"})["approval"] = approval
    return out
