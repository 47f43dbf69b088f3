"""The notification outbox over HTTP (``/api/v1``): list notifications, show one with
its attempts, send one again, and a run's own (which the viewer shows)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from saga.server.runs import service

router = APIRouter(prefix="/api/v1", tags=["notifications"])


@router.get("/notifications")
def list_notifications(request: Request,
                       status: Literal["pending", "delivered", "failed"] | None = None,
                       run: str | None = Query(None, description="Only this run's."),
                       limit: int = Query(100, ge=1, le=10_000)) -> list[dict[str, Any]]:
    """Notifications newest first (webhooks derived from runs' events), with their
    attempts so far; ``status`` pending, delivered or failed."""
    return service(request).saga.notifications(status, run, limit)


@router.get("/notifications/{notification_id}")
def get_notification(request: Request, notification_id: str) -> dict[str, Any]:
    """One notification: the body it sends and every delivery attempt."""
    return service(request).saga.notification(notification_id)


@router.post("/notifications/{notification_id}/retry")
def retry_notification(request: Request, notification_id: str) -> dict[str, Any]:
    """Send a notification again (delivered or failed alike): a worker sends it on its
    next round. 422 while one is sending it."""
    return service(request).saga.retry_notification(notification_id)


@router.get("/runs/{run_id}/notifications")
def run_notifications(request: Request, run_id: str) -> list[dict[str, Any]]:
    """The run's notifications, each with its attempts (what the viewer shows)."""
    return service(request).saga.notifications(run_id=run_id, limit=200, attempts=True)
