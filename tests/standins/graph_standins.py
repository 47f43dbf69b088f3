"""Stand-in roles and gates for the graph form (seed 004): debugger, implementer, reviewer,
test_gate, lint_gate and security_gate.

Every answer is a function of the call's parameters and its iteration only (never of the
clock, the run id or a counter in memory), so a step re-executed after a crash, in another
process, answers the same. Calls are recorded like the other stand-ins (``standins.CALLS``
and ``SAGA_TEST_CALL_LOG``).

Two environment variables (inherited by worker subprocesses) make gates fail:

* ``GRAPH_TEST_GATE_FAILURES=N``: ``test_gate`` fails its first N iterations (iteration
  0 .. N-1 of the node), answering ``{"passed": false, "test_status": "failed"}``.
* ``GRAPH_FAILING_GATES=lint_gate,security_gate``: these gates answer ``passed: false``.
"""

from __future__ import annotations

import os
from typing import Any

from saga import ToolContext, ToolError, tool
from tests.standins.standins import record


def _short(text: Any, limit: int = 60) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


@tool("debugger")
def debugger(params: dict, ctx: ToolContext) -> dict:
    """Pretends to analyse a bug."""
    record("debugger", params, ctx)
    return {"analysis": f"cause found in pass {ctx.iteration}", "task": _short(params["task"])}


@tool("implementer")
def implementer(params: dict, ctx: ToolContext) -> dict:
    """Pretends to change code; a task containing "[flaky]" fails its first attempt."""
    record("implementer", params, ctx)
    if "[flaky]" in params["task"] and ctx.attempt == 1:
        raise ToolError("flaky implementer", error_type="Flaky")
    return {"change": f"{ctx.step_id}-{ctx.iteration}", "task": _short(params["task"])}


@tool("reviewer")
def reviewer(params: dict, ctx: ToolContext) -> dict:
    """Pretends to review; always content."""
    record("reviewer", params, ctx)
    return {"verdict": "lgtm", "task": _short(params["task"], 200)}


@tool("test_gate")
def test_gate(params: dict, ctx: ToolContext) -> dict:
    """Runs the "tests": fails while the node's iteration is below GRAPH_TEST_GATE_FAILURES."""
    record("test_gate", params, ctx)
    passed = ctx.iteration >= int(os.environ.get("GRAPH_TEST_GATE_FAILURES", "0"))
    return {"passed": passed, "test_status": "passed" if passed else "failed", "tests": 12}


def _named_gate(name: str, extra: dict[str, Any]) -> Any:
    def gate(params: dict, ctx: ToolContext) -> dict:
        record(name, params, ctx)
        failing = os.environ.get("GRAPH_FAILING_GATES", "").split(",")
        return {"passed": name not in failing, **extra}
    gate.__doc__ = f"Pretends to run the {name}; fails when named in GRAPH_FAILING_GATES."
    return tool(name)(gate)


lint_gate = _named_gate("lint_gate", {"warnings": 0})
security_gate = _named_gate("security_gate", {"findings": []})
