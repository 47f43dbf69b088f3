"""saga's own resource API under ``/api/v1``: runs, their history, approvals, redrive,
graph, verification, reports and schedules.

A change answers with the run as it is after the change; the worker (this service's
own, or any other on the store) does what the change calls for.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from saga import audit, diagram, report
from saga.api import Saga
from saga.composition import Plan, plan_of
from saga.composition.library import find_template
from saga.domain import RUN_STATUSES
from saga.errors import InputError, Problem
from saga.scheduler.policy import not_undone
from saga.server.service import Service, log, named
from saga.server.streams import MAX_ID, run_event_stream, wants_stream
from saga.server.tokens import tenant_service
from saga.store.partitions import parts_of

router = APIRouter(prefix="/api/v1", tags=["runs"])


#: How deep a request body may nest (a composition or inputs deeper than this is a 422,
#: not a RecursionError in whatever walks it later).
MAX_DEPTH = 100


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _shallow(cls, data: Any) -> Any:
        if nesting(data) > MAX_DEPTH:
            raise ValueError(f"nested more than {MAX_DEPTH} levels deep")
        return data


def nesting(value: Any) -> int:
    """How deep dicts and lists nest in ``value`` (counted without recursion)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((v, depth + 1) for v in item)
    return deepest


class RunRequest(_Body):
    """A run to submit: a composition (inline) or a template (by name), with inputs."""

    composition: dict[str, Any] | None = Field(default=None,
                                               description="The composition itself.")
    template: str | None = Field(default=None,
                                 description="A template's name (saga templates list).")
    inputs: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = Field(default=None,
                               description="Your name for the run: starting it again "
                                                 "with the same composition and inputs "
                                                 "returns the same run.")
    labels: dict[str, str] = Field(default_factory=dict)
    mode: str | None = Field(default=None, description="The run's mode (eco skips enhancements).")
    timeout: float | str | None = Field(default=None, description="Seconds, or 10m, 2h: the run "
                                                          "fails and is undone past it.")
    queue: str | None = Field(default=None, description="The queue workers claim it from "
                                                        "(default: the composition's).")
    priority: int | None = Field(default=None, description="Higher is claimed first (0).")


class Comment(_Body):
    """A comment recorded with an approval or a rejection."""

    comment: str | None = None


class Reason(_Body):
    """Why a run is cancelled, retried or undone (recorded)."""

    reason: str | None = None


class ScheduleRequest(_Body):
    """A schedule: a template or composition started on a cron or every N seconds."""

    name: str
    template: str | None = None
    composition: dict[str, Any] | None = None
    inputs: dict[str, Any] = Field(default_factory=dict)
    cron: str | None = None
    every: str | None = None
    timezone: str = "UTC"
    catch_up: str = "skip"
    replace: bool = False


def service(request: Request) -> Service:
    """The service of the caller's tenant (the app's own for the default tenant)."""
    return tenant_service(request)


def load_plan(saga: Saga, composition: dict[str, Any] | None, template: str | None) -> Plan:
    """The plan of an inline composition or a template (never a path on this host)."""
    if (composition is None) == (template is None):
        raise InputError([Problem("body", "give exactly one of composition and template")])
    if template is not None:
        return saga.load(find_template(template, saga.settings))
    assert composition is not None
    return saga.load(named(composition))


@router.get("/health", tags=["service"])
def health(request: Request) -> JSONResponse:
    """Whether the service can reach its store (no token needed)."""
    svc = service(request)
    # Anyone may ask, so the answer names the kind of store, never where it is (a path
    # on this host, a database's address): the operator's log says that.
    body = {"status": "ok", "store": "postgresql" if svc.settings.is_postgres else "sqlite",
            "worker": svc.worker_alive, "version": request.app.version}
    try:
        # a partitioned store's logs each number their own: the sum says it is reachable
        body["position"] = sum(part.probe() for part in parts_of(svc.saga.app))
    except Exception as e:
        said = " ".join(str(e).split())
        log.warning("health: %s (%s)", said, svc.settings.store_description)
        # the summary before the driver's own words, which may name a file or a host
        body.update(status="unavailable", error=type(e).__name__,
                    detail=said.split(": ")[0][:200])
        return JSONResponse(body, 503)
    return JSONResponse(body)


@router.get("/runs")
def list_runs(request: Request, status: str | None = None, definition: str | None = None,
              actor: str | None = None, label: Annotated[list[str] | None, Query()] = None,
              since: str | None = None, until: str | None = None,
              prefix: str | None = Query(None, max_length=200),
              limit: int = Query(50, ge=0, le=1000),
              offset: int = Query(0, ge=0)) -> list[dict[str, Any]]:
    """Runs, newest first, filtered by status, definition, actor, labels (``key=value``,
    all must match), start time and ``prefix`` (of the run's id or chosen name); a page
    of ``limit`` from ``offset`` on."""
    if status is not None and status not in RUN_STATUSES:  # as saga list --status says
        raise InputError([Problem("status", f"unknown status {status!r} (one of "
                                            f"{', '.join(RUN_STATUSES)})")])
    labels = {}
    for pair in label or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError([Problem("label", f"{pair!r} is not key=value")])
        labels[key] = value
    return service(request).saga.list_runs(status, limit, since, definition=definition,
                                           actor=actor, labels=labels, until=until,
                                           prefix=prefix, offset=offset)


