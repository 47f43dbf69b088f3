"""What a person may ask of a run now: retry, compensate, cancel, pause, unpause, and
approve or reject a waiting step.

One table, two users: :class:`saga.api.Saga` refuses a command with :func:`refusal`'s
reason, and the run's summary lists :func:`allowed` so that a viewer offers only what the
API would accept (a Retry button the API answers 409 to is a lie).
"""

from __future__ import annotations

from saga.domain import Run

#: The run-wide controls, in the order a viewer shows them.
CONTROLS = ("retry", "compensate", "cancel", "pause", "unpause")
#: What a redacted run's inputs read as (saga.audit.REDACTED; equal by value).
_REDACTED = {"_redacted": True}


def refusal(run: Run, control: str) -> str | None:
    """Why ``control`` (one of :data:`CONTROLS`) is refused for ``run`` now, or None when
    it would be accepted."""
    rid, status = run.run_id, run.status
    if run.inputs == _REDACTED:
        return (f"run {rid} was redacted by retention; it can no longer be resumed, retried, "
                "compensated or cancelled")
    if control == "unpause":
        return None if run.paused and not run.is_finished else f"run {rid} is {status}, not paused"
    if control == "retry":
        if status != "failed" or run.compensation is not None:
            return (f"run {rid} is {status}; only a failed run whose steps were not "
                    "compensated can be retried")
        return None
    if control in ("cancel", "compensate"):
        allowed = ("running", "waiting", "paused") if control == "cancel" else (
            "running", "waiting", "paused", "failed", "completed")
        if status not in allowed or (run.compensation is not None and status == "failed"):
            return f"run {rid} is {status}; cannot {control} it"
        return None
    if control == "pause":
        if run.is_finished or run.paused or run.compensation is not None:
            state = "paused" if run.paused else status
            return f"run {rid} is {state}; only a running or waiting run can be paused"
        return None
    raise ValueError(f"unknown control {control!r}")


def allowed(run: Run) -> list[dict[str, str]]:
    """The controls the API would accept for ``run`` now: each ``{"action": name}``, and
    for a step waiting for approval ``approve`` and ``reject`` with its ``step``."""
    found = [{"action": c} for c in CONTROLS if refusal(run, c) is None]
    if not run.is_finished:
        for step in run.pending_approvals:
            found += [{"action": "approve", "step": step}, {"action": "reject", "step": step}]
    return found
