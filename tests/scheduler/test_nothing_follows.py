"""``scheduler.nothing_follows``: when it says recording a decision leaves nothing new to
decide, deciding again finds nothing new.

The executor does not decide again after such a decision (the start of plain steps), so
a wrong answer would leave a ready step unstarted until something else happened. Step
lists generated as ``tests/executor/test_advance.py`` generates them (but for auto-heal)
are driven in memory by a stand-in for the executor that records what ``decide``
returns (a retry when it is due, as the executor's timer does) and returns or fails the
calls in flight as hypothesis draws. After every decision that ``nothing_follows``, once
recorded, ``decide`` must return nothing but the retries not due yet. What the executor
itself then records and launches is checked against deciding until nothing changes in
``tests/executor/test_advance.py``.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga import scheduler
from saga.composition import compile_any
from saga.domain import Run
from saga.scheduler import CompensateStep, RequestApproval, RunRemedy, StartStep
from tests.executor.test_advance import KINDS as ADVANCE_KINDS
from tests.executor.test_advance import compositions

UNTIL = "2026-01-01T00:00:00+00:00"
#: What the stand-in below performs: every kind but auto-heal (its remedies are calls).
KINDS = [k for k in ADVANCE_KINDS if k != "heal"]


Attempt = tuple[str, int, int]


def _attempt(action: StartStep) -> Attempt:
    return (action.step_id, action.iteration, action.attempt)


def _not_due(action: Any, due: set[Attempt]) -> bool:
    """A retry whose time has not come: the executor sets a timer and records nothing."""
    return isinstance(action, StartStep) and action.not_before is not None \
        and _attempt(action) not in due


def _record(plan: Any, run: Run, actions: list[Any], undoing: list[CompensateStep],
            due: set[Attempt]) -> None:
    """What the executor records for each action (a compensation's call is in flight
    until an outcome below records it, and is not made twice meanwhile)."""
    for action in actions:
        if _not_due(action, due):
            continue
        if isinstance(action, CompensateStep):
            if all((u.step_id, u.iteration) != (action.step_id, action.iteration)
                   for u in undoing):
                undoing.append(action)
        elif isinstance(action, RequestApproval):
            run.request_approval(action.step_id, action.message, None)
        elif isinstance(action, RunRemedy):  # no step here heals
            raise AssertionError(f"unexpected {action}")
        else:
            action.record(run, "w")
        step = plan.step(action.step_id) if isinstance(action, StartStep) else None
        if step is not None and (step.sleep is not None or step.signal is not None):
            run.wait(action.step_id, action.iteration, UNTIL, step.signal)
        if isinstance(action, scheduler.FailStep):
            return  # the executor decides again at once after a failure


@settings(max_examples=600, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(definition=compositions(KINDS), data=st.data())
def test_after_a_decision_nothing_follows_deciding_again_finds_nothing_new(
        definition: dict[str, Any], data: st.DataObject) -> None:
    plan = compile_any(definition)
    run = Run.begin(plan.record(), plan.digest(), {}, {"actor": "t", "mode": "normal"}, {},
                    run_id="00000000-0000-0000-0000-000000000001")
    undoing: list[CompensateStep] = []
    due: set[Attempt] = set()  # retries whose time has come
    for _ in range(200):
        before = (len(run.pending_events), len(undoing))
        actions = scheduler.decide(plan, run)
        _record(plan, run, actions, undoing, due)
        if scheduler.nothing_follows(plan, actions):
            again = [a for a in scheduler.decide(plan, run) if not _not_due(a, due)]
            assert again == [], (definition, actions)
        if before != (len(run.pending_events), len(undoing)):
            continue  # as the executor does: decide again until nothing new
        if run.is_finished:
            break
        # Nothing new to decide: an outcome arrives (a call returns, a person answers).
        running = [s for s in run.steps.values() if s["status"] == "running"
                   and not s.get("wait") and not scheduler.is_loop_parent(plan, s)]
        choices: list[tuple[str, Any]] = [("step", s) for s in running]
        choices += [("undo", u) for u in undoing]
        choices += [("approval", step_id) for step_id in run.pending_approvals]
        choices += [("due", _attempt(a)) for a in scheduler.decide(plan, run)
                    if _not_due(a, due)]
        choices += [("wait", s) for s in run.steps.values()
                    if s["status"] == "running" and s.get("wait")]
        if any(plan.step(i).signal for i in plan.order) and len(run.signals) < 3:
            choices.append(("signal", None))  # sent before or while a step waits
        assert choices, f"stuck: {definition}"
        kind, what = data.draw(st.sampled_from(choices))
        if kind == "undo":
            undoing.remove(what)
            run.compensated(what.step_id, what.iteration, None)
        elif kind == "approval":
            run.decide_approval(what, data.draw(st.booleans()), "t")
        elif kind == "due":  # the executor's timer for a retry fires
            due.add(what)
        elif kind == "signal":
            run.receive_signal("go", {"n": len(run.signals)}, "t")
        elif kind == "wait":  # a sleep ends, or a signal wait times out
            if what["wait"]["signal"] is None:
                run.complete_step(what["step_id"], what["iteration"], what["attempt"],
                                  {"slept_until": UNTIL}, 1)
            else:
                run.fail_step(what["step_id"], what["iteration"], what["attempt"],
                              "SignalTimeout", "no signal", False, None)
        elif data.draw(st.booleans()):
            run.complete_step(what["step_id"], what["iteration"], what["attempt"],
                              {"n": 0}, 1)
        else:
            retry = scheduler.retry_decision(plan, what["step_id"], what["attempt"],
                                             "ToolError")
            run.fail_step(what["step_id"], what["iteration"], what["attempt"], "ToolError",
                          "boom", retry, UNTIL if retry else None)
    assert run.is_finished, f"no end in 200 turns: {definition}"
