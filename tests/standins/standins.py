"""Stand-in tools for tests: the tools seeds 001 and 002 name, plus recorders.

Every call is appended to CALLS (in-process) and, when the environment names a file in
SAGA_TEST_CALL_LOG, to that file as one JSON line, so tests in other processes can count
side effects.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

from saga import ToolContext, ToolError, tool

CALLS: list[dict[str, Any]] = []
_lock = threading.Lock()


def record(name: str, params: Any, ctx: ToolContext, **extra: Any) -> None:
    """Remember a call (and log it to SAGA_TEST_CALL_LOG if set)."""
    entry = {"tool": name, "params": params, "step": ctx.step_id, "attempt": ctx.attempt,
             "key": ctx.idempotency_key, "t": time.monotonic(), **extra}
    with _lock:
        CALLS.append(entry)
        path = os.environ.get("SAGA_TEST_CALL_LOG")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry, default=str) + "\n")


# -- seed 001: search -> fold -> store ------------------------------------------------

@tool("checkpoint_search")
def checkpoint_search(params: dict, ctx: ToolContext) -> dict:
    """Pretends to search checkpoints."""
    record("checkpoint_search", params, ctx)
    hits = [f"{params['query']} result {i}" for i in range(int(params.get("top_k", 3)))]
    return {"content": " ".join(hits), "count": len(hits)}


@tool("context_fold")
def context_fold(params: dict, ctx: ToolContext) -> dict:
    """Pretends to fold content."""
    record("context_fold", params, ctx)
    content = params["content"]
    size = int(len(content) * float(params.get("target_ratio", 0.5)))
    return {"summary": content[:20], "folded": content[:size]}


def _checkpoint_delete(params: dict, output: Any, ctx: ToolContext) -> None:
    record("checkpoint_delete", params, ctx)


@tool("checkpoint_save", compensate=_checkpoint_delete)
def checkpoint_save(params: dict, ctx: ToolContext) -> dict:
    """Pretends to save a checkpoint."""
    record("checkpoint_save", params, ctx)
    return {"id": f"cp-{ctx.idempotency_key[-8:]}", "tags": params.get("tags", [])}


@tool("checkpoint_delete")
def checkpoint_delete(params: dict, ctx: ToolContext) -> dict:
    """Pretends to delete a checkpoint."""
    record("checkpoint_delete", params, ctx)
    return {"deleted": params.get("id")}


# -- seed 002: start_work ---------------------------------------------------------------

@tool("jira_view_issue")
def jira_view_issue(params: dict, ctx: ToolContext) -> dict:
    """Pretends to read a Jira issue."""
    record("jira_view_issue", params, ctx)
    return {"key": params["issue_key"], "type": "Story", "summary": "Add billing export"}


@tool("git_branch_exists")
def git_branch_exists(params: dict, ctx: ToolContext) -> str:
    """Pretends to check for a branch; says no."""
    record("git_branch_exists", params, ctx)
    return f"branch {params['branch']} does not exist"


@tool("git_create_branch")
def git_create_branch(params: dict, ctx: ToolContext) -> str:
    """Pretends to create a branch."""
    record("git_create_branch", params, ctx)
    return f"created {params['branch']} from {params['from_branch']}"


@tool("vpn_connect")
def vpn_connect(params: dict, ctx: ToolContext) -> str:
    """Pretends to connect the VPN."""
    record("vpn_connect", params, ctx)
    return "connected"


@tool("kube_login")
def kube_login(params: dict, ctx: ToolContext) -> str:
    """Pretends to log in to a cluster."""
    record("kube_login", params, ctx)
    return "logged in"


@tool("jira_transition")
def jira_transition(params: dict, ctx: ToolContext) -> dict:
    """Pretends to move an issue."""
    record("jira_transition", params, ctx)
    return {"key": params["issue_key"], "status": params["status"]}


# -- recorders for engine tests -----------------------------------------------------------

@tool("act")
def act(params: dict, ctx: ToolContext) -> dict:
    """Records the call; fails when ``fail`` is true (or for the first ``fail_times``)."""
    record("act", params, ctx)
    if params.get("fail") or ctx.attempt <= int(params.get("fail_times", 0)):
        raise ToolError(f"act {ctx.step_id} failed", error_type=params.get("error_type",
                                                                           "ToolError"))
    return {"step": ctx.step_id, "value": params.get("value"), "attempt": ctx.attempt}


@tool("undo")
def undo(params: dict, ctx: ToolContext) -> dict:
    """Records a compensation; fails when ``fail`` is true. With ``kill_once`` set to a
    marker file path, SIGKILLs its own process right after recording, the first time (a
    worker's death in the middle of an undo)."""
    record("undo", params, ctx)
    marker = params.get("kill_once")
    if marker and not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as f:
            f.write(ctx.idempotency_key)
        os.kill(os.getpid(), 9)
    if params.get("fail"):
        raise ToolError("undo failed")
    return {"undone": params.get("what")}


@tool("block")
def block(params: dict, ctx: ToolContext) -> dict:
    """Sleeps in a thread (a blocking tool) and records when it ran."""
    start = time.monotonic()
    time.sleep(float(params.get("seconds", 0.2)))
    record("block", params, ctx, start=start, end=time.monotonic(),
           thread=threading.get_ident())
    return {"step": ctx.step_id}


@tool("linger")
def linger(params: dict, ctx: ToolContext) -> dict:
    """Records that it began, sleeps in a thread (where nothing can stop it) for
    ``seconds``, or until the file ``gate`` exists, then records that it returned."""
    record("linger", params, ctx, phase="began")
    if params.get("gate"):  # until the test opens it: a loaded machine cannot outrun it
        deadline = time.monotonic() + float(params.get("seconds", 60))
        while not os.path.exists(params["gate"]) and time.monotonic() < deadline:
            time.sleep(0.02)
    else:
        time.sleep(float(params.get("seconds", 0.2)))
    record("linger", params, ctx, phase="returned")
    return {"step": ctx.step_id}


@tool("linger_async")
async def linger_async(params: dict, ctx: ToolContext) -> dict:
    """Records that it began, sleeps on the event loop (cancellable), then records that
    it returned."""
    record("linger_async", params, ctx, phase="began")
    await asyncio.sleep(float(params.get("seconds", 0.2)))
    record("linger_async", params, ctx, phase="returned")
    return {"step": ctx.step_id}


@tool("effect")
def effect(params: dict, ctx: ToolContext) -> dict:
    """Records a side effect; fails when ``fail`` is true; with ``kill_once`` set to a marker
    file path, SIGKILLs its own process right after the effect the first time (a crash
    between a tool's effect and its recorded completion)."""
    record("effect", params, ctx)
    marker = params.get("kill_once")
    if marker and not os.path.exists(marker):
        with open(marker, "w", encoding="utf-8") as f:
            f.write(ctx.idempotency_key)
        os.kill(os.getpid(), 9)
    if params.get("fail"):
        raise ToolError(f"effect {ctx.step_id} failed", retryable=False)
    return {"step": ctx.step_id, "value": params.get("value")}


@tool("suicide")
def suicide(params: dict, ctx: ToolContext) -> None:
    """Records the call, then SIGKILLs its own process, every time."""
    record("suicide", params, ctx)
    os.kill(os.getpid(), 9)


@tool("surrogate")
def surrogate(params: dict, ctx: ToolContext) -> dict:
    """Answers text no UTF-8 can hold (a lone surrogate, as ``json.loads('"\\ud800"')``
    gives), as a broken HTTP service can."""
    record("surrogate", params, ctx)
    return {"text": "a\ud800b", "\udc00key": 1}
