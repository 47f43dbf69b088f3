"""The conformance simulator's check of heartbeats (issue 42): the **heartbeat** invariant.

Every call of the simulator's tools (:mod:`tests.conformance.tools`) beats
``{"attempt", "slept"}`` as it starts and while it works, and its ledger line keeps what
it was handed as ``ctx.last_heartbeat`` (``resumed``). Over kills, zombies, pauses,
cancels, takeovers and redrives, the log and the ledger must agree that:

- an attempt's ``HeartbeatRecorded`` is recorded at most once, before that attempt's
  end (its ``StepCompleted`` or ``StepFailed``, the ``Interrupted`` a takeover records
  included) and with no later start of its step between; and its details are that
  attempt's own (an abandoned call still beating in its thread never passes its beats
  to the attempt after it);
- an attempt whose tool returned or raised (``StepCompleted``, or a ``ToolError``) has
  its ``HeartbeatRecorded``: the tool beat before it answered;
- each call is handed as ``ctx.last_heartbeat`` exactly the details the log recorded
  last for an earlier attempt of its step execution before the call's ``StepStarted``
  (None when none was): a retry after a kill resumes from the log, not from memory.
"""

from __future__ import annotations

from typing import Any

Execution = tuple[str, str, int]  # (run id, step id, iteration)


def check(histories: dict[str, list[dict[str, Any]]],
          ledger: list[dict[str, Any]]) -> list[str]:
    """The heartbeat invariant's violations (see the module's docs)."""
    bad: list[str] = []
    handed: dict[tuple[str, int], Any] = {}  # (key, attempt) -> what its start would hand
    for run_id, h in histories.items():
        bad += _order(run_id, h, handed)
    for c in ledger:
        if c["kind"] != "call" or c["run"] not in histories or "resumed" not in c:
            continue
        at = (c["key"], c["attempt"])
        if at in handed and c["resumed"] != handed[at]:
            bad.append(f"heartbeat: {c['key']} attempt {c['attempt']} (pid {c['pid']}) was "
                       f"handed last_heartbeat {c['resumed']!r}, but the log's last before "
                       f"its start was {handed[at]!r}")
    return bad


def _order(run_id: str, h: list[dict[str, Any]],
           handed: dict[tuple[str, int], Any]) -> list[str]:
    bad: list[str] = []
    last: dict[Execution, dict[str, Any]] = {}  # the latest HeartbeatRecorded payload
    open_beat: dict[Execution, dict[str, Any]] = {}  # recorded, its attempt not ended yet
    recorded: set[tuple[Execution, int]] = set()
    for e in h:
        p, kind = e["payload"], e["type"]
        if kind in ("RunReset", "StepsReopened"):  # reopened steps count attempts anew
            ids = {str(k).split("[")[0] for k in p.get("reopen") or p.get("steps") or []}
            for ex in [*last, *open_beat, *(r[0] for r in recorded)]:
                if ex[1] in ids:
                    last.pop(ex, None)
                    open_beat.pop(ex, None)
                    recorded.difference_update({r for r in recorded if r[0] == ex})
            continue
        if e.get("step_id") is None or "iteration" not in p:
            continue
        ex = (run_id, e["step_id"], int(p["iteration"]))
        where = f"{run_id} {ex[1]}[{ex[2]}] attempt {p.get('attempt')}"
        if kind == "HeartbeatRecorded":
            if (ex, p["attempt"]) in recorded:
                bad.append(f"heartbeat: {where}: HeartbeatRecorded twice")
            if (p.get("details") or {}).get("attempt") not in (None, p["attempt"]):
                bad.append(f"heartbeat: {where}: recorded the beats of attempt "
                           f"{p['details']['attempt']}")
            recorded.add((ex, p["attempt"]))
            open_beat[ex] = p
            last[ex] = p
        elif kind == "StepStarted":
            if ex in open_beat:
                bad.append(f"heartbeat: {where} started before attempt "
                           f"{open_beat[ex]['attempt']}'s HeartbeatRecorded was followed by "
                           "its end")
                open_beat.pop(ex)
            before = last.get(ex)
            handed[(p.get("idempotency_key"), p["attempt"])] = \
                before["details"] if before and before["attempt"] < p["attempt"] else None
        elif kind in ("StepCompleted", "StepFailed"):
            beat = open_beat.pop(ex, None)
            if beat is not None and beat["attempt"] != p["attempt"]:
                bad.append(f"heartbeat: {where} ended after attempt {beat['attempt']}'s "
                           "HeartbeatRecorded")
            if _answered(kind, ex, p) and (ex, p["attempt"]) not in recorded:
                bad.append(f"heartbeat: {where} answered ({kind}) with no HeartbeatRecorded, "
                           "though its tool beat")
    return bad



def _answered(kind: str, ex: Execution, p: dict[str, Any]) -> bool:
    """Whether an attempt's end is what a simulator tool (they all beat first) answered:
    its output (not a cached one), or the error it raised."""
    if kind == "StepCompleted":
        out = p.get("output")
        return not p.get("cache") and isinstance(out, dict) and out.get("step") == ex[1] \
            and out.get("attempt") == p["attempt"]
    return p.get("error_type") == "ToolError" and \
        str(p.get("message", "")).endswith(f"{ex[1]} failed at attempt {p['attempt']}")
