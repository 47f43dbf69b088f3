"""Tools for the conformance simulator: every call and every undo is one JSON line.

Workers load this module with ``--tools tests.conformance.tools``. Each call appends
``{"kind": "call"|"end"|"undo", "tool", "run", "step", "key", "attempt", "pid", "t"}`` to the ledger
file named by ``SIM_LEDGER`` (``O_APPEND`` writes of one line are atomic across
processes), before it acts, so a call its worker died in is counted too. The invariants
count effects from the ledger: calls per step attempt, undos per step, undo order.

- ``sim_act`` fails its first ``fail_times`` attempts of an idempotency key (``ctx.attempt``
  counts them across processes), or every time with ``fail: true``; a compensation
  declared in the composition undoes it (``sim_undo``).
- ``sim_own`` has an undo of its own (registered with ``compensate=``), as the ``file``
  tool does: the composition names no ``compensate``.
- ``sim_plain`` has no undo at all: it must be named as not undone.
- ``sim_fail`` always fails (for graph-form tasks, whose only parameter is ``task``).
- ``sim_undo`` records an undo; ``fail: true`` makes the compensation fail.
- ``sim_slow`` is ``sim_act`` that takes ``seconds`` (so pauses, kills and cancels land
  while a call is in flight).

Each call beats (``ctx.heartbeat``) ``{"attempt", "slept"}`` as it starts and every tenth
of a second it works, and its ledger line says what it was handed as
``ctx.last_heartbeat`` (``resumed``), for :mod:`tests.conformance.heartbeats_ops`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from saga import ToolContext, ToolError, tool


def ledger(kind: str, name: str, ctx: ToolContext, **extra: Any) -> None:
    """Append one line to the ledger (when ``SIM_LEDGER`` names one)."""
    path = os.environ.get("SIM_LEDGER")
    if not path:
        return
    entry = {"kind": kind, "tool": name, "run": ctx.run_id, "step": ctx.step_id,
             "key": ctx.idempotency_key, "attempt": ctx.attempt, "pid": os.getpid(),
             "t": time.time(), **extra}
    line = (json.dumps(entry, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def _act(name: str, params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    try:
        return _work(name, params, ctx)
    finally:  # the call's end, returned or raised (resources_ops counts calls at once)
        ledger("end", name, ctx)


def _work(name: str, params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    ledger("call", name, ctx, resumed=ctx.last_heartbeat)  # (heartbeats_ops checks it)
    ctx.heartbeat({"attempt": ctx.attempt, "slept": 0})
    seconds = float(params.get("seconds", 0) or 0)
    for tenth in range(1, int(seconds * 10) + 1):  # beating while it works
        time.sleep(0.1)
        ctx.heartbeat({"attempt": ctx.attempt, "slept": tenth})
    time.sleep(max(seconds - int(seconds * 10) / 10, 0))
    if params.get("fail") or ctx.attempt <= int(params.get("fail_times", 0) or 0):
        raise ToolError(f"{name} {ctx.step_id} failed at attempt {ctx.attempt}")
    return {"step": ctx.step_id, "value": params.get("value"), "attempt": ctx.attempt}


@tool("sim_act")
def sim_act(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """An effect: fails its first ``fail_times`` attempts, or always with ``fail``."""
    return _act("sim_act", params, ctx)


@tool("sim_slow")
def sim_slow(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """``sim_act`` that takes ``seconds`` before it answers."""
    return _act("sim_slow", params, ctx)


@tool("sim_plain")
def sim_plain(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """An effect nothing can undo."""
    return _act("sim_plain", params, ctx)


def _own_undo(params: dict[str, Any], output: Any, ctx: ToolContext) -> dict[str, Any]:
    ledger("undo", "sim_own", ctx)
    if params.get("undo_fail"):
        raise ToolError(f"sim_own's undo of {ctx.step_id} failed")
    return {"undone": ctx.step_id}


@tool("sim_own", compensate=_own_undo)
def sim_own(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """An effect with its tool's own undo (as the ``file`` tool has)."""
    return _act("sim_own", params, ctx)


@tool("sim_fail")
def sim_fail(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """An effect that always fails (a graph-form task has no parameters of its own)."""
    return _act("sim_fail", {**params, "fail": True}, ctx)


@tool("sim_undo")
def sim_undo(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A compensation: records the undo; fails with ``fail``."""
    ledger("undo", "sim_undo", ctx, what=params.get("what"))
    if params.get("fail"):
        raise ToolError(f"undo of {ctx.step_id} failed")
    return {"undone": params.get("what")}
