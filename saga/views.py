"""Runs and their events as JSON: the shapes ``saga status``, ``saga list``,
``saga watch``, the API and the viewer show."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from saga.composition import plan_of
from saga.domain import ENDINGS, Run, run_uuid, step_key
from saga.domain.pools import recorded_waits
from saga.domain.resources import resource_waits
from saga.errors import InputError, Problem, RunNotFoundError
from saga.scheduler import pools
from saga.scheduler.policy import not_undone
from saga.store.application import SagaApplication, event_json

#: Events read from the log per look.
PAGE = 200


def row_summary(row: dict[str, Any]) -> dict[str, Any]:
    """A read-model row in the shape of :func:`run_summary` (without steps)."""
    error = json.loads(row["error"]) if row.get("error") else None
    return {"run_id": row.get("run_name") or row["run_id"],
            "definition": row["definition_name"], "name": row["definition_name"],
            "version": row["version"], "labels": json.loads(row.get("labels") or "{}"),
            "status": row["status"], "actor": row["actor"],
            "definition_hash": row["definition_hash"],
            "definition_version": row.get("definition_version"), "started_at": row["started_at"],
            "finished_at": row["finished_at"], "duration_ms": row["duration_ms"],
            "error": error, "failed_step": row["failed_step"]}


def run_summary(run: Run, steps: bool = True) -> dict[str, Any]:
    """A run as a JSON object: id, definition (also as ``name``, its older field), status,
    times, outputs, error, and its steps."""
    out: dict[str, Any] = {
        "run_id": run.run_id,
        "definition": run.name,
        "name": run.name,
        "version": run.version,
        "status": run.status,
        "actor": run.actor,
        "queue": run.queue,
        "priority": run.priority,
        "definition_hash": run.definition_hash,
        "definition_version": str(run.definition.get("version", "1")),
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "outputs": run.outputs,
        "error": run.error,
        "failed_step": run.failed_step,
    }
    if run.compensation is not None or run.status in ("failed", "cancelled"):
        # Promise 5: what a run's end left in place is named, whatever status it ended in.
        out["not_undone"] = not_undone(plan_of(run), run)
    if run.__dict__.get("migrations"):  # moved to a new definition (saga migrate): when
        out["migrations"] = run.__dict__["migrations"]
    if run.context.get("labels"):  # as they are now (saga label changes them)
        out["labels"] = run.context["labels"]
    if resource_waits(run):  # steps waiting for a resource slot (StepWaitingForResource)
        out["waiting_for_resources"] = resource_waits(run)
    if run.pending_approvals and not run.is_finished:  # a finished run waits for nobody
        out["waiting_for"] = run.pending_approvals
    if recorded_waits(run) and not run.is_finished:  # steps waiting for a worker's pool
        out["waiting_for_pools"] = [
            {"step": step_key(w["step_id"], w["iteration"]), "pool": w["pool"],
             "compensation": w["compensation"], "since": w["since"]}
            for w in pools.waiting(plan_of(run), run)]
    if steps:
        out["inputs"] = run.inputs
        out["steps"] = {
            key: {k: s.get(k) for k in ("status", "attempt", "duration_ms", "output", "error",
                                        "reason", "compensation_error", "not_undone")
                  if s.get(k) is not None}
            for key, s in run.steps.items()
        }
        for step_id, approval in run.approvals.items():
            out["steps"].setdefault(step_id, {"status": "pending"})["approval"] = approval
    return out


def waits_of(run: Run) -> list[dict[str, Any]]:
    """What an unfinished run waits for, one entry per step: a person's ``approval`` (its
    message), a ``signal`` (its name, and ``until`` when it times out), a timer
    (``until``), or a ``child`` run (its id), which waits in turn."""
    if run.is_finished:
        return []
    found: list[dict[str, Any]] = [{"step": step, "approval": run.approvals[step]["message"]}
                                   for step in run.pending_approvals]
    for key, wait in run.waits.items():
        if wait.get("child"):
            found.append({"step": key, "child": wait["child"]})
        elif wait.get("signal"):
            found.append({"step": key, "signal": wait["signal"], "until": wait["until"]})
        else:
            found.append({"step": key, "until": wait["until"]})
    return found


def waiting_child(run: Run, get: Callable[[str], Run],
                  wants: Callable[[Run], bool]) -> Run | None:
    """The (grand)child run that one of ``run``'s steps waits for and that ``wants``
    (``get`` loads a run): where a decision or a signal sent to its parent is meant to go."""
    for wait in waits_of(run):
        if "child" not in wait:
            continue
        try:
            child = get(wait["child"])
        except RunNotFoundError:
            continue
        found = child if wants(child) else waiting_child(child, get, wants)
        if found is not None:
            return found
    return None


def run_events_after(app: SagaApplication, run_id: str,
                     after: int) -> tuple[list[dict[str, Any]], bool]:
    """The run's events after version ``after`` as JSON, and whether the run has ended."""
    uid = run_uuid(run_id)
    events = [event_json(e) for e in app.events_of(uid, gt=after, limit=PAGE)]
    if events:
        return events, len(events) < PAGE and events[-1]["type"] in ENDINGS
    tail = app.events_of(uid, desc=True, limit=1)
    # Ended only if nothing came after ``after`` in the meantime: an event committed
    # between the two reads is read next time, never skipped by closing early.
    return [], bool(tail) and tail[0].originator_version <= after \
        and type(tail[0]).__name__ in ENDINGS


