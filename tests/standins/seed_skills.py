"""Seed 003's example skills as tools of their own names, so that a SKILL.md manifest as
the seed writes it (no steps: the skill is its tool) runs: ``quality-gate``,
``insight-collector`` (fails when ``fail`` is given) and ``reflect``."""

from __future__ import annotations

from typing import Any

from saga.errors import ToolError
from saga.tools import ToolContext, tool


@tool("quality-gate")
def quality_gate(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Validates code quality thresholds (here: always met)."""
    return {"passed": True}


@tool("insight-collector")
def insight_collector(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Captures learnings; fails when ``fail`` is true."""
    if params.get("fail"):
        raise ToolError("no insights today", retryable=False)
    return {"insights": 1}


@tool("reflect")
def reflect(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Reflects on the run."""
    return {"reflected": True}
