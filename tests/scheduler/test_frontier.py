"""The indexes a decision reads instead of the whole run (``Run.unsettled``,
``Run.touched``, the scheduler's ``frontier``) against brute force, after arbitrary event
sequences: kept by the events, rebuilt identically from a snapshot, and giving the very
decisions a scan of every step gives."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from saga import scheduler
from saga.composition import Plan, compile_any
from saga.domain import Run
from saga.domain.steps import DERIVED, SETTLED
from saga.scheduler import step_list
from saga.store.application import snapshot_due

OPS = ("start", "complete", "fail", "retryable", "skip", "wait", "iteration", "retry")


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    """A composition of 1 to 8 steps, each waiting for some earlier ones."""
    n = draw(st.integers(1, 8))
    steps: list[dict[str, Any]] = []
    for i in range(n):
        deps = draw(st.lists(st.integers(0, i - 1), unique=True, max_size=3)) if i else []
        step: dict[str, Any] = {"id": f"s{i}", "tool": "noop",
                                "depends_on": [f"s{d}" for d in sorted(deps)]}
        if draw(st.booleans()):
            step["on_error"] = "continue"
        steps.append(step)
    return {"name": "f", "steps": steps, "max_concurrency": draw(st.integers(1, 3))}


def apply(run: Run, op: str, step: str) -> None:
    """Record one event, whatever state the step is in (the aggregate takes it)."""
    state = run.steps.get(step)
    attempt = state["attempt"] if state else 0
    if op == "start":
        run.start_step(step, 0, attempt + 1, {})
    elif op == "complete":
        run.complete_step(step, 0, max(attempt, 1), {"v": step}, 1)
    elif op in ("fail", "retryable"):
        retry_at = "2026-01-01T00:00:00+00:00" if op == "retryable" else None
        run.fail_step(step, 0, max(attempt, 1), "ToolError", "boom", retry_at is not None,
                      retry_at)
    elif op == "skip":
        run.skip_step(step, 0, "because")
    elif op == "wait":
        run.wait(step, 0, None, "go")
    elif op == "iteration":
        run.start_step(step, 1, 1, {})
    else:  # redrive what failed or was skipped, as `saga retry` does
        keys = [k for k, s in run.steps.items()
                if s["iteration"] == 0 and s["status"] in ("failed", "skipped")]
        if keys:
            run.retry("t", keys)


def rebuilt(run: Run) -> Run:
    """The run as a snapshot of it loads: without the derived indexes."""
    snapshot = Run.Snapshot.take(run)
    assert not set(DERIVED) & set(snapshot.state)
    loaded: Run = snapshot.mutate(None)
    return loaded


def brute_frontier(plan: Plan, run: Run) -> set[str]:
    return {s for s in plan.steps if s not in run.steps
            and all(d in run.steps for d in plan.dependencies(s))}


def scan_every_step(view: Any) -> list[str]:
    """What a decision looked at before the indexes: every step not settled."""
    return [s for s in view.plan.steps
            if (view.run.steps.get(s) or {"status": "pending"})["status"] not in SETTLED]


def decision(plan: Plan, run: Run) -> Any:
    try:
        return scheduler.decide(plan, run)
    except Exception as e:  # the same failure either way is the same outcome
        return type(e).__name__


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(definitions(), st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7)),
                               max_size=30))
def test_the_indexes_match_brute_force_after_any_events(
        monkeypatch: pytest.MonkeyPatch, definition: dict[str, Any],
        ops: list[tuple[str, int]]) -> None:
    plan = compile_any(definition)
    run = Run.begin(plan.record(), plan.digest(), {}, {"actor": "t"}, {},
                    run_id="00000000-0000-0000-0000-000000000002")
    ids = list(plan.steps)
    for op, index in ops:
        apply(run, op, ids[index % len(ids)])
        assert run.unsettled == {k: s for k, s in run.steps.items()
                                 if s["status"] not in SETTLED}
        assert list(run.unsettled) == [k for k, s in run.steps.items()
                                       if s["status"] not in SETTLED]  # steps order
        assert run.touched == [s["step_id"] for s in run.steps.values()
                               if s["iteration"] == 0]
        assert set(step_list.frontier(plan, run)) == brute_frontier(plan, run)
        fresh = rebuilt(run)
        assert set(step_list.frontier(plan, fresh)) == brute_frontier(plan, fresh)
        assert fresh.waits == run.waits
        incremental = decision(plan, run)
        with monkeypatch.context() as m:
            m.setattr(step_list, "_open_steps", scan_every_step)
            assert decision(plan, rebuilt(run)) == incremental


def test_the_frontier_of_a_long_chain_is_its_next_step() -> None:
    plan = compile_any({"name": "c", "steps": [{"id": f"s{i}", "tool": "noop"}
                                               for i in range(50)]})
    run = Run.begin(plan.record(), plan.digest(), {}, {"actor": "t"}, {})
    for i in range(49):
        assert list(step_list.frontier(plan, run)) == ([f"s{i}"] if i else ["s0"])
        assert scheduler.decide(plan, run) == [scheduler.StartStep(f"s{i}", 0, 1, {})]
        run.start_step(f"s{i}", 0, 1, {})
        run.complete_step(f"s{i}", 0, 1, None, 1)
        assert list(run.unsettled) == []
    assert list(step_list.frontier(plan, run)) == ["s49"]


def test_a_frontier_folded_for_another_plan_is_not_reused() -> None:
    one = compile_any({"name": "c", "steps": [{"id": "a", "tool": "noop"},
                                              {"id": "b", "tool": "noop"}]})
    other = compile_any({"name": "c", "steps": [{"id": "a", "tool": "noop"},
                                                {"id": "b", "tool": "noop",
                                                 "depends_on": []}]})
    run = Run.begin(one.record(), one.digest(), {}, {"actor": "t"}, {})
    assert list(step_list.frontier(one, run)) == ["a"]
    assert set(step_list.frontier(other, run)) == {"a", "b"}


def test_snapshots_thin_out_as_a_run_grows() -> None:
    due = [v for v in range(1, 20_001) if snapshot_due(v, 100)]
    assert due[:32] == [100 * i for i in range(1, 33)]  # a short run: every interval
    assert all(b - a <= max(100, a // 16) for a, b in itertools.pairwise(due))
    assert len(due) < 80  # not 200
    assert not snapshot_due(5, 0)
