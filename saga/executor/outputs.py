"""What becomes of a call's output before it is recorded: undo state is kept out of the
log, and a completed call may be reused from the tool-result cache.

A tool returns what it needs only to undo a call under ``"_undo"``
(:data:`saga.tools.UNDO`); a step with ``secret_outputs: true`` has its whole output kept
out of the log. Either way :func:`keep` stores it in the undo store
(:mod:`saga.store.undo`) before the step's completion is recorded, and the log records a
reference with a salted hash in its place; :func:`restore` reads it back, checked, for
the tool's own compensation. Concealment of secrets (:mod:`saga.secrets`) has already
been applied to the output, undo state included.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from saga.composition.definition import Step
from saga.domain import step_key
from saga.domain.revisions import key_of
from saga.errors import SagaError
from saga.scheduler import StartStep
from saga.secrets import names_in
from saga.tools import UNDO

if TYPE_CHECKING:
    from saga.executor.drive import Drive

log = logging.getLogger("saga.executor")

#: What the log records for the output of a ``secret_outputs`` step (with the reference).
SECRET = "_secret_output"


# -- undo state ----------------------------------------------------------------------------

async def keep(drive: Drive, step: Step, action: StartStep, output: Any) -> Any:
    """The output as the log records it: its undo state (with ``secret_outputs``, all of
    it) stored in the undo store, and a reference ``{"ref", "sha256"}`` in its place."""
    if step.secret_outputs:
        recorded, state = {SECRET: True}, output
    elif isinstance(output, dict) and UNDO in output:
        recorded = {k: v for k, v in output.items() if k != UNDO}
        state = output[UNDO]
        if state is None:
            return recorded
    else:
        return output
    run_id = drive.run.run_id

    def put() -> dict[str, str]:
        return drive.x.undo_store.put(
            run_id, step_key(action.step_id, action.iteration),
            key_of(drive.run, action.step_id, action.iteration), action.attempt, state)
    return {**recorded, UNDO: await drive._in_thread(put)}


def reference(recorded: Any) -> dict[str, Any] | None:
    """The undo store reference a recorded output holds, or None."""
    ref = recorded.get(UNDO) if isinstance(recorded, dict) else None
    return ref if isinstance(ref, dict) and set(ref) == {"ref", "sha256"} else None


async def restore(drive: Drive, recorded: Any) -> Any:
    """A recorded output as the step's tool returned it, for its own compensation: the
    undo state read back from the undo store, or a ToolError (recorded as the
    compensation's failure) when it is missing, unreadable or not what the step recorded."""
    ref = reference(recorded)
    if ref is None:
        return recorded
    state = await drive._in_thread(lambda: drive.x.undo_store.get(ref))
    if recorded.get(SECRET) is True:
        return state
    return {**recorded, UNDO: state}


def drop(output: Any, secret: bool = False) -> Any:
    """A compensation's or remedy's output as the log records it: without undo state
    (nothing undoes an undo); for a ``secret_outputs`` step, only the marker."""
    if secret:
        return {SECRET: True}
    if isinstance(output, dict) and UNDO in output:
        return {k: v for k, v in output.items() if k != UNDO}
    return output


# -- the tool-result cache -----------------------------------------------------------------

def cacheable(drive: Drive, step: Step, action: StartStep) -> bool:
    """Whether a step's call may be answered from, and stored in, the cache. A call with
    secrets is never cached (its key would not see the values), nor a secret output."""
    return (step.cache is not None and drive.x.cache is not None and step.tool is not None
            and not step.secret_outputs and not names_in(action.parameters))


def cached(drive: Drive, step: Step, action: StartStep) -> dict[str, Any] | None:
    """A live cache entry for this call that its run really recorded, or None."""
    if not cacheable(drive, step, action):
        return None
    assert drive.x.cache is not None and step.tool is not None
    hit = drive.x.cache.get(step.tool, action.parameters)
    if hit is None or not _recorded(drive, hit):
        return None
    hit["hit"] = True
    return hit


def _recorded(drive: Drive, hit: dict[str, Any]) -> bool:
    """A cache entry is reused only when the run it names recorded that very output
    (its events are chained): an edited cache row is a miss, never an answer."""
    try:
        source = drive.x.app.get_run(hit["run_id"])
    except SagaError:
        source = None
    found = source is not None and any(
        s["step_id"] == hit["step_id"] and s["status"] in ("completed", "compensated")
        and s["output"] == hit["output"] for s in source.steps.values())
    if not found:
        log.warning("ignoring cache entry %s: run %s recorded no such output",
                    hit.get("key"), hit.get("run_id"))
    return found


def remember(drive: Drive, step: Step, action: StartStep, output: Any) -> None:
    """Cache a recorded output (never one that refers to undo state of this run)."""
    if cacheable(drive, step, action) and reference(output) is None:
        assert drive.x.cache is not None and step.tool is not None and step.cache
        drive.x.cache.put(step.tool, action.parameters, output, drive.run.run_id,
                          action.step_id, step.cache)
