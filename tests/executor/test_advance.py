"""``Drive._advance`` decides once after a decision that only starts plain steps
(``scheduler.nothing_follows``): it must record and launch exactly what deciding until
nothing changes (the loop before) recorded and launched.

A differential check on the real ``Drive``: from each state a generated run reaches, the
same advance runs twice, once as before (``nothing_follows`` always false) on a copy of
the run, once as now, and the events recorded, the calls launched and the timers and
wakes set must be the same. The runs are step lists with loops, repeats, conditions
(literal and reading an upstream output), approvals (per step and by ``confirmations``
with a timeout), retries (``retry_count``, ``on_error: retry:N``, ``max_retries``),
``on_error`` continue and compensate, compensations, auto-heal, sleeps, signal waits,
compute steps, layers and eco mode, list order with parallel groups, run deadlines,
failure strategies and concurrency limits; between advances a hypothesis draw returns a
call, answers an approval, sends a signal, moves the clock, pauses or unpauses the run,
ends the drive (a worker picks the run up later) or takes the run over.
"""

from __future__ import annotations

import copy
import re
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga import scheduler
from saga.composition import compile_any
from saga.domain import Run
from saga.executor.calls import Outcome
from saga.executor.drive import Drive

KINDS = ["plain", "plain", "plain", "loop", "empty_loop", "repeat", "when", "when_upstream",
         "retry", "retry_n", "continue", "compensate_on_error", "confirm", "compensate",
         "sleep", "signal", "compute", "heal", "templated", "idempotent", "fail_interrupted",
         "compensate_interrupted"]


@st.composite
def compositions(draw: st.DrawFn) -> dict[str, Any]:
    """A step list of 2-6 steps, each of one kind, with dependencies or in list order."""
    count = draw(st.integers(2, 6))
    explicit = draw(st.booleans())
    steps: list[dict[str, Any]] = []
    for i in range(count):
        step: dict[str, Any] = {"id": f"s{i}", "tool": "echo", "args": {"n": i}}
        earlier = [f"s{j}" for j in range(i)]
        if explicit:
            step["depends_on"] = draw(st.lists(st.sampled_from(earlier), unique=True,
                                               max_size=2)) if earlier else []
        else:
            group = draw(st.sampled_from([None, None, 1, 2]))
            if group is not None:
                step["parallel_group"] = group
        if draw(st.integers(0, 5)) == 0:
            step["layer"] = draw(st.sampled_from(["enhancement", "execution"]))
        kind = draw(st.sampled_from(KINDS))
        upstream = earlier[-1] if earlier else None
        if kind in ("when_upstream", "templated") and upstream:
            if explicit and upstream not in step["depends_on"]:
                step["depends_on"].append(upstream)
            step.pop("parallel_group", None)
            if kind == "when_upstream":
                step["when"] = f"not steps.{upstream} or steps.{upstream}.n == 0"
            else:
                step["args"] = {"v": "{{ steps." + upstream + " }}"}
        elif kind == "loop":
            step["loop"] = list(range(draw(st.integers(1, 3))))
            step["loop_concurrency"] = draw(st.integers(1, 3))
        elif kind == "empty_loop":
            step["loop"] = []
        elif kind == "repeat":
            step["until"] = "output.n == 99"  # never: it runs max_iterations times
            step["max_iterations"] = draw(st.integers(1, 3))
        elif kind == "when":
            step["when"] = draw(st.sampled_from(["true", "false"]))
        elif kind == "retry":
            step["retry_count"] = draw(st.integers(1, 2))
        elif kind == "retry_n":
            step["on_error"] = "retry:1"
        elif kind == "continue":
            step["on_error"] = "continue"
        elif kind == "compensate_on_error":
            step["on_error"] = "compensate"
        elif kind == "confirm":
            step["confirm"] = True
        elif kind == "compensate":
            step["compensate"] = {"tool": "echo", "args": {"undo": i}}
        elif kind == "sleep":
            del step["tool"], step["args"]
            step["sleep"] = draw(st.sampled_from([1, 5, 100]))
        elif kind == "signal":
            del step["tool"], step["args"]
            step.update(signal="go", timeout=draw(st.sampled_from([1, 30, 100])))
        elif kind == "compute":
            del step["tool"], step["args"]
            step["compute"] = "result = 1"
        elif kind == "heal":
            step["heal"] = [{"when": "true", "do": [{"tool": "echo", "args": {"fix": 1}}]}]
        elif kind == "idempotent":
            step["idempotent"] = True
        elif kind == "fail_interrupted":
            step["on_interrupt"] = "fail"
        elif kind == "compensate_interrupted":
            step["on_interrupt"] = "compensate"
            step["compensate"] = {"tool": "echo", "args": {"undo": i}}
        steps.append(step)
    definition: dict[str, Any] = {
        "name": "advance", "steps": steps, "max_concurrency": draw(st.integers(1, 3)),
        "error_handling": {
            "failure_strategy": draw(st.sampled_from(
                ["fail_fast", "partial_success", "rollback", "retry"])),
            "rollback_on_failure": draw(st.booleans()),
            "max_retries": draw(st.sampled_from([0, 0, 1]))}}
    confirmable = [s["id"] for s in steps if "tool" in s and "loop" not in s
                   and "until" not in s]
    if confirmable and draw(st.booleans()):
        definition["confirmations"] = [{"step": draw(st.sampled_from(confirmable)),
                                        "message": "ok?", "timeout": "10s",
                                        "default": draw(st.booleans())}]
    return definition


