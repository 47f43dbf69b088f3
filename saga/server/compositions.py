"""The seeds' HTTP API, on the same runs as everything else.

- Seed 000: ``POST /api/composition/execute`` and ``/validate`` take
  ``{workflow_id, agent_id, steps: [{step_id, skill_id, inputs, dependencies}]}``;
  ``GET /api/composition/status/{execution_id}``. A step's ``skill_id`` is a tool; a
  dependency's dict output is merged into the step's inputs (later dependencies win), a
  non-dict output goes under ``{dep_id}_output``.
- Seed 001: ``/api/v1/compositions/templates[/{id}]``, ``/execute`` (a
  CompositionRequest, answered with a CompositionResult) and ``/validate``.

An execute drives the run in the request (holding its lease, as ``saga run`` does), so
it answers with the outcome; if the service dies mid-run, any worker takes the run over.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from saga import report
from saga.api import Saga
from saga.composition import Plan
from saga.composition.definition import load_file
from saga.composition.library import (
    TemplateInfo,
    find_template,
    list_templates,
    read_template,
    template_document,
    template_problems,
)
from saga.domain import Run
from saga.errors import DefinitionError, InputError, Problem, SagaError
from saga.server.runs import service
from saga.server.service import error_response, named
from saga.server.tokens import principal

router = APIRouter(tags=["compositions (seeds 000 and 001)"])


class SkillStep(BaseModel):
    """Seed 000's StepModel."""

    model_config = ConfigDict(extra="forbid")
    step_id: str
    skill_id: str
    inputs: dict[str, Any] = Field(default_factory=dict)
    dependencies: list[str] = Field(default_factory=list)
    condition: str | None = None


class WorkflowRequest(BaseModel):
    """Seed 000's WorkflowRequest."""

    model_config = ConfigDict(extra="forbid")
    workflow_id: str
    agent_id: str | None = None
    steps: list[SkillStep]


def workflow_composition(body: WorkflowRequest) -> dict[str, Any]:
    """Seed 000's workflow as a step-list composition: each step's inputs are recorded in
    the definition, and its parameters merge its dependencies' outputs over them."""
    steps = []
    known = {s.step_id for s in body.steps}
    for s in body.steps:
        step: dict[str, Any] = {"id": s.step_id, "tool": s.skill_id, "depends_on": s.dependencies}
        merging = [dep for dep in s.dependencies if dep in known]  # others: reported once
        if merging:
            merged = f"inputs.step_inputs[{json.dumps(s.step_id)}]"
            for dep in merging:
                ref = f"steps[{json.dumps(dep)}]"
                merged = (f"dict({merged}, **({ref} if {ref} is mapping else "
                          f"{{{json.dumps(dep + '_output')}: {ref}}}))")
            step["parameters"] = "{{ " + merged + " }}"
        else:
            step["parameters"] = s.inputs
        if s.condition:
            step["condition"] = s.condition
        steps.append(step)
    return {"name": body.workflow_id,
            "inputs": [{"name": "step_inputs", "type": "object",
                        "default": {s.step_id: s.inputs for s in body.steps}}],
            "steps": steps,
            "error_handling": {"rollback_on_failure": True}}


def execution(run: Run) -> dict[str, Any]:
    """A run as seed 000's SkillCompositionExecution."""
    done = [s["step_id"] for s in run.steps.values() if s["status"] in ("completed",
                                                                       "compensated")]
    undone = [s["step_id"] for s in run.steps.values() if s["status"] == "compensated"]
    return {"execution_id": run.run_id, "workflow_id": run.name, "status": run.status,
            "agent_id": run.actor, "results": _results(run), "completed_steps": done,
            "rollback_performed": run.compensation is not None, "rollback_steps": undone,
            "error": run.error, "started_at": run.started_at, "completed_at": run.finished_at,
            "duration_seconds": _seconds(run.started_at, run.finished_at),
            "validation_status": "valid"}


def _results(run: Run) -> dict[str, Any]:
    return {s["step_id"]: s.get("output") for s in run.steps.values()
            if s["status"] in ("completed", "compensated") and s.get("iteration", 0) == 0}


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


@router.post("/api/composition/execute")
def execute_workflow(request: Request, body: WorkflowRequest) -> JSONResponse:
    """Seed 000: run a workflow of skills to its end; its execution record."""
    svc = service(request)
    plan = svc.saga.load(workflow_composition(body))
    # a store token's id stays on the record, the agent named after it
    token = principal(request)
    actor = (f"{svc.actor(request)}:{body.agent_id}"
             if token is not None and token.token_id and body.agent_id
             else body.agent_id or svc.actor(request))
    run = svc.saga.run(plan, {}, actor=actor)
    return JSONResponse(execution(run))


@router.post("/api/composition/validate")
def validate_workflow(request: Request, body: WorkflowRequest) -> JSONResponse:
    """Seed 000: check a workflow's DAG (cycles, missing dependencies, unknown skills)
    without running it; every problem with its path."""
    svc = service(request)
    try:
        plan = svc.saga.load(workflow_composition(body))
    except DefinitionError as e:
        return JSONResponse({"valid": False, "errors": [p.to_json() for p in e.problems]})
    return JSONResponse({"valid": True, "errors": [], "execution_order": plan.order,
                         "levels": plan.levels()})


@router.get("/api/composition/status/{execution_id}")
def workflow_status(request: Request, execution_id: str) -> JSONResponse:
    """Seed 000: a workflow execution's record."""
    svc = service(request)
    return JSONResponse(execution(svc.saga.get(execution_id)))