@router.post("/runs", status_code=202)
def submit(request: Request, body: RunRequest) -> JSONResponse:
    """Record a run; a worker drives it. 202 with its id (and, when ``run_id`` names a run
    already started with the same composition and inputs, that run: nothing starts
    again; other inputs under it are a 409). A ``traceparent`` header makes the run's
    trace a child of the caller's span."""
    svc = service(request)
    plan = load_plan(svc.saga, body.composition, body.template)
    options: dict[str, Any] = {}
    if body.mode:
        options["mode"] = body.mode
    if body.timeout is not None:
        options["timeout"] = body.timeout
    traceparent = request.headers.get("traceparent")  # the caller's span: the run's parent
    run = svc.saga.submit(plan, body.inputs, actor=svc.actor(request), labels=body.labels,
                          options=options, run_id=body.run_id, queue=body.queue,
                          priority=body.priority,
                          context={"traceparent": traceparent} if traceparent else None)
    return JSONResponse({"run_id": run.run_id, "status": run.status, "name": run.name,
                         "trace_id": run.context.get("trace_id"),
                         "url": f"/api/v1/runs/{run.run_id}"}, 202)


@router.get("/runs/{run_id}")
def get_run(request: Request, run_id: str) -> dict[str, Any]:
    """The run's state: status, steps, outputs, error, and its child runs."""
    return service(request).saga.status(run_id)


@router.get("/runs/{run_id}/events", responses={200: {"content": {"text/event-stream": {}}}})
def events(request: Request, run_id: str, after: int = Query(0, ge=0, le=MAX_ID)) -> Response:
    """The run's history as JSON; with ``Accept: text/event-stream``, a live stream of
    its events from ``Last-Event-ID`` (or ``after``) until the run ends."""
    svc = service(request)
    if wants_stream(request):
        return run_event_stream(request, svc, svc.saga.resolve(run_id), after)
    return JSONResponse([e for e in svc.saga.history(run_id) if e["version"] > after])


@router.post("/runs/{run_id}/approve/{step_id}")
def approve(request: Request, run_id: str, step_id: str,
            body: Comment | None = None) -> dict[str, Any]:
    """Grant the approval a waiting step asked for."""
    svc = service(request)
    run = svc.saga.approve(run_id, step_id, actor=svc.actor(request),
                           comment=body.comment if body else None)
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/reject/{step_id}")
def reject(request: Request, run_id: str, step_id: str,
           body: Comment | None = None) -> dict[str, Any]:
    """Reject it: the step fails and the run follows its failure policy."""
    svc = service(request)
    run = svc.saga.reject(run_id, step_id, actor=svc.actor(request),
                          comment=body.comment if body else None)
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/cancel")
def cancel(request: Request, run_id: str, body: Reason | None = None) -> dict[str, Any]:
    """Cancel an unfinished run: its completed steps are undone, then it ends cancelled."""
    svc = service(request)
    run = svc.saga.cancel(run_id, actor=svc.actor(request),
                          reason=body.reason if body else None, drive=False)
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/retry")
def retry(request: Request, run_id: str, body: Reason | None = None) -> dict[str, Any]:
    """Redrive a failed run from its failed steps, keeping completed work."""
    svc = service(request)
    run = svc.saga.retry(run_id, actor=svc.actor(request),
                         reason=body.reason if body else None, drive=False)
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/compensate")
def compensate(request: Request, run_id: str, body: Reason | None = None) -> dict[str, Any]:
    """Undo a run's completed steps, in reverse completion order."""
    svc = service(request)
    run = svc.saga.compensate(run_id, actor=svc.actor(request),
                              reason=body.reason if body else None, drive=False)
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/signals/{name}")
def signal(request: Request, run_id: str, name: str,
           data: Annotated[Any, Body(description="The signal's data: the waiting step's "
                                                 "output.")] = None) -> dict[str, Any]:
    """Send a signal: the first step waiting for ``name`` (now or later) gets ``data``."""
    svc = service(request)
    run = svc.saga.signal(run_id, name, data, actor=svc.actor(request))
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/pause")
def pause(request: Request, run_id: str, body: Reason | None = None) -> dict[str, Any]:
    """Pause a run: no new step starts; attempts in flight finish."""
    svc = service(request)
    run = svc.saga.pause(run_id, actor=svc.actor(request), reason=body.reason if body else None)
    return svc.saga.status(run.run_id)


