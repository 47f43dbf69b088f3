"""A stand-in tool for resource limit tests: each call appends when it began and ended
(wall-clock time, one JSON line per call) to the file its ``log`` parameter names, so a
test can count how many calls of every worker process overlapped.

``spanned``: ``{"log": PATH, "seconds": S}`` sleeps S seconds between the two lines.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from saga import ToolContext, tool


def _append(path: str, entry: dict[str, Any]) -> None:
    # One write of one line with O_APPEND: processes writing at once never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


@tool("spanned")
def spanned(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Sleeps ``seconds``, logging its start and end to ``log``."""
    key = f"{ctx.run_id}:{ctx.step_id}:{ctx.attempt}"
    _append(params["log"], {"key": key, "pid": os.getpid(), "start": time.time()})
    time.sleep(float(params.get("seconds", 1.0)))
    _append(params["log"], {"key": key, "pid": os.getpid(), "end": time.time()})
    return {"slept": params.get("seconds", 1.0)}