FIELDS = ("step_id", "iteration", "attempt", "parameters", "error_type", "message", "reason",
          "steps", "outputs", "error", "failed_step", "retryable", "next_retry_at", "until",
          "signal", "index", "worker")


def _recorded(events: list[Any]) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """What each event says, without its times (the two advances run a moment apart)."""
    return [(type(e).__name__, tuple(
        (k, re.sub(r"'duration_ms': \d+", "", repr(getattr(e, k))))
        for k in FIELDS if hasattr(e, k))) for e in events]


def _advance_both(drive: Drive) -> list[tuple[str, Any]]:
    """Advance ``drive`` as now, and a copy of it as before; fail on any difference."""
    before = Drive(drive.x, copy.deepcopy(drive.run), drive.plan, None)
    before.timers, before.wakes = set(drive.timers), set(drive.wakes)
    before.remedies, before.compensating = set(drive.remedies), set(drive.compensating)
    now = scheduler.nothing_follows
    scheduler.nothing_follows = lambda plan, actions: False  # type: ignore[assignment]
    try:
        launched_before = before._advance()
    finally:
        scheduler.nothing_follows = now  # type: ignore[assignment]
    launched = drive._advance()
    assert _recorded(drive.run.collect_events()) == _recorded(before.run.collect_events())
    assert [(k, repr(p)) for k, p in launched] == [(k, repr(p)) for k, p in launched_before]
    assert (drive.timers, drive.wakes) == (before.timers, before.wakes)
    return launched


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(definition=compositions(), data=st.data())
def test_one_decision_after_starts_changes_nothing_a_run_records_or_launches(
        definition: dict[str, Any], data: st.DataObject) -> None:
    plan = compile_any(definition)
    mode = data.draw(st.sampled_from(["normal", "normal", "eco"]))
    options = {"timeout": data.draw(st.sampled_from([30, 300]))} \
        if data.draw(st.booleans()) else {}
    run = Run.begin(plan.record(), plan.digest(), {}, {"actor": "t", "mode": mode}, options,
                    run_id="00000000-0000-0000-0000-000000000001")
    run.collect_events()
    clock = [datetime.fromisoformat(run.started_at)]
    x = SimpleNamespace(clock=lambda: clock[0], worker="w", stopping=None, pools=None,
                        hold=data.draw(st.sampled_from([0.0, 3.0, 60.0])))
    drive = Drive(x, run, plan, None)  # type: ignore[arg-type]
    in_flight: list[tuple[str, Any]] = []
    for _ in range(80):
        in_flight += _advance_both(drive)
        if run.is_finished:
            return
        choices: list[tuple[str, Any]] = [("return", i) for i in range(len(in_flight))]
        choices += [("approval", s) for s in run.pending_approvals]
        choices += [("tick", None), ("pick up", None), ("pause", None)]
        if any(plan.step(i).signal for i in plan.order) and len(run.signals) < 3:
            choices.append(("signal", None))
        if any(s["status"] == "running" for s in run.steps.values()):
            choices.append(("take over", None))
        kind, what = data.draw(st.sampled_from(choices))
        if kind == "return":
            _return(drive, in_flight.pop(what), clock, data)
        elif kind == "approval":
            run.decide_approval(what, data.draw(st.booleans()), "t")
        elif kind == "tick":
            clock[0] += timedelta(seconds=data.draw(st.sampled_from([0.5, 2, 11, 40, 120])))
        elif kind == "pick up":  # the drive ended; a worker picks the run up later
            clock[0] += timedelta(seconds=data.draw(st.sampled_from([0, 5, 200])))
            in_flight = [c for c in in_flight if c[0] in ("step", "compensation", "remedy")]
            drive = Drive(x, run, plan, None)  # type: ignore[arg-type]
            drive.compensating = {f"{p.step_id}:{p.iteration}" for k, p in in_flight
                                  if k == "compensation"}
            drive.remedies = {("remedy", p.step_id, p.iteration, p.index)
                              for k, p in in_flight if k == "remedy"}
        elif kind == "signal":
            run.receive_signal("go", {"n": len(run.signals)}, "t")
        elif kind == "pause":
            if run.paused:
                run.unpause("t")
            else:
                run.pause("t")
        else:  # another worker takes the run over: the calls in flight are lost
            in_flight = []
            drive = Drive(x, run, plan, None)  # type: ignore[arg-type]
            if scheduler.interrupted(plan, run):
                run.take_over("w2")
                for action in scheduler.interrupted(plan, run):
                    drive._apply(action)


def _return(drive: Drive, call: tuple[str, Any], clock: list[datetime],
            data: st.DataObject) -> None:
    """One launched call returns (a timer or a wake after its delay), as its outcome."""
    kind, payload = call
    if kind in ("wake", "timer"):
        what, delay = payload
        clock[0] += timedelta(seconds=delay)
        drive._record(Outcome("wake", what, 0, 0) if kind == "wake" else
                      Outcome("timer", what.step_id, what.iteration, what.attempt))
        return
    ok = data.draw(st.booleans())
    if kind == "remedy":
        drive._record(Outcome("remedy", payload.step_id, payload.iteration, payload.index,
                              ok=ok))
        return
    attempt = 1 if kind == "compensation" else payload.attempt
    drive._record(Outcome(kind, payload.step_id, payload.iteration, attempt, ok=ok,
                          output={"n": 0} if ok else None,
                          error_type="" if ok else "ToolError", message="boom"))