class LogReader:
    """Reads the store's notification log as JSON events, each with its run's id (the
    name its caller chose, or its UUID) and position."""

    def __init__(self, app: SagaApplication) -> None:
        self.app = app
        self._runs: dict[str, dict[str, Any]] = {}  # uuid -> what seed 002 events need

    def after(self, position: int) -> list[dict[str, Any]]:
        """Up to a page of events after ``position``."""
        app = self.app
        out = []
        for n in app.notifications(position + 1, PAGE):
            event = event_json(app.mapper.to_domain_event(n))
            event["position"] = n.id
            event["run_id"] = self.run(str(n.originator_id), event)["run_id"]
            out.append(event)
        return out

    def run(self, uid: str, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """What is known of a run: its id, composition name, start time and step kinds."""
        if uid not in self._runs:
            if len(self._runs) > 10_000:
                self._runs.clear()
            if event is not None and event["type"] == "RunStarted":
                payload = event["payload"]
                started = {"context": payload.get("context") or {},
                           "definition": payload.get("definition") or {},
                           "timestamp": event["timestamp"], "id": uid}
            else:
                r = self.app.get_run(uid)
                started = {"context": r.context, "definition": r.definition,
                           "timestamp": r.started_at, "id": uid}
            self._runs[uid] = _run_facts(started)
        return self._runs[uid]


def _run_facts(started: dict[str, Any]) -> dict[str, Any]:
    definition = started["definition"]
    kinds = {}
    for step in definition.get("steps") or ():
        if isinstance(step, dict) and "id" in step:
            kinds[str(step["id"])] = ("tool" if step.get("tool") else "compute"
                                      if step.get("compute") is not None else
                                      "use" if step.get("use") else "step")
    return {"run_id": str(started["context"].get("run_id") or started["id"]),
            "name": definition.get("name", ""), "started_at": started["timestamp"],
            "kinds": kinds}


def check_moments(**bounds: str | None) -> None:
    """Refuse a time bound that is not an ISO time (``--since``, ``--until``) as bad input
    (exit 2), naming the option."""
    for name, value in bounds.items():
        try:
            if value is not None:
                datetime.fromisoformat(value)
        except (TypeError, ValueError):
            example = "(2026-11-01 or 2026-11-01T08:00:00Z)"
            raise InputError([Problem(f"--{name}", f"{str(value)[:80]!r} is not an ISO "
                                                   f"time {example}")]) from None