class ExecutionOptions(BaseModel):
    """Seed 001's ExecutionOptions (``timeout`` in seconds, or ``30s``, ``5m``)."""

    model_config = ConfigDict(extra="forbid")
    timeout: float | str | None = None
    max_concurrency: int | None = Field(default=None, ge=1, le=1024)
    error_strategy: str | None = Field(
        default=None, pattern="^(fail_fast|partial_success|rollback|retry)$")
    dry_run: bool = False


class CompositionRequest(BaseModel):
    """Seed 001's CompositionRequest: a template's id or a composition, with input."""

    model_config = ConfigDict(extra="forbid")
    template_id: str | None = None
    composition: dict[str, Any] | None = None
    input: dict[str, Any] = Field(default_factory=dict)
    options: ExecutionOptions = ExecutionOptions()


def _composition(saga: Saga, body: CompositionRequest) -> dict[str, Any]:
    if (body.template_id is None) == (body.composition is None):
        raise InputError([Problem("body", "give exactly one of template_id and composition")])
    data = dict(body.composition) if body.composition is not None else \
        load_file(find_template(body.template_id or "", saga.settings))
    inner = template_document(data)
    if inner is not None:  # seed 001's template document: its validation, then its composition
        problems = template_problems(data, saga.registry.tools())
        if problems:
            raise DefinitionError(problems, body.template_id)
        data = inner
    data = named(data, body.template_id)
    options = body.options
    if options.max_concurrency is not None:
        data["max_concurrency"] = options.max_concurrency
    if options.error_strategy is not None:
        handling = dict(data.get("error_handling") or {})
        handling["failure_strategy"] = options.error_strategy
        data["error_handling"] = handling
    return data


def composition_result(run: Run, started: float) -> dict[str, Any]:
    """A run as seed 001's CompositionResult (``duration`` in seconds), with its id."""
    errors = [{"step_id": s["step_id"], "type": (s.get("error") or {}).get("type"),
               "message": (s.get("error") or {}).get("message")}
              for s in run.steps.values() if s["status"] == "failed"]
    if run.error and not errors:
        errors.append({"step_id": run.failed_step, **run.error})
    executed = sum(1 for s in run.steps.values()
                   if s["status"] in ("completed", "failed", "compensated"))
    return {"success": run.status == "completed", "results": _results(run),
            "outputs": run.outputs, "errors": errors,
            "duration": round(time.monotonic() - started, 6), "steps_executed": executed,
            "run_id": run.run_id, "status": run.status}


@router.post("/api/v1/compositions/execute")
def execute_composition(request: Request, body: CompositionRequest) -> JSONResponse:
    """Seed 001: run a template or a composition; its CompositionResult (or, with
    ``dry_run``, what it would do)."""
    started = time.monotonic()
    svc = service(request)
    plan: Plan = svc.saga.load(_composition(svc.saga, body))
    if body.options.dry_run:
        return JSONResponse({"success": True, "dry_run": svc.saga.dry_run(plan, body.input),
                             "results": {}, "errors": [], "duration": 0.0,
                             "steps_executed": 0, "run_id": None})
    options = {"timeout": body.options.timeout} if body.options.timeout is not None else {}
    run = svc.saga.run(plan, body.input, actor=svc.actor(request), options=options)
    return JSONResponse(composition_result(run, started))


@router.post("/api/v1/compositions/validate")
def validate_composition(request: Request, body: CompositionRequest) -> JSONResponse:
    """Seed 001: every problem with its path (``valid`` false), or the levels and
    critical path; 200 either way."""
    svc = service(request)
    try:
        plan = svc.saga.load(_composition(svc.saga, body))
    except DefinitionError as e:
        return JSONResponse({"valid": False, "errors": [p.to_json() for p in e.problems]})
    except SagaError as e:
        return error_response(e)
    return JSONResponse({"valid": True, "errors": [], "name": plan.definition.name,
                         "levels": plan.levels(), "critical_path": plan.critical_path()})


def _template(info: TemplateInfo, stats: dict[str, Any], full: bool) -> dict[str, Any]:
    """A template as seed 001's template structure."""
    out: dict[str, Any] = {
        "id": info.name, "name": info.title, "description": info.description,
        "metadata": {"category": info.category, "tags": list(info.tags),
                     "estimated_duration_ms": stats.get("mean_duration_ms"),
                     "success_rate": stats.get("success_rate"),
                     "usage_count": stats.get("runs", 0)},
        "validation": {"required_tools": list(info.required_tools),
                       "min_version": info.version or None},
        "inputs": list(info.inputs)}
    if full:
        raw = load_file(info.path)
        out["composition"] = template_document(raw) or raw
    return out


@router.get("/api/v1/compositions/templates")
def templates(request: Request) -> list[dict[str, Any]]:
    """Seed 001: the template library, with success rate and usage count from the log."""
    saga = service(request).saga
    infos = [t for t in list_templates(saga.settings) if t.error is None]
    stats = report.templates_stats(saga, infos)
    return [_template(t, stats[t.name], False) for t in infos]


@router.get("/api/v1/compositions/templates/{template_id}")
def template(request: Request, template_id: str) -> dict[str, Any]:
    """Seed 001: one template with its composition."""
    saga = service(request).saga
    try:
        info = read_template(find_template(template_id, saga.settings))
    except SagaError as e:
        raise HTTPException(404, " ".join(str(e).split())) from None
    stats = report.templates_stats(saga, [info])[info.name]
    return _template(info, stats, True)
