"""Following the log live: Server-Sent Events for one run (ids are the run's versions) and
for the whole store (ids are notification-log positions), and seed 002's WebSocket events.

Every stream reads what is committed, by any process, so a client sees the same history
whichever worker wrote it. A client that reconnects with ``Last-Event-ID: N`` gets
exactly the events after N.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any, TypeVar

from fastapi import APIRouter, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from saga.domain import ENDINGS, run_uuid
from saga.errors import InputError, Problem, SagaError
from saga.server.service import Service
from saga.server.tokens import tenant_service
from saga.views import LogReader, run_events_after

log = logging.getLogger("saga.server")
router = APIRouter(tags=["events"])
T = TypeVar("T")

#: Seconds between looks at the store while a stream has nothing new.
POLL = 0.2
#: Seconds of silence after which a stream sends a comment, so proxies keep it open.
KEEPALIVE = 15.0


def wants_stream(request: Request) -> bool:
    """True when the client asked for Server-Sent Events."""
    return "text/event-stream" in request.headers.get("accept", "")


#: The largest event id or position (a 64-bit integer, as the stores keep them).
MAX_ID = (1 << 63) - 1


def resume_point(request: Request, after: int) -> int:
    """Where a stream starts: after ``Last-Event-ID`` when the client reconnects, else
    after ``after``. An id that is not a number the store could hold is refused (422)."""
    last = request.headers.get("last-event-id", "").strip()
    if not last:
        return after
    # ASCII digits only (str.isdigit takes "²"), and no more than a store's integer
    if not (last.isascii() and last.isdigit() and len(last) <= 19 and int(last) <= MAX_ID):
        raise InputError([Problem("Last-Event-ID", "an event id: a whole number from 0 "
                                                   f"to {MAX_ID}")])
    return int(last)


#: Seconds a stream keeps asking a busy or unreachable store before it ends.
RETRY_SECONDS = 30.0


async def patiently(func: Callable[..., T], *args: Any) -> T:
    """``func(*args)`` in a thread, asked again while the store is busy (SQLite's lock
    under many writers) or briefly unreachable: a stream that ended on the first error
    would leave its client with a run that seems to stop mid-way."""
    delay, waited = 0.05, 0.0
    while True:
        try:
            return await run_in_threadpool(func, *args)
        except Exception as err:
            if waited >= RETRY_SECONDS:
                raise
            log.info("reading the log failed (%s); asking again", err)
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 2.0)


def _frame(ident: int, kind: str, data: Any) -> str:
    body = json.dumps(data, default=str, ensure_ascii=False)
    return f"id: {ident}\nevent: {kind}\ndata: {body}\n\n"


def _response(frames: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(frames, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


Frames = tuple[list[tuple[int, str, Any]], bool]  # (id, event type, data) each; ended


def _stream(request: Request, start: int, read: Callable[[int], Frames],
            what: str) -> StreamingResponse:
    """Server-Sent Events of what ``read(position)`` gives after ``start``: the recorded,
    then the new as they are committed, a comment now and then while nothing happens,
    until ``read`` says it ended or the client goes."""
    async def frames() -> AsyncIterator[str]:
        position, quiet = start, 0.0
        while True:
            try:
                items, ended = await patiently(read, position)
            except Exception as err:  # the store stayed away: the client reconnects later
                log.warning("%s ends: %s", what, err)
                return
            for ident, kind, data in items:
                yield _frame(ident, kind, data)
                position, quiet = ident, 0.0
            if ended:
                return
            if items:
                continue
            if await request.is_disconnected():
                return
            await asyncio.sleep(POLL)
            quiet += POLL
            if quiet >= KEEPALIVE:
                yield ": keepalive\n\n"
                quiet = 0.0
    return _response(frames())


def run_event_stream(request: Request, svc: Service, run_id: str, after: int
                     ) -> StreamingResponse:
    """A run's events as Server-Sent Events, from ``resume_point`` until the run ends."""
    def read(position: int) -> Frames:
        events, ended = run_events_after(svc.saga.app, run_id, position)
        return [(e["version"], e["type"], {**e, "run_id": run_id}) for e in events], ended
    return _stream(request, resume_point(request, after), read, f"event stream of {run_id}")


@router.get("/api/v1/events", responses={200: {"content": {"text/event-stream": {}}}})
def all_events(request: Request, after: int = Query(0, ge=0, le=MAX_ID)) -> StreamingResponse:
    """Every run's events as Server-Sent Events, live; ids are positions in the store's
    notification log (reconnect with ``Last-Event-ID`` to go on)."""
    svc: Service = tenant_service(request)
    reader = LogReader(svc.saga.app)

    def read(position: int) -> Frames:
        return [(e["position"], e["type"], e) for e in reader.after(position)], False
    return _stream(request, resume_point(request, after), read, "the event stream")


