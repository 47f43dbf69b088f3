"""Tools that beat (``ctx.heartbeat``) for the heartbeat tests (tests/executor/test_heartbeats.py).

``beating`` sends ``{"done": N}`` for N from where the last attempt got to
(``ctx.last_heartbeat``) up to ``count`` beats more, then on the attempts listed in
``hang_on`` stops beating and sleeps ``hang`` seconds (a hung call), and returns where
it resumed from and where it got to.
"""

from __future__ import annotations

import time
from typing import Any

from saga import tool


@tool("beating")
def beating(params: dict[str, Any], ctx: Any) -> dict[str, Any]:
    """Beats {"done": N}, may hang, then says where it resumed from."""
    resumed = ctx.last_heartbeat
    start = int((resumed or {}).get("done", 0))
    for n in range(start + 1, start + 1 + int(params.get("count", 3))):
        ctx.heartbeat({"done": n})
        time.sleep(float(params.get("pause", 0.02)))
    if ctx.attempt in params.get("hang_on", []):
        time.sleep(float(params.get("hang", 60)))
    return {"resumed_from": resumed, "done": start + int(params.get("count", 3)),
            "attempt": ctx.attempt}
