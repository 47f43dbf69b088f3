"""Built-in tools, enough to compose examples without writing Python.

``noop``, ``echo``, ``sleep`` and ``fail`` live here; the tools that reach real systems
(``shell``, ``http``, ``sql``, ``file``, ``git``) each have a module of their own and are
built from saga.toml by :func:`builtin_tools`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from saga.errors import ToolError
from saga.tools import file, git, http, shell, sql
from saga.tools.base import Tool, ToolContext


async def noop(params: dict[str, Any], ctx: ToolContext) -> None:
    """Does nothing and returns null."""
    return None


async def echo(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Returns its parameters."""
    return dict(params)


async def sleep(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Waits ``seconds`` (cancellable, so a timeout stops it)."""
    seconds = float(params.get("seconds", 0))
    await asyncio.sleep(seconds)
    return {"slept": seconds}


async def fail(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Fails with ``message``; with ``times: N`` only the first N attempts fail."""
    times = params.get("times")
    if times is not None and ctx.attempt > int(times):
        return {"attempt": ctx.attempt, "failed_before": int(times)}
    raise ToolError(str(params.get("message", "failed on purpose")),
                    error_type=str(params.get("error_type", "ToolError")),
                    retryable=bool(params.get("retryable", True)))


TOOLS = [
    Tool("noop", noop, description="Does nothing; returns null.", source="builtin"),
    Tool("echo", echo, description="Returns its parameters.", source="builtin"),
    Tool("sleep", sleep, description="Waits `seconds` seconds.", source="builtin",
         params={"type": "object", "additionalProperties": False,
                 "properties": {"seconds": {"type": "number", "minimum": 0}}}),
    Tool("fail", fail, description="Fails with `message`; `times: N` fails only the first N "
                                   "attempts.", source="builtin",
         params={"type": "object", "additionalProperties": False,
                 "properties": {"message": {"type": "string"},
                                "times": {"type": "integer", "minimum": 0},
                                "error_type": {"type": "string"},
                                "retryable": {"type": "boolean"}}}),
]


def builtin_tools(config: Mapping[str, Any] | None = None) -> list[Tool]:
    """Every built-in tool, configured from saga.toml data (``Settings.file``)."""
    config = config or {}
    made = [module.make_tool(config) for module in (shell, http, sql, file, git)]
    return [*TOOLS, *(replace(t, undoes=_UNDO_KEYS[t.name]) if t.name in _UNDO_KEYS else t
                      for t in made)]


def _has(key: str) -> Callable[[dict[str, Any]], bool]:
    return lambda params: key in params


#: The built-ins whose own compensation undoes only the calls that say how.
_UNDO_KEYS = {"shell": _has("undo_argv"), "http": _has("undo"), "sql": _has("undo_statement"),
              "git": lambda params: params.get("action") != "status"}  # status changes nothing
