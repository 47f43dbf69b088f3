"""What a worker's index follows of the pools runs wait for (see
:mod:`saga.executor.pools`).

Each followed run keeps the pools its recorded ``StepAwaitingPool`` waits name, by step
execution (an undo's key prefixed ``undo:``), until the step starts (or its undo does),
or something other than a drive's own step moves happens to the run (a command, a
decision, a signal, a takeover): then any worker may look at it again, and the one that
drives it records the waits that still hold. A run whose waits name none of a worker's
pools is not claimed by that worker (:meth:`saga.worker.index.RunIndex._place`); one
waiting for a pool it serves is tried again soon after a claim finds it held
(:data:`POOL_RECHECK`), since the worker that records the waits gives the run up with
them (at once, or on stores that cannot, a moment after).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from saga.domain import step_key

#: A run waiting for a pool this worker serves, found held by another worker, is tried
#: again this soon (seconds): its holder gives it up as it records the wait.
POOL_RECHECK = 0.5
#: The events that start a step execution, or its undo, that a wait names.
_STARTS = frozenset({"StepStarted", "StepSkipped"})
_UNDOS = frozenset({"StepCompensationStarted", "StepCompensated", "CompensationFailed"})

Serves = Callable[[str | None], bool]


def follow(waits: dict[str, str | None], kind: str, payload: Callable[[], dict[str, Any]],
           quiet: frozenset[str]) -> None:
    """Keep a run's pool ``waits`` up to date with one of its events (``kind``; its
    ``payload`` read only when needed; ``quiet``: the events a drive records of its own
    steps, which leave the other waits as they are)."""
    if kind == "StepAwaitingPool":
        data = payload()
        key = step_key(str(data.get("step_id")), int(data.get("iteration") or 0))
        waits["undo:" + key if data.get("compensation") else key] = data.get("pool")
    elif not waits:
        return
    elif kind in _STARTS or kind in _UNDOS:
        data = payload()
        key = step_key(str(data.get("step_id")), int(data.get("iteration") or 0))
        waits.pop("undo:" + key if kind in _UNDOS else key, None)
    elif kind not in quiet:
        waits.clear()  # news: whoever drives it next records the waits that still hold


def served(waits: dict[str, str | None], serves: Serves | None) -> bool | None:
    """Whether a worker serving ``serves`` runs a step these waits are for (None: the
    run waits for no pool, or the index follows for no worker)."""
    if not waits or serves is None:
        return None
    return any(serves(pool) for pool in waits.values())
