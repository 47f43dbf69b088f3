"""Seed 000's example skills, as tools that answer from loopback data (no network):
``http_get`` and ``analyze``."""

from __future__ import annotations

from typing import Any

from saga.tools import ToolContext, tool


@tool("http_get")
def http_get(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A fetched page, made up from the URL."""
    return {"status": 200, "body": f"fetched {params.get('url')}", "content_type": "text/plain"}


@tool("analyze")
def analyze(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """An analysis that echoes what it was given (so a test sees the merged inputs)."""
    return {"algorithm": params.get("algorithm"), "sentiment": "positive",
            "given": sorted(params)}