def seed_event(event: dict[str, Any], run: dict[str, Any]) -> dict[str, Any] | None:
    """Seed 002's WebSocket message for one of our events (None for events it has no name
    for), with ``run_id``, ``event`` (our name) and ``id`` beside seed 002's fields."""
    p, kind, step = event["payload"], event["type"], event.get("step_id")
    message: dict[str, Any] | None
    if kind == "RunStarted":
        message = {"type": "skill_started", "skill": run["name"],
                   "execution_id": run["run_id"], "inputs": p.get("inputs")}
    elif kind == "StepStarted":
        message = {"type": "step_started", "step_id": step,
                   "step_type": run["kinds"].get(str(step), "step"), "attempt": p.get("attempt")}
    elif kind in ("StepCompleted", "StepFailed"):
        ok = kind == "StepCompleted"
        message = {"type": "step_completed", "step_id": step, "success": ok,
                   "result": p.get("output") if ok else
                   {"type": p.get("error_type"), "message": p.get("message")},
                   "duration": (p.get("duration_ms") or 0) / 1000 if ok else None}
    elif kind == "StepSkipped":
        message = {"type": "step_skipped", "step_id": step, "reason": p.get("reason")}
    elif kind == "HealStarted":
        remedies = p.get("remedies") or []
        message = {"type": "auto_heal_triggered", "step_id": step,
                   "failure_type": (remedies[0].get("error") if remedies and
                                    isinstance(remedies[0], dict) else None),
                   "action": remedies}
    elif kind == "ApprovalRequested":
        message = {"type": "confirmation_required", "step_id": step,
                   "message": p.get("message"), "options": ["approve", "reject"]}
    elif kind == "RunCompleted":
        message = {"type": "skill_completed", "execution_id": run["run_id"], "success": True,
                   "outputs": p.get("outputs"),
                   "duration": _seconds(run["started_at"], event["timestamp"])}
    elif kind in ("RunFailed", "RunCompensated", "RunCancelled"):
        message = {"type": "skill_failed", "execution_id": run["run_id"],
                   "error": p.get("error") or p.get("reason"), "step_id": p.get("failed_step"),
                   "status": ENDINGS[kind]}
    else:
        return None
    message.update(run_id=run["run_id"], event=kind,
                   id=event.get("position", event["version"]))
    return message


def _seconds(start: Any, end: Any) -> float | None:
    try:
        return (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start))
                ).total_seconds()
    except ValueError:
        return None


@router.websocket("/ws")
async def websocket_events(websocket: WebSocket, run: str | None = None,
                           after: int = Query(0, ge=0, le=MAX_ID)) -> None:
    """Seed 002's execution events (``skill_started``, ``step_started``,
    ``step_completed``, ``step_skipped``, ``auto_heal_triggered``,
    ``confirmation_required``, ``skill_completed``, ``skill_failed``) as JSON messages:
    of every run, or of one (``?run=ID``, closed after it ends); from ``after``."""
    svc: Service = tenant_service(websocket)
    reader = LogReader(svc.saga.app)
    await websocket.accept()
    try:
        if run is not None:
            try:
                run_key = await run_in_threadpool(svc.saga.resolve, run)
            except SagaError as err:
                await websocket.send_json({"type": "error", "detail": str(err)})
                await websocket.close(4404)
                return
            uid = str(run_uuid(run_key))
            position = after
            while True:
                events, ended = await patiently(run_events_after, svc.saga.app, run_key,
                                                position)
                for event in events:
                    message = seed_event(event, await run_in_threadpool(reader.run, uid, event))
                    if message is not None:
                        await websocket.send_json(message)
                    position = event["version"]
                if ended:
                    await websocket.close()
                    return
                if not events and not await _idle(websocket):
                    return
        position = after
        while True:
            events = await patiently(reader.after, position)
            for event in events:
                uid = str(run_uuid(event["run_id"]))
                message = seed_event(event, reader.run(uid, event))
                if message is not None:
                    await websocket.send_json(message)
                position = event["position"]
            if not events and not await _idle(websocket):
                return
    except WebSocketDisconnect:
        return


async def _idle(websocket: WebSocket) -> bool:
    """Wait a poll interval for the client; False once it has gone."""
    try:
        message = await asyncio.wait_for(websocket.receive(), POLL)
    except TimeoutError:
        return True
    return bool(message["type"] != "websocket.disconnect")