@router.post("/runs/{run_id}/unpause")
def unpause(request: Request, run_id: str) -> dict[str, Any]:
    """Let a paused run go on."""
    svc = service(request)
    run = svc.saga.unpause(run_id, actor=svc.actor(request))
    return svc.saga.status(run.run_id)


@router.get("/runs/{run_id}/graph", responses={200: {"content": {"text/plain": {}}}})
def graph(request: Request, run_id: str,
          format: str = Query("mermaid", pattern="^(mermaid|dot|json)$")) -> Response:
    """The run's graph with its steps coloured by status: Mermaid (default), DOT, or JSON
    (nodes with their level and status, and edges) as the viewer draws it."""
    run = service(request).saga.get(run_id)
    plan = plan_of(run)
    left = not_undone(plan, run)
    if format == "json":
        return JSONResponse(diagram.layout(plan, run, left))
    text = (diagram.mermaid if format == "mermaid" else diagram.dot)(plan, run, left)
    return PlainTextResponse(text)


@router.get("/runs/{run_id}/verify")
def verify(request: Request, run_id: str) -> dict[str, Any]:
    """The run's audit chain (and macs, with a key) and a replay of its decisions."""
    svc = service(request)
    run_key = svc.saga.resolve(run_id)
    result = audit.verify_store(svc.settings, [run_key], audit.audit_key(svc.settings))[0]
    try:
        divergence = svc.saga.verify(run_key)
        replayed: dict[str, Any] = {"ok": divergence is None,
                                    "divergence": str(divergence) if divergence else None}
    except Exception as e:  # a redacted run cannot be replayed: say so, keep the chain result
        replayed = {"ok": None, "divergence": None, "detail": " ".join(str(e).split())}
    chain = result.to_json()
    return {"run_id": run_id, "ok": bool(result.ok) and replayed["ok"] is not False,
            "chain": chain, "replay": replayed}


@router.get("/report", tags=["reports"], responses={200: {"content": {"text/markdown": {}}}})
def get_report(request: Request, format: str = Query("json", pattern="^(json|md|csv|html)$"),
               since: str | None = None, until: str | None = None,
               definition: str | None = None, actor: str | None = None,
               status: str | None = None, label: Annotated[list[str] | None, Query()] = None,
               tenant: str | None = None) -> Response:
    """The compliance report (``saga report``) of the runs that match, of the token's
    tenant (``tenant``, when given, must be it)."""
    if tenant is not None and tenant != service(request).settings.tenant:
        # as for another tenant's run: not found, whether that tenant exists or not
        raise HTTPException(404, f"no tenant {tenant!r}")
    labels = dict(pair.partition("=")[::2] for pair in label or ())
    try:
        built = report.build_report(service(request).saga, since=since, until=until,
                                    definition=definition, actor=actor, status=status,
                                    labels=labels)
    except ValueError as e:
        raise InputError([Problem("report", str(e))]) from None
    text = report.render(built, format)
    media = {"json": "application/json", "md": "text/markdown", "csv": "text/csv",
             "html": "text/html"}[format]
    # a download, never a page of this origin: a run's name is not markup here
    return Response(text, media_type=media, headers={
        "Content-Disposition": f"attachment; filename=saga-report.{format}",
        "X-Content-Type-Options": "nosniff"})


@router.get("/schedules", tags=["schedules"])
def schedules(request: Request) -> list[dict[str, Any]]:
    """The schedules and when each fires next."""
    return [s.to_json() for s in service(request).saga.schedules.all()]


@router.post("/schedules", tags=["schedules"], status_code=201)
def add_schedule(request: Request, body: ScheduleRequest) -> dict[str, Any]:
    """Add (or with ``replace``, change) a schedule; its inputs are checked now."""
    saga = service(request).saga
    plan = load_plan(saga, body.composition, body.template)
    saga.start(plan, body.inputs)  # the inputs must start a run: checked now, not at 2 am
    added = saga.schedules.add(body.name, body.template or f"(api) {plan.definition.name}",
                               plan.record(), body.inputs, cron=body.cron, every=body.every,
                               timezone=body.timezone, catch_up=body.catch_up,
                               replace=body.replace)
    return added.to_json()


@router.post("/schedules/{name}/{action}", tags=["schedules"])
def change_schedule(request: Request, name: str,
                    action: str = Path(..., pattern="^(pause|resume)$")) -> dict[str, Any]:
    """Pause or resume a schedule."""
    return service(request).saga.schedules.set_paused(name, action == "pause").to_json()


@router.delete("/schedules/{name}", tags=["schedules"], status_code=204)
def remove_schedule(request: Request, name: str) -> Response:
    """Remove a schedule (the runs it started are kept)."""
    service(request).saga.schedules.remove(name)
    return Response(status_code=204)
