"""Resource limits over HTTP (``/api/v1``): each resource saga.toml limits, with its calls
in flight and waiting, as the store holds them for every worker."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from saga.server.runs import service

router = APIRouter(prefix="/api/v1", tags=["resources"])


@router.get("/resources")
def list_resources(request: Request) -> list[dict[str, Any]]:
    """Each resource saga.toml limits (``[resources.NAME]``): its concurrency, rate and
    burst, and how many calls hold a slot and wait for one now, on every worker. Counts
    only: which runs hold or wait is ``saga resources`` (an operator's view)."""
    return service(request).saga.resource_report(calls=False)
