"""The graph form (seed 004): compiling, validating, and running graphs end to end, on
SQLite and PostgreSQL; every run is replay-verified at teardown (see conftest)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from saga import Saga, diagram, scheduler
from saga.cli import main
from saga.composition import compile_any
from saga.composition.definition import load_file
from saga.composition.graph_form import GraphPlan, compile_graph
from saga.config import Settings
from saga.errors import DefinitionError
from saga.tools import Registry, load_registry
from tests.executor.test_recovery import LEASE, check_history, outcome, recover, store_env
from tests.standins import standins

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "tests" / "seeds"
DEBUG = SEEDS / "004_debug_loop.yaml"
REVIEW = SEEDS / "004_parallel_review.yaml"
CHILD = str(ROOT / "tests" / "compositions" / "child.yaml")
TOOLS = ["tests.standins.standins", "tests.standins.graph_standins"]


@pytest.fixture
def registry() -> Registry:
    """The usual stand-ins plus the roles and gates of seed 004."""
    return load_registry(TOOLS)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    standins.CALLS.clear()
    monkeypatch.delenv("GRAPH_TEST_GATE_FAILURES", raising=False)
    monkeypatch.delenv("GRAPH_FAILING_GATES", raising=False)


def calls(tool: str) -> list[dict[str, Any]]:
    return [c for c in standins.CALLS if c["tool"] == tool]


def started(saga: Saga, run_id: str) -> list[str]:
    """Step keys in the order they were started or decided (completed without a tool)."""
    keys = []
    for e in saga.history(run_id):
        if e["type"] in ("StepStarted", "StepSkipped", "StepCompleted"):
            key = e["step_id"] + (f"[{e['payload']['iteration']}]"
                                  if e["payload"]["iteration"] else "")
            if key not in keys:
                keys.append(key)
    return keys


def graph(nodes: list[dict[str, Any]], edges: list[tuple[str, str] | dict[str, Any]],
          **extra: Any) -> dict[str, Any]:
    """A graph document; edges as (source, target) pairs or full edge objects."""
    full = [e if isinstance(e, dict) else {"source": e[0], "target": e[1]} for e in edges]
    for i, e in enumerate(full):
        e.setdefault("id", f"e{i + 1}")
    return {"id": "g", "name": "g", "entry_point": nodes[0]["id"], "nodes": nodes,
            "edges": full, **extra}


def task(node_id: str, role: str = "implementer", template: str = "{input}",
         **config: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "task",
            "task_config": {"role": role, "task_template": template, **config}}


def gate(node_id: str, kind: str) -> dict[str, Any]:
    return {"id": node_id, "type": "gate", "gate_config": {"gate_type": kind}}


# -- seed 004 as written ------------------------------------------------------------------

def test_the_debug_loop_runs_as_written_until_the_tests_pass(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_TEST_GATE_FAILURES", "2")
    plan = saga.load(DEBUG)
    assert isinstance(plan, GraphPlan)
    run = saga.run(plan, {"input": "login fails on Sundays"})
    assert run.status == "completed", run.error
    assert started(saga, run.run_id) == [
        "analyze", "fix", "test", "check", "analyze[1]", "fix[1]", "test[1]", "check[1]",
        "analyze[2]", "fix[2]", "test[2]", "check[2]", "review"]
    outcomes = [run.steps[k]["output"] for k in ("check", "check[1]", "check[2]")]
    assert [(o["branch_outcome"], o["target"], o["iteration"]) for o in outcomes] == [
        ("on_false", "analyze", 0), ("on_false", "analyze", 1), ("on_true", "review", 2)]
    # {input}: the run input for the entry node; on a loop, also what the branch read.
    tasks = [c["params"]["task"] for c in calls("debugger")]
    assert tasks[0] == "Analyze this issue: login fails on Sundays"
    again = json.loads(tasks[1].removeprefix("Analyze this issue: "))
    assert again == {"input": "login fails on Sundays",
                     "check": {"passed": False, "test_status": "failed", "tests": 12}}
    fix = calls("implementer")[0]["params"]["task"]
    assert fix.startswith('Fix based on analysis: {"analysis": "cause found in pass 0"')
    assert [c["key"].split(":", 1)[1] for c in calls("test_gate")] == [
        "test:0", "test:1", "test:2"]
    review = run.outputs["review"]
    assert review["task"] == 'Review: {"passed": true, "test_status": "passed", "tests": 12}'
    assert run.outputs == {"review": run.steps["review"]["output"]}


def test_the_loop_ends_failed_when_max_iterations_is_reached(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_TEST_GATE_FAILURES", "99")
    run = saga.run(saga.load(DEBUG), {"input": "flaky"})
    assert run.status == "failed"
    # max_iterations: 3 loops back, so the body ran four times; then the branch gives up.
    assert "analyze[3]" in run.steps and "analyze[4]" not in run.steps
    assert run.failed_step == "check[3]"
    assert run.error["type"] == "MaxIterationsReached"
    assert run.error["message"] == ("branch 'check' reached max_iterations (3 loops) and "
                                    "test_status == 'passed' still does not hold")
    assert "review" not in run.steps and not calls("reviewer")
    assert set(run.outputs) == {"analyze", "fix", "test", "check"}


def test_at_max_iterations_a_branch_follows_its_non_loop_on_false(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_TEST_GATE_FAILURES", "99")
    doc = graph([task("work"), gate("test", "test_gate"),
                 {"id": "again", "type": "branch", "branch_config": {
                     "condition": {"field": "test_status", "operator": "==", "value": "failed",
                                   "max_iterations": 2},
                     "on_true": "work", "on_false": "done"}},
                 task("done", "reviewer")],
                [("work", "test"), ("test", "again"),
                 {"source": "again", "target": "work", "is_loop_edge": True},
                 ("again", "done")])
    run = saga.run(saga.load(doc))
    assert run.status == "completed"
    assert run.steps["again[2]"]["output"]["branch_outcome"] == "max_iterations_reached"
    assert run.steps["again[2]"]["output"]["target"] == "done"
    assert [c["key"].rsplit(":", 1)[1] for c in calls("implementer")] == ["0", "1", "2"]
    assert run.outputs["done"]["verdict"] == "lgtm"


def test_the_parallel_review_waits_for_approval_then_merges(saga: Saga) -> None:
    run = saga.run(saga.load(REVIEW), {"input": "billing export"})
    assert run.status == "waiting"
    assert run.pending_approvals == ["review"]
    assert run.approvals["review"]["message"] == \
        "Approve Changes: All gates passed. Review and approve."
    # The join merged the three gate outputs (union).
    assert run.steps["join"]["output"] == {"passed": True, "warnings": 0, "test_status": "passed",
                                           "tests": 12, "findings": []}
    assert calls("implementer")[0]["params"] == {"task": "Implement feature: billing export"}
    assert {c["tool"] for c in standins.CALLS} == {"implementer", "lint_gate", "test_gate",
                                                   "security_gate"}
    saga.approve(run.run_id, "review", actor="alice", comment="ship it")
    run = saga.resume(run.run_id)
    assert run.status == "completed"
    assert run.steps["review"]["output"] == {"approved": True, "actor": "alice",
                                             "comment": "ship it",
                                             "input": run.steps["join"]["output"]}
    assert run.outputs == {"merge": {"change": "merge-0", "task": "Merge approved changes"}}


def test_a_rejection_skips_the_merge(saga: Saga) -> None:
    run = saga.run(saga.load(REVIEW), {"input": "x"})
    saga.reject(run.run_id, "review", actor="bob", comment="no")
    run = saga.resume(run.run_id)
    assert run.status == "completed"
    assert run.steps["review"]["output"]["approved"] is False
    assert run.steps["merge"]["status"] == "skipped"
    assert run.steps["merge"]["reason"] == \
        "no incoming edge can fire: edge e9: condition approved == True is false"
    assert run.outputs == {"merge": None}
    assert len(calls("implementer")) == 1


# -- failures, compensation, skips ----------------------------------------------------------

def review_with_undo(**config: Any) -> dict[str, Any]:
    doc = yaml.safe_load(REVIEW.read_text())
    doc["nodes"][0]["task_config"]["compensate"] = {"tool": "undo",
                                                    "args": {"what": "{{ output.change }}"}}
    doc["config"] = config
    return doc


def test_a_failing_gate_fails_fast_and_compensates(saga: Saga,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_FAILING_GATES", "security_gate")
    run = saga.run(saga.load(review_with_undo()), {"input": "x"})
    assert run.status == "compensated"
    assert run.failed_step == "security"
    assert run.error["type"] == "ExpectationFailed"
    assert [c["params"] for c in calls("undo")] == [{"what": "implement-0"}]
    assert "join" not in run.steps and not run.approvals
    types = [e["type"] for e in saga.history(run.run_id)]
    assert types[-4:] == ["CompensationStarted", "StepCompensationStarted", "StepCompensated",
                          "RunCompensated"]


def test_without_fail_fast_the_rest_runs_and_skips_propagate(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_FAILING_GATES", "lint_gate")
    doc = yaml.safe_load(REVIEW.read_text())
    doc["config"] = {"fail_fast": False}
    plan = saga.load(doc)
    assert plan.definition.error_handling.failure_strategy == "partial_success"
    run = saga.run(plan, {"input": "x"})
    assert run.status == "failed"
    assert run.steps["lint"]["status"] == "failed"
    assert run.steps["test"]["status"] == run.steps["security"]["status"] == "completed"
    assert {k: s.get("reason") for k, s in run.steps.items() if s["status"] == "skipped"} == {
        "join": "edge e5: upstream node 'lint' failed",
        "review": "no incoming edge can fire: edge e8: upstream node 'join' was skipped",
        "merge": "no incoming edge can fire: edge e9: upstream node 'review' was skipped"}
    assert not run.approvals


def test_a_task_retries_by_its_policy_with_the_same_key(saga: Saga) -> None:
    doc = graph([task("a", template="[flaky] {input}",
                      retry={"max_attempts": 2, "delay": 0.01, "jitter": 0})], [])
    run = saga.run(saga.load(doc), {"input": "go"})
    assert run.status == "completed"
    assert [(c["attempt"], c["key"]) for c in calls("implementer")] == [
        (1, f"{run.run_id}:a:0"), (2, f"{run.run_id}:a:0")]
    failed = [e["payload"] for e in saga.history(run.run_id) if e["type"] == "StepFailed"]
    assert [(f["error_type"], f["retryable"]) for f in failed] == [("Flaky", True)]


def test_cancelling_a_waiting_graph_undoes_its_work(saga: Saga) -> None:
    run = saga.run(saga.load(review_with_undo()), {"input": "x"})
    assert run.status == "waiting"
    run = saga.cancel(run.run_id, actor="carol", reason="changed my mind")
    assert run.status == "cancelled"
    assert [c["params"] for c in calls("undo")] == [{"what": "implement-0"}]


def test_a_failed_graph_run_can_be_redriven(saga: Saga,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_FAILING_GATES", "lint_gate")
    run = saga.run(saga.load(REVIEW), {"input": "x"})
    assert run.status == "failed" and run.failed_step == "lint"
    monkeypatch.delenv("GRAPH_FAILING_GATES")
    run = saga.retry(run.run_id, actor="dave")
    assert run.status == "waiting" and run.steps["lint"]["attempt"] == 2
    saga.approve(run.run_id, "review", actor="alice")
    assert saga.resume(run.run_id).status == "completed"


def test_a_human_inside_a_loop_is_asked_again_each_iteration(saga: Saga) -> None:
    doc = graph([task("draft"), {"id": "ok", "type": "human", "human_config": {"title": "OK?"}},
                 {"id": "check", "type": "branch", "branch_config": {
                     "condition": {"field": "approved", "operator": "==", "value": True},
                     "on_true": "publish", "on_false": "draft"}},
                 task("publish", "reviewer")],
                [("draft", "ok"), ("ok", "check"),
                 {"source": "check", "target": "draft", "is_loop_edge": True},
                 ("check", "publish")])
    run = saga.run(saga.load(doc), {"input": "post"})
    assert run.pending_approvals == ["ok"]
    saga.reject(run.run_id, "ok", actor="eve", comment="too long")
    run = saga.resume(run.run_id)
    assert run.pending_approvals == ["ok[1]"]
    assert run.steps["check"]["output"]["branch_outcome"] == "on_false"
    saga.approve(run.run_id, "ok[1]", actor="eve")
    run = saga.resume(run.run_id)
    assert run.status == "completed"
    # The branch passed the draft (its input) on, not the approval record.
    assert calls("reviewer")[0]["params"]["task"] == json.dumps(
        run.steps["draft[1]"]["output"], sort_keys=True)


def test_a_false_condition_skips_its_branch_of_the_graph_only(saga: Saga) -> None:
    doc = graph([task("a"), task("b"), task("c"), task("d", "reviewer")],
                [{"source": "a", "target": "b",
                  "condition": {"field": "change", "operator": "starts_with", "value": "zzz"}},
                 ("b", "c"), ("a", "d")])
    run = saga.run(saga.load(doc), {"input": "go"})
    assert run.status == "completed"
    assert run.steps["b"]["reason"] == \
        "no incoming edge can fire: edge e1: condition change starts_with 'zzz' is false"
    assert run.steps["c"]["reason"] == \
        "no incoming edge can fire: edge e2: upstream node 'b' was skipped"
    assert run.outputs == {"c": None, "d": run.steps["d"]["output"]}


@pytest.mark.parametrize(("strategy", "wait_for", "expected"), [
    ("union", "all", {"passed": True, "warnings": 0, "findings": []}),
    ("intersection", "all", {"passed": True}),
])
def test_merge_strategies(saga: Saga, strategy: str, wait_for: str,
                          expected: dict[str, Any]) -> None:
    doc = graph([{"id": "split", "type": "parallel",
                  "parallel_config": {"branches": ["lint", "security"]}},
                 gate("lint", "lint_gate"), gate("security", "security_gate"),
                 {"id": "join", "type": "merge",
                  "merge_config": {"wait_for": wait_for, "merge_strategy": strategy}}],
                [("split", "lint"), ("split", "security"), ("lint", "join"),
                 ("security", "join")])
    run = saga.run(saga.load(doc))
    assert run.status == "completed"
    assert run.outputs == {"join": expected}


def test_merge_first_and_any_take_the_first_completed_input(saga: Saga) -> None:
    doc = graph([{"id": "split", "type": "parallel", "parallel_config": {"branches": ["a", "b"]}},
                 task("a", "debugger"), task("b", "implementer"),
                 {"id": "join", "type": "merge",
                  "merge_config": {"wait_for": "any", "merge_strategy": "first"}}],
                [("split", "a"), ("split", "b"), ("a", "join"), ("b", "join")],
                config={"max_parallel_nodes": 1})
    run = saga.run(saga.load(doc), {"input": "go"})
    assert run.status == "completed"
    first = run.completion_order[1]  # after split
    assert run.outputs == {"join": run.steps[first]["output"]}
    assert run.completion_order.index("join") == 2  # it did not wait for the other


def test_a_subgraph_runs_as_a_linked_child_run(saga: Saga) -> None:
    doc = graph([task("a"),
                 {"id": "sub", "type": "subgraph", "subgraph_config": {
                     "workflow_name": CHILD, "input_mapping": {"who": "inputs.who"},
                     "output_mapping": {"made_by": "made"}}},
                 task("b", "reviewer", "Use {input}")],
                [("a", "sub"), ("sub", "b")])
    run = saga.run(saga.load(doc), {"who": "ada"})
    assert run.status == "completed"
    child = saga.get(run.steps["sub"]["output"]["run_id"])
    assert child.status == "completed" and child.context["parent"]["step_id"] == "sub"
    assert calls("reviewer")[0]["params"]["task"] == 'Use {"made_by": "ada"}'


# -- validation -----------------------------------------------------------------------------

def problems(doc: dict[str, Any], tools: Any = None) -> list[str]:
    with pytest.raises(DefinitionError) as caught:
        compile_graph(doc, tools=tools)
    return [str(p) for p in caught.value.problems]


def test_every_validation_problem_is_reported_with_its_path() -> None:
    doc = graph([task("a"), task("a"), task("b"), task("c"),
                 {"id": "m", "type": "merge", "merge_config": {}},
                 {"id": "br", "type": "branch", "branch_config": {
                     "condition": {"field": "x", "operator": "==", "value": 1},
                     "on_true": "nowhere", "on_false": "c"}}],
                [("a", "b"), ("a", "b"), ("b", "c"), ("c", "b"), ("c", "ghost"),
                 ("c", "m"), ("b", "br"), {"id": "e1", "source": "br", "target": "m"}],
                entry_point="start")
    assert problems(doc) == [
        "nodes[1].id: duplicate node id 'a' (first at nodes[0])",
        "edges[1]: duplicate edge from 'a' to 'b' (first at edges[0])",
        "edges[4].target: target 'ghost' not found",
        "edges[7].id: duplicate edge id 'e1' (first at edges[0])",
        "entry_point: entry point 'start' not found",
        "edges: cycle without loop control: b -> c -> b",
        "nodes[5].branch_config.on_true: node 'nowhere' not found",
        "nodes[5].branch_config.on_false: no edge from 'br' to 'c'",
    ]


def test_a_merge_with_one_input_and_unreachable_nodes_are_problems() -> None:
    doc = graph([task("a"), {"id": "m", "type": "merge"}, task("lost")],
                [("a", "m"), ("lost", "m")], entry_point="a")
    doc["edges"].pop()
    assert problems(doc) == [
        "nodes[2]: node 'lost' cannot be reached from the entry point 'a'",
        "nodes[1]: merge node 'm' should have at least 2 incoming edges (has 1)"]


def test_loops_need_a_branch_and_must_loop() -> None:
    doc = graph([task("a"), task("b"), task("c")],
                [("a", "b"), {"source": "b", "target": "a", "is_loop_edge": True},
                 {"source": "a", "target": "c", "is_loop_edge": True}])
    assert problems(doc) == [
        "edges[1]: cycle without loop control: a -> b -> a (a loop edge must start at a "
        "branch node, whose max_iterations bounds it)",
        "edges[2].is_loop_edge: 'c' does not lead back to 'a': not a loop"]
    endless = graph([task("a"), {"id": "b", "type": "branch", "branch_config": {
        "condition": {"field": "x", "operator": "==", "value": 1},
        "on_true": "a", "on_false": "a"}}],
        [("a", "b"), {"source": "b", "target": "a", "is_loop_edge": True}])
    assert problems(endless) == ["exit_points: no exit points found (no terminal nodes)"]


def test_model_problems_and_unknown_tools_are_reported_together() -> None:
    doc = yaml.safe_load(DEBUG.read_text())
    doc["nodes"][0]["task_config"]["role"] = "debuger"
    doc["nodes"][2]["gate_config"]["gate_type"] = "tset_gate"
    doc["nodes"][1]["colour"] = "red"
    doc["nodes"][3]["branch_config"]["condition"]["max_iterations"] = 0
    doc["edges"][3]["condition"]["field"] = "a-b"
    doc["nodes"].append({"id": "h", "type": "human", "task_config": {"role": "x"}})
    doc["config"]["fail_slow"] = True
    tools = load_registry(TOOLS).tools()
    assert problems(doc, tools) == [
        "config.fail_slow: unknown key (not part of the graph form)",
        "nodes[1].colour: unknown key (not part of the graph form)",
        "nodes[3].branch_config.condition.max_iterations: Input should be greater than or "
        "equal to 1",
        "nodes[5]: a human node needs human_config",
        "edges[3].condition.field: invalid field name: 'a-b'",
        "nodes[0].task_config.role: unknown role 'debuger' (no tool of that name)",
        "nodes[2].gate_config.gate_type: unknown gate type 'tset_gate' (no tool of that name)"]


def test_saga_load_reports_unknown_tools(saga: Saga) -> None:
    doc = yaml.safe_load(DEBUG.read_text())
    doc["nodes"][4]["task_config"]["role"] = "nobody"
    with pytest.raises(DefinitionError, match=r"nodes\[4\]\.task_config\.role: unknown role"):
        saga.load(doc)


def test_validate_prints_levels_and_critical_path_ignoring_loops(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["validate", str(REVIEW), "--tools", "tests.standins.graph_standins", "--json"],
        env={"SAGA_HOME": str(tmp_path), "SAGA_TOOLS": None, "SAGA_DATABASE_URL": None})
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["levels"] == [["implement"], ["split"], ["lint", "test", "security"], ["join"],
                              ["review"], ["merge"]]
    assert data["critical_path"] == ["implement", "split", "lint", "join", "review", "merge"]
    plan = compile_graph(load_file(DEBUG))
    assert plan.levels() == [["analyze"], ["fix"], ["test"], ["check"], ["review"]]
    assert plan.critical_path() == ["analyze", "fix", "test", "check", "review"]
    assert plan.dependencies("analyze") == [] and plan.dependencies("review") == ["check"]


def test_the_plan_mirrors_the_step_list_plan() -> None:
    plan = compile_any(load_file(DEBUG))
    assert isinstance(plan, GraphPlan)
    d = plan.definition
    assert d.max_concurrency == 2 and d.error_handling.failure_strategy == "fail_fast"
    assert [(s.id, s.tool, s.parameters) for s in d.steps] == [
        ("analyze", "debugger", {"task": "Analyze this issue: {input}"}),
        ("fix", "implementer", {"task": "Fix based on analysis: {input}"}),
        ("test", "test_gate", {}), ("check", "noop", {}),
        ("review", "reviewer", {"task": "Review: {input}"})]
    assert plan.step("test").expect is None  # read by the branch: records, never fails
    review = compile_graph(load_file(REVIEW))
    assert review.step("lint").expect == "output.passed == True"
    assert review.step("review").confirm == "Approve Changes"
    assert review.definition.max_concurrency == 4
    assert review.record()["exit_points"] == ["merge"]
    again = compile_any(plan.record())
    assert isinstance(again, GraphPlan) and again.digest() == plan.digest()
    doc = yaml.safe_load(REVIEW.read_text())
    del doc["exit_points"]
    assert compile_graph(doc).model.exit_points == ["merge"]  # detected


def test_decide_is_pure(saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_TEST_GATE_FAILURES", "1")
    run = saga.run(saga.load(DEBUG), {"input": "x"})
    events = saga.events(run.run_id)
    folded = events[0].mutate(None)
    plan = compile_any(folded.definition)
    for event in events[1:]:
        assert scheduler.decide(plan, copy.deepcopy(folded)) == scheduler.decide(plan, folded)
        event.mutate(folded)
    assert scheduler.decide(plan, folded) == []


# -- crashes ------------------------------------------------------------------------------

CRASH_WORKER = ROOT / "tests" / "standins" / "crash_worker.py"


def test_a_worker_killed_in_the_middle_of_the_loop_ends_the_same(
        sqlite_settings: Settings, registry: Registry, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_TEST_GATE_FAILURES", "2")
    plan_data = load_file(DEBUG)
    with Saga(Settings(home=tmp_path / "baseline", actor="tester"), registry=registry) as s:
        expected = outcome(s, s.run(s.load(plan_data), {"input": "bug"}).run_id)
    assert expected["status"] == "completed" and "check[2]" in expected["steps"]
    for boundary in (2, 4, 6, 8):  # of 10 or 11 commits (completions arriving together share one)
        settings = replace(sqlite_settings, home=tmp_path / f"crash{boundary}",
                           lease_seconds=LEASE)
        log = tmp_path / f"calls{boundary}.log"
        with Saga(settings, registry=registry) as saga:
            run = saga.submit(saga.load(plan_data), {"input": "bug"})
            proc = subprocess.run(
                [sys.executable, str(CRASH_WORKER), str(boundary), "--poll", "0.05",
                 "--lease", str(LEASE), "--tools", "tests.standins.graph_standins"],
                cwd=ROOT, env=store_env(settings) | {"SAGA_TEST_CALL_LOG": str(log)},
                capture_output=True, text=True, timeout=60)
            assert proc.returncode == -9, proc.stderr
            assert not saga.get(run.run_id).is_finished
            recover(saga)
            assert outcome(saga, run.run_id) == expected, boundary
            check_history(saga, run.run_id)
            effects = Counter(json.loads(line)["key"] for line in log.read_text().splitlines())
            assert all(n == 1 for n in effects.values()), effects


# -- seed 004 to the letter ------------------------------------------------------------------

def test_subgraph_problems_are_reported_at_graph_paths(saga: Saga, tmp_path: Path) -> None:
    doc = graph([task("a"),
                 {"id": "sub", "type": "subgraph",
                  "subgraph_config": {"workflow_name": "no-such-composition.yaml"}},
                 {"id": "ask", "type": "subgraph",
                  "subgraph_config": {"workflow_name": str(REVIEW)}}],
                [("a", "sub"), ("sub", "ask")])
    with pytest.raises(DefinitionError) as caught:
        saga.load(doc)
    paths = [p.path for p in caught.value.problems]
    # A subgraph that waits for people is a child run its parent waits for (issue 38).
    assert paths == ["nodes[1].subgraph_config.workflow_name"]
    assert "no composition file or template 'no-such-composition.yaml'" in \
        caught.value.problems[0].message
    broken = yaml.safe_load(DEBUG.read_text())
    broken["nodes"][0]["task_config"]["role"] = "nobody"
    child = tmp_path / "child-graph.yaml"
    child.write_text(yaml.safe_dump(broken))
    doc["nodes"][1]["subgraph_config"]["workflow_name"] = str(child)
    doc["nodes"][2]["subgraph_config"]["workflow_name"] = CHILD
    with pytest.raises(DefinitionError) as caught:
        saga.load(doc)
    assert [str(p) for p in caught.value.problems] == [
        "nodes[1].subgraph_config.workflow_name: nodes[0].task_config.role: unknown role "
        "'nobody' (no tool of that name)"]


def test_saga_graph_labels_nodes_by_their_type(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["graph", str(REVIEW), "--tools", "tests.standins.graph_standins"],
        env={"SAGA_HOME": str(tmp_path), "SAGA_TOOLS": None, "SAGA_DATABASE_URL": None})
    assert result.exit_code == 0, result.output
    assert "noop" not in result.output
    for label in ['n0["implement: task implementer"]', 'n1["split: parallel (wait for all)"]',
                  'n2["lint: gate lint_gate"]', 'n5["join: merge all, union"]',
                  '''n6["review: human 'Approve Changes'"]''']:
        assert label in result.output
    plan = compile_graph(load_file(DEBUG))
    assert '"check" [label="check: branch test_status == \'passed\'"];' in diagram.dot(plan)
    kinds = {n["id"]: n["kind"] for n in diagram.layout(plan)["nodes"]}
    assert kinds == {"analyze": "task", "fix": "task", "test": "gate", "check": "branch",
                     "review": "task"}


def test_task_template_fills_fields_from_the_input_as_str_format_does(saga: Saga) -> None:
    doc = graph([task("analyze", "debugger", "Look at {service} in {env}: {input}"),
                 task("fix", "implementer", "Fix {analysis!r} ({task:.9}) {{literal}}"),
                 task("review", "reviewer", "Review {change}"),
                 {**task("sum", "reviewer", "From {change} and {analysis}"),
                  "wait_for_incoming": "all"}],
                [("analyze", "fix"), ("fix", "review"), ("fix", "sum"), ("analyze", "sum")])
    run = saga.run(saga.load(doc), {"service": "billing", "env": "prod"})
    assert run.status == "completed", run.error
    tasks = {c["step"]: c["params"]["task"] for c in standins.CALLS}
    assert tasks["analyze"] == ('Look at billing in prod: {"env": "prod", '
                                '"service": "billing"}')
    assert tasks["fix"] == "Fix 'cause found in pass 0' (Look at b) {literal}"
    assert tasks["review"] == "Review fix-0"
    assert tasks["sum"] == "From fix-0 and cause found in pass 0"  # both sources' fields


def test_a_missing_template_field_fails_the_task_before_the_call(saga: Saga) -> None:
    doc = graph([task("a", "debugger"), task("b", "implementer", "Fix {diagnosis}")],
                [("a", "b")])
    run = saga.run(saga.load(doc), {"input": "x"})
    assert run.status == "failed" and run.failed_step == "b"
    assert run.error["type"] == "TemplateError"
    assert run.error["message"] == ("task_template: no field 'diagnosis' in the node's input "
                                    "(fields: analysis, task)")
    assert not calls("implementer")


def test_task_template_problems_are_found_at_validation() -> None:
    doc = graph([task("a", template="Use {} and {0}"), task("b", template="{x.__class__}"),
                 task("c", template="unclosed {input"), task("d", template="{known} {other}")],
                [("a", "b"), ("b", "c"), {"source": "c", "target": "d",
                                           "data_mapping": {"known": "change"}}])
    assert problems(doc) == [
        "nodes[0].task_config.task_template: {}: positional fields are not allowed; name a "
        "field of the node's input, or {input}",
        "nodes[0].task_config.task_template: {0}: positional fields are not allowed; name a "
        "field of the node's input, or {input}",
        "nodes[1].task_config.task_template: {x.__class__}: attribute access is not allowed; "
        "index with {x[key]}",
        "nodes[2].task_config.task_template: expected '}' before end of string (write a "
        "literal brace as {{ or }})",
        "nodes[3].task_config.task_template: {other}: no edge into 'd' maps a field 'other' "
        "(they map: known)"]


def review_with(**gate_config: Any) -> dict[str, Any]:
    """The parallel review with extra gate_config on its three gates."""
    doc = yaml.safe_load(REVIEW.read_text())
    for node in doc["nodes"]:
        if node["type"] == "gate":
            node["gate_config"].update(gate_config)
    return doc


def test_gates_with_auto_approve_approve_the_human_node_they_feed(saga: Saga) -> None:
    run = saga.run(saga.load(review_with(auto_approve=True)), {"input": "billing export"})
    assert run.status == "completed", run.error
    assert not run.approvals and not run.pending_approvals
    assert run.steps["review"]["output"] == {
        "approved": True, "actor": "auto",
        "comment": "auto_approve: gates lint, test, security passed",
        "input": run.steps["join"]["output"]}
    assert run.outputs["merge"]["change"] == "merge-0"
    assert "requires_worktree" not in calls("lint_gate")[0]["params"]  # the default: true
    recorded = [e["payload"] for e in saga.history(run.run_id)
                if e["type"] == "StepCompleted" and e["step_id"] == "review"]
    assert recorded[0]["output"]["actor"] == "auto"


def test_auto_approve_that_would_be_ignored_is_refused() -> None:
    doc = yaml.safe_load(REVIEW.read_text())
    doc["nodes"][2]["gate_config"]["auto_approve"] = True  # lint only
    assert problems(doc) == [
        "nodes[2].gate_config.auto_approve: auto_approve has no effect: human node 'review' "
        "also waits on 'security', 'test', not gates with auto_approve, so a person is "
        "always asked"]
    alone = graph([task("a"), {"id": "g", "type": "gate",
                               "gate_config": {"gate_type": "lint_gate", "auto_approve": True}}],
                  [("a", "g")])
    assert problems(alone) == [
        "nodes[1].gate_config.auto_approve: auto_approve has no effect: no human node follows "
        "gate 'g' (directly or through merge and parallel nodes)"]


def fan_out(split_waits_for: str, **merge_config: Any) -> dict[str, Any]:
    """split -> a, b, c -> join -> after, one node at a time (a starts first)."""
    join: dict[str, Any] = {"id": "join", "type": "merge"}
    if merge_config:
        join["merge_config"] = merge_config
    return graph([{"id": "split", "type": "parallel",
                   "parallel_config": {"branches": ["a", "b", "c"],
                                       "wait_for": split_waits_for}},
                  task("a", "debugger"), task("b", "implementer"), task("c", "reviewer"),
                  join, task("after", "reviewer", "After {input}")],
                 [("split", "a"), ("split", "b"), ("split", "c"), ("a", "join"),
                  ("b", "join"), ("c", "join"), ("join", "after")],
                 config={"max_parallel_nodes": 1})


def test_parallel_wait_for_any_goes_on_with_the_first_branch(saga: Saga) -> None:
    run = saga.run(saga.load(fan_out("any")), {"input": "go"})
    assert run.status == "completed", run.error
    assert run.completion_order[:3] == ["split", "a", "join"]  # did not wait for b and c
    assert run.steps["join"]["output"] == run.steps["a"]["output"]
    assert {c["step"] for c in standins.CALLS} == {"a", "b", "c", "after"}  # the rest ran
    assert run.steps["b"]["status"] == run.steps["c"]["status"] == "completed"
    assert calls("reviewer")[-1]["params"]["task"].startswith('After {"analysis"')


def test_parallel_wait_for_first_cancels_the_other_branches(saga: Saga) -> None:
    run = saga.run(saga.load(fan_out("first")), {"input": "go"})
    assert run.status == "completed", run.error
    assert run.steps["join"]["output"] == run.steps["a"]["output"]
    reason = ("cancelled: 'join' went on with the first branch of parallel 'split' to "
              "finish (wait_for: first)")
    assert {k: s.get("reason") for k, s in run.steps.items() if s["status"] == "skipped"} == {
        "b": reason, "c": reason}
    assert [c["step"] for c in standins.CALLS] == ["a", "after"]
    assert run.outputs == {"after": run.steps["after"]["output"]}


def test_parallel_wait_for_all_stays_the_default(saga: Saga) -> None:
    run = saga.run(saga.load(fan_out("all")), {"input": "go"})
    assert run.completion_order[:5] == ["split", "a", "b", "c", "join"]
    assert set(run.steps["join"]["output"]) == {"analysis", "change", "task", "verdict"}


def test_parallel_wait_for_needs_a_merge_where_the_branches_meet() -> None:
    assert problems(fan_out("first", wait_for="all")) == [
        "nodes[4].merge_config.wait_for: 'all' contradicts parallel 'split' (wait_for: "
        "'first'), whose branches meet here: leave it out or say 'any'"]
    doc = fan_out("any")
    doc["nodes"][4] = task("join")
    assert problems(doc) == [
        "nodes[0].parallel_config.wait_for: wait_for 'any' needs the branches to meet at a "
        "merge node; they first meet at 'join', a task node"]
    doc["edges"] = doc["edges"][:3]
    doc["nodes"] = doc["nodes"][:4]
    assert problems(doc) == [
        "nodes[0].parallel_config.wait_for: wait_for 'any' needs the branches to meet at a "
        "merge node (they never meet)"]


def gated(**config: Any) -> dict[str, Any]:
    """a -> fix (gates lint_gate, test_gate; undone by `undo`) -> after."""
    return graph([task("a", "debugger"),
                  task("fix", gates=["lint_gate", "test_gate"], worktree_id="wt-1",
                       compensate={"tool": "undo", "args": {"what": "{{ output.change }}"}}),
                  task("after", "reviewer", "After {change}")],
                 [("a", "fix"), ("fix", "after")], config=config)


def test_task_gates_run_after_the_task_as_steps_of_their_own(saga: Saga) -> None:
    run = saga.run(saga.load(gated()), {"input": "go"})
    assert run.status == "completed", run.error
    assert [c["step"] for c in standins.CALLS] == [
        "a", "fix", "fix.lint_gate", "fix.test_gate", "after"]
    assert "gates" not in calls("implementer")[0]["params"]  # the gates are not the role's
    fix = run.steps["fix"]["output"]
    assert calls("lint_gate")[0]["params"] == {"input": fix, "worktree_id": "wt-1"}
    assert run.steps["fix.test_gate"]["output"] == {"passed": True, "test_status": "passed",
                                                    "tests": 12}
    assert calls("reviewer")[0]["params"]["task"] == "After fix-0"  # the task's output flows
    gate_events = [(e["type"], e["step_id"]) for e in saga.history(run.run_id)
                   if "." in e.get("step_id", "")]
    assert gate_events == [("StepStarted", "fix.lint_gate"), ("StepCompleted", "fix.lint_gate"),
                           ("StepStarted", "fix.test_gate"), ("StepCompleted", "fix.test_gate")]


def test_a_failing_task_gate_fails_the_task_and_undoes_it(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPH_FAILING_GATES", "lint_gate")
    run = saga.run(saga.load(gated()), {"input": "go"})
    assert run.status == "compensated"
    assert run.failed_step == "fix.lint_gate" and run.error["type"] == "ExpectationFailed"
    assert run.steps["fix.lint_gate"]["output"] is None
    assert [c["params"] for c in calls("undo")] == [{"what": "fix-0"}]
    assert not calls("test_gate") and not calls("reviewer")
    run = saga.run(saga.load(gated(fail_fast=False)), {"input": "go"})
    assert run.status == "compensated"  # what ran is undone after the rest was decided
    assert run.steps["after"]["reason"] == \
        "no incoming edge can fire: edge e2: upstream node 'fix' failed its gate 'lint_gate'"


def test_a_gate_listed_twice_is_refused() -> None:
    doc = graph([task("a", gates=["lint_gate", "lint_gate"])], [])
    assert problems(doc) == [
        "nodes[0].task_config.gates[1]: gate 'lint_gate' is listed twice (first at gates[0])"]


def test_a_gate_that_needs_no_worktree_is_told_so(saga: Saga) -> None:
    doc = graph([task("a"), {"id": "g", "type": "gate", "gate_config": {
        "gate_type": "lint_gate", "requires_worktree": False}}], [("a", "g")])
    assert saga.run(saga.load(doc), {"input": "x"}).status == "completed"
    assert calls("lint_gate")[0]["params"]["requires_worktree"] is False
