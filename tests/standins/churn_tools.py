"""Tools for worker-churn tests: each call and each undo is appended, as one JSON line, to
the file SAGA_TEST_CHURN_LOG names (with the pid of the worker that made it), so a test
can count what every worker process did, including those it killed."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from saga import ToolContext, ToolError, tool


def _record(kind: str, ctx: ToolContext, **extra: Any) -> None:
    path = os.environ.get("SAGA_TEST_CHURN_LOG")
    if path:
        entry = {"kind": kind, "run": ctx.run_id, "step": ctx.step_id, "attempt": ctx.attempt,
                 "key": ctx.idempotency_key, "pid": os.getpid(), **extra}
        with open(path, "a", encoding="utf-8") as f:  # one short write: whole lines
            f.write(json.dumps(entry) + "\n")


@tool("unwork")
def unwork(params: dict, ctx: ToolContext) -> dict:
    """The undo of ``work`` and ``poison``: records it (its key ends ``:compensate``);
    then takes ``seconds`` (none unless given) and records that it returned."""
    _record("undo", ctx)
    if params.get("seconds"):
        time.sleep(float(params["seconds"]))
        _record("undone", ctx)
    return {"undone": ctx.step_id}


@tool("work")
def work(params: dict, ctx: ToolContext) -> dict:
    """Acts at once (the recorded call is its effect), then takes ``seconds``."""
    _record("call", ctx)
    time.sleep(float(params.get("seconds", 0.5)))
    _record("finished", ctx)
    return {"step": ctx.step_id}


@tool("refuse")
def refuse(params: dict, ctx: ToolContext) -> None:
    """Fails without acting."""
    _record("refused", ctx)
    raise ToolError(f"{ctx.step_id} refused", retryable=False)


@tool("poison")
def poison(params: dict, ctx: ToolContext) -> None:
    """Acts, then ends its worker's process at once, every time."""
    _record("call", ctx)
    os._exit(1)
