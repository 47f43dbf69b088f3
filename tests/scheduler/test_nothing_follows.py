"""``scheduler.nothing_follows`` as a table: which decisions the executor does not decide
again after. That doing so changes nothing a run records or launches is checked on the
real executor, against deciding until nothing changes, in
``tests/executor/test_advance.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from saga import scheduler
from saga.composition import compile_any
from saga.scheduler import RequestApproval, SkipStep, StartLoop, StartStep

STEPS = {"name": "t", "steps": [
    {"id": "tool", "tool": "echo"},
    {"id": "compute", "compute": "result = 1"},
    {"id": "loop", "tool": "echo", "loop": [1, 2]},
    {"id": "sleep", "sleep": 5},
    {"id": "signal", "signal": "go", "timeout": 30}]}
GRAPH = {"id": "g", "name": "g", "entry_point": "a", "nodes": [
    {"id": "a", "type": "task", "task_config": {"role": "echo"}}], "edges": []}


def start(step_id: str, iteration: int = 0, attempt: int = 1,
          not_before: str | None = None) -> StartStep:
    return StartStep(step_id, iteration, attempt, {}, not_before)


@pytest.mark.parametrize(("actions", "decided_again"), [
    ([start("tool")], False),
    ([start("tool"), start("compute")], False),
    ([start("loop", iteration=1), start("loop", iteration=2)], False),  # iterations
    ([start("tool", attempt=2, not_before="2026-01-01T00:00:00+00:00")], False),  # a retry
    ([start("sleep")], True),  # the executor's look at the waits times it
    ([start("signal")], True),  # a signal already received completes it
    ([start("tool"), start("sleep")], True),
    ([StartLoop("loop", [1, 2])], True),  # its iterations start next
    ([SkipStep("tool", 0, "condition false")], True),  # may ready a dependent
    ([start("tool"), RequestApproval("compute", "ok?")], True),
    ([], True),  # nothing recorded: the executor's own check ends the loop
], ids=["tool", "tool and compute", "loop iterations", "retry", "sleep", "signal",
        "with a sleep", "loop start", "skip", "with an approval", "nothing"])
def test_which_decisions_are_decided_again(actions: list[Any], decided_again: bool) -> None:
    assert scheduler.nothing_follows(compile_any(STEPS), actions) is not decided_again


def test_a_graph_is_always_decided_again() -> None:
    assert scheduler.nothing_follows(compile_any(GRAPH), [start("a")]) is False
