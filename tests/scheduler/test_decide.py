"""``scheduler.decide`` as tables: a plan and the events recorded so far -> the actions.

No store and no executor: each case begins a run in memory, applies recorded events
through the aggregate's commands, and compares what the scheduler decides.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from saga import scheduler
from saga.composition import compile_any
from saga.domain import Run, child_run_id
from saga.scheduler import (
    CompensateStep,
    CompleteStep,
    FailStep,
    FinishRun,
    RequestApproval,
    SkipStep,
    StartCompensation,
    StartLoop,
    StartStep,
)

Event = Callable[[Run], None]


def chain(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "t", "steps": list(steps), **extra}


def started(step: str, attempt: int = 1, params: Any = None, it: int = 0) -> Event:
    return lambda r: r.start_step(step, it, attempt, params if params is not None else {})


def done(step: str, output: Any = None, attempt: int = 1, it: int = 0) -> Event:
    return lambda r: r.complete_step(step, it, attempt, output, 1)


def failed(step: str, retry_at: str | None = None, attempt: int = 1) -> Event:
    return lambda r: r.fail_step(step, 0, attempt, "ToolError", "boom", retry_at is not None,
                                 retry_at)


def decided(definition: dict[str, Any], events: list[Event],
            inputs: dict[str, Any] | None = None) -> list[scheduler.Action]:
    plan = compile_any(definition)
    run = Run.begin(plan.record(), plan.digest(), inputs or {},
                    {"actor": "t", "mode": "normal"}, {},
                    run_id="00000000-0000-0000-0000-000000000001")
    for event in events:
        event(run)
    return scheduler.decide(plan, run)


A = {"id": "a", "tool": "echo", "parameters": {"x": "{{ inputs.x }}"}}
B = {"id": "b", "tool": "echo", "parameters": {"y": "{{ a.x }}"}}
UNDO_A = dict(A, compensate={"tool": "echo", "parameters": {"undo": "{{ output.x }}"}})
FAILS = {"id": "b", "tool": "fail"}

CASES: list[tuple[str, dict[str, Any], list[Event], list[scheduler.Action]]] = [
    ("a new run starts its first step with rendered parameters",
     chain(A, B), [], [StartStep("a", 0, 1, {"x": 7})]),
    ("list order: the second step waits for the first",
     chain(A, B), [started("a", params={"x": 7})], []),
    ("the second step sees the first's recorded output",
     chain(A, B), [started("a"), done("a", {"x": 7})], [StartStep("b", 0, 1, {"y": 7})]),
    ("roots of an explicit graph start together",
     chain(dict(A, depends_on=[]), dict(B, id="c", parameters={}, depends_on=[])), [],
     [StartStep("a", 0, 1, {"x": 7}), StartStep("c", 0, 1, {})]),
    ("max_concurrency bounds what starts",
     chain(dict(A, depends_on=[]), dict(B, id="c", parameters={}, depends_on=[]),
           max_concurrency=1), [], [StartStep("a", 0, 1, {"x": 7})]),
    ("a false condition skips (and does not cascade)",
     chain(dict(A, when="inputs.x > 10"), B), [],
     [SkipStep("a", 0, "condition false")]),
    ("everything done: the run completes with outputs by output key",
     chain(A), [started("a"), done("a", {"x": 7})], [FinishRun("completed", {"a": {"x": 7}})]),
    ("a pending retry starts the next attempt not before its time",
     chain(A), [started("a"), failed("a", retry_at="2030-01-01T00:00:00+00:00")],
     [StartStep("a", 0, 2, {}, not_before="2030-01-01T00:00:00+00:00")]),
    ("a failure with nothing to undo fails the run",
     chain(A, FAILS), [started("a"), done("a", {"x": 7}), started("b"), failed("b")],
     [FinishRun("failed", {"a": {"x": 7}}, {"type": "ToolError", "message": "boom",
                                             "step": "b"}, "b")]),
    ("a failure after a step with a compensation rolls back",
     chain(UNDO_A, FAILS), [started("a"), done("a", {"x": 7}), started("b"), failed("b")],
     [StartCompensation("step 'b' failed: boom", ["a"])]),
    ("a compensating run undoes with the recorded output",
     chain(UNDO_A, FAILS), [started("a"), done("a", {"x": 7}), started("b"), failed("b"),
                            lambda r: r.start_compensation("step 'b' failed: boom", ["a"])],
     [CompensateStep("a", 0, "echo", {"undo": 7})]),
    ("every compensation done: the run ends compensated",
     chain(UNDO_A, FAILS), [started("a"), done("a", {"x": 7}), started("b"), failed("b"),
                            lambda r: r.start_compensation("step 'b' failed: boom", ["a"]),
                            lambda r: r.compensated("a", 0, None)],
     [FinishRun("compensated", {"a": {"x": 7}},
                {"type": "ToolError", "message": "boom", "step": "b"}, "b")]),
    ("a confirmation asks before the step runs",
     chain(dict(A, confirm="Ship {{ inputs.x }}?")), [], [RequestApproval("a", "Ship 7?")]),
    ("a run waiting for approval decides nothing",
     chain(dict(A, confirm=True)), [lambda r: r.request_approval("a", "go?")], []),
    ("a rejection fails the step",
     chain(dict(A, confirm=True)), [lambda r: r.request_approval("a", "go?"),
                                    lambda r: r.decide_approval("a", False, "bob", "no")],
     [FailStep("a", 0, 1, "ApprovalRejected", "rejected by bob: no")]),
    ("a for-each step records its items first",
     chain({"id": "l", "tool": "echo", "loop": "{{ inputs.items }}",
            "parameters": {"v": "{{ item }}"}}), [],
     [StartLoop("l", [1, 2])]),
    ("then starts its iterations, 1-based",
     chain({"id": "l", "tool": "echo", "loop": "{{ inputs.items }}",
            "parameters": {"v": "{{ item }}"}}), [started("l", params={"items": [1, 2]})],
     [StartStep("l", 1, 1, {"v": 1}), StartStep("l", 2, 1, {"v": 2})]),
    ("and completes with their outputs in item order",
     chain({"id": "l", "tool": "echo", "loop": "{{ inputs.items }}",
            "parameters": {"v": "{{ item }}"}}),
     [started("l", params={"items": [1, 2]}), started("l", params={"v": 1}, it=1),
      started("l", params={"v": 2}, it=2), done("l", "two", it=2), done("l", "one", it=1)],
     [CompleteStep("l", 0, ["one", "two"])]),
    ("a nested composition gets a child run id derived from its parent",
     chain({"id": "n", "use": "quickstart", "parameters": {}}), [],
     [StartStep("n", 0, 1, {"use": "quickstart", "inputs": {},
                            "run": child_run_id("00000000-0000-0000-0000-000000000001",
                                                "n", 0)})]),
]


@pytest.mark.parametrize(("definition", "events", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(definition: dict[str, Any], events: list[Event],
                expected: list[scheduler.Action]) -> None:
    assert decided(definition, events, {"x": 7, "items": [1, 2]}) == expected


GRAPH = {"id": "g", "name": "g", "entry_point": "a", "nodes": [
    {"id": "a", "type": "task", "task_config": {"role": "echo"}},
    {"id": "b", "type": "branch", "branch_config": {
        "condition": {"field": "ok", "operator": "==", "value": True},
        "on_true": "yes", "on_false": "no"}},
    {"id": "yes", "type": "task", "task_config": {"role": "echo", "task_template": "Y {input}"}},
    {"id": "no", "type": "task", "task_config": {"role": "echo"}}],
    "edges": [{"id": "e1", "source": "a", "target": "b"},
              {"id": "e2", "source": "b", "target": "yes"},
              {"id": "e3", "source": "b", "target": "no"}]}


def test_graph_entry_starts_with_the_run_input() -> None:
    assert decided(GRAPH, [], {"input": "hi"}) == [StartStep("a", 0, 1, {"task": "hi"})]


def test_graph_branch_decides_once_its_input_completed() -> None:
    events = [started("a"), done("a", {"ok": True})]
    assert decided(GRAPH, events, {"input": "hi"}) == [CompleteStep("b", 0, {
        "branch_outcome": "on_true", "target": "yes", "iteration": 0, "input": {"ok": True}})]


def test_graph_the_branch_not_taken_is_skipped_first_then_the_other_starts() -> None:
    chose = [started("a"), done("a", {"ok": True}),
             lambda r: r.complete_step("b", 0, 1, {"branch_outcome": "on_true",
                                                    "target": "yes", "iteration": 0,
                                                    "input": {"ok": True}}, 0)]
    skip = SkipStep("no", 0, "no incoming edge can fire: edge e3: branch 'b' chose 'yes'")
    # One structural decision at a time: the skip, then (with it recorded) the start.
    assert decided(GRAPH, chose, {"input": "hi"}) == [skip]
    skipped = [*chose, lambda r: r.skip_step("no", 0, skip.reason)]
    assert decided(GRAPH, skipped, {"input": "hi"}) == [
        StartStep("yes", 0, 1, {"task": 'Y {"ok": true}'})]


def test_an_ending_is_not_compared_with_an_event_of_another_kind() -> None:
    """Replay compares each recorded event with the expected actions; an ending against
    a StepStarted (which has no outputs) used to raise AttributeError (found by fuzzing)."""
    started = SimpleNamespace(step_id="b", attempt=1, iteration=0, parameters={})
    assert not FinishRun("failed").matches("StepStarted", started)
