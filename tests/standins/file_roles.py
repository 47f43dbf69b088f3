"""A graph-form role (seed 004) that writes files with the real ``file`` tool.

A task node's only parameter is its rendered ``task`` text, which the ``file`` tool cannot
take as is, so ``write_file`` reads ``"PATH: CONTENT"`` from it and hands the ``file``
tool a ``write``; its undo is the ``file`` tool's own compensation (registered with
``compensate=``, so a composition names none). The file root is the working directory,
the ``file`` tool's default, as in tests/tools/test_file.py. Every undo appends the
parameters it was called with to ``undo_calls.jsonl`` there, so a test sees that a
rollback used the rendered parameters recorded in ``StepStarted``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from saga import ToolContext, tool
from saga.tools import file

FILE = file.make_tool({})
UNDO_LOG = "undo_calls.jsonl"


def _write(params: dict[str, Any]) -> dict[str, Any]:
    path, _, content = str(params["task"]).partition(": ")
    return {"action": "write", "path": path, "content": content}


def _restore(params: dict[str, Any], output: Any, ctx: ToolContext) -> Any:
    with Path(UNDO_LOG).open("a") as log:
        log.write(json.dumps({"step": ctx.step_id, "params": params}) + "\n")
    assert FILE.compensate is not None
    return FILE.compensate(_write(params), output, ctx)


@tool("write_file", compensate=_restore)
def write_file(params: dict[str, Any], ctx: ToolContext) -> Any:
    """Writes ``CONTENT`` to ``PATH`` from a task text ``"PATH: CONTENT"``."""
    return FILE.func(_write(params), ctx)
