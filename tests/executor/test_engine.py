"""The engine end to end through the Python API, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.tools import Registry
from tests.standins import standins

SEEDS = Path(__file__).parents[1] / "seeds"


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    standins.CALLS.clear()


def calls(tool: str | None = None) -> list[dict[str, Any]]:
    return [c for c in standins.CALLS if tool is None or c["tool"] == tool]


def types(saga: Saga, run_id: str) -> list[str]:
    return [e["type"] for e in saga.history(run_id)]


def test_seed_001_runs_as_written(saga: Saga) -> None:
    plan = saga.load(SEEDS / "001_search_fold_store.json")
    run = saga.run(plan, {"query": "billing"})
    assert run.status == "completed"
    fold = calls("context_fold")[0]["params"]
    assert fold["content"] == "billing result 0 billing result 1 billing result 2 billing " \
        "result 3 billing result 4 billing result 5 billing result 6 billing result 7 " \
        "billing result 8 billing result 9"
    store = calls("checkpoint_save")[0]["params"]
    assert store["summary"] == fold["content"][:20]
    assert store["tags"] == ["folded", "auto-generated"]
    assert set(run.outputs) == {"search_results", "folded_content", "saved_checkpoint"}


def test_seed_002_waits_for_confirmation_then_completes(saga: Saga) -> None:
    plan = saga.load(SEEDS / "002_start_work.yaml")
    run = saga.run(plan, {"issue_key": "AAP-12345"})
    assert run.status == "waiting"
    assert run.pending_approvals == ["create_branch"]
    assert run.approvals["create_branch"]["message"] == \
        "Create branch feature/AAP-12345-add-billing-export?"
    assert not calls("git_create_branch")
    saga.approve(run.run_id, "create_branch", actor="alice", comment="go")
    run = saga.resume(run.run_id)
    assert run.status == "completed"
    assert run.outputs == {"branch": "feature/AAP-12345-add-billing-export",
                           "issue": {"key": "AAP-12345", "type": "Story",
                                     "summary": "Add billing export"},
                           "success": True}
    assert [c["params"]["branch"] for c in calls("git_create_branch")] == \
        ["feature/AAP-12345-add-billing-export"]
    # The auto-heal steps were skipped by their own conditions, not by cascade.
    assert run.steps["detect_failure"]["status"] == "skipped"
    assert run.steps["retry_create_branch"]["status"] == "skipped"
    assert run.steps["transition_issue"]["status"] == "completed"
    history = saga.history(run.run_id)
    granted = [e for e in history if e["type"] == "ApprovalGranted"]
    assert granted[0]["payload"]["actor"] == "alice"


def test_rejection_follows_on_error(saga: Saga) -> None:
    plan = saga.load(SEEDS / "002_start_work.yaml")
    run = saga.run(plan, {"issue_key": "AAP-1"})
    saga.reject(run.run_id, "create_branch", actor="bob", comment="not now")
    run = saga.resume(run.run_id)
    # create_branch has on_error: continue, so the run goes on without the branch.
    assert run.steps["create_branch"]["status"] == "failed"
    assert run.steps["create_branch"]["error"]["type"] == "ApprovalRejected"
    assert run.status == "completed"
    assert not calls("git_create_branch")


def chain(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "t", "steps": list(steps), **extra}


def test_retries_record_every_attempt_with_the_same_key(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "act", "args": {"fail_times": 2},
                            "retry": {"max_attempts": 3, "delay": 0.01, "jitter": 0}}))
    run = saga.run(plan)
    assert run.status == "completed"
    events = saga.history(run.run_id)
    started = [e["payload"] for e in events if e["type"] == "StepStarted"]
    assert [s["attempt"] for s in started] == [1, 2, 3]
    failed = [e["payload"] for e in events if e["type"] == "StepFailed"]
    assert [f["retryable"] for f in failed] == [True, True]
    assert all(f["next_retry_at"] for f in failed)
    assert {c["key"] for c in calls("act")} == {f"{run.run_id}:a:0"}
    assert [c["attempt"] for c in calls("act")] == [1, 2, 3]


def test_retry_count_means_retries_not_attempts(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "act", "args": {"fail": True},
                            "retry_count": 2}),)
    run = saga.run(plan)
    assert run.status == "failed"
    assert len(calls("act")) == 3
    last = [e for e in saga.history(run.run_id) if e["type"] == "StepFailed"][-1]["payload"]
    assert last["retryable"] is False and last["next_retry_at"] is None


def test_non_retryable_error_is_not_retried(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "act", "args": {"fail": True,
                                                               "error_type": "Forbidden"},
                            "retry": {"max_attempts": 5, "delay": 0.01,
                                      "non_retryable": ["Forbidden"]}}))
    assert saga.run(plan).status == "failed"
    assert len(calls("act")) == 1


def test_timeout_cancels_the_attempt_and_is_recorded(saga: Saga) -> None:
    plan = saga.load(chain({"id": "slow", "tool": "sleep", "args": {"seconds": 5},
                            "timeout_ms": 50}))
    run = saga.run(plan)
    assert run.status == "failed"
    failed = [e for e in saga.history(run.run_id) if e["type"] == "StepFailed"]
    assert failed[0]["payload"]["error_type"] == "timeout"
    assert run.error["type"] == "timeout"


def _saga_steps(n: int, fail_at: int, compensate_fail: bool = False) -> list[dict[str, Any]]:
    steps = []
    for i in range(n):
        steps.append({"id": f"s{i}", "tool": "act",
                      "args": {"value": i, "fail": i == fail_at},
                      "compensate": {"tool": "undo", "args": {
                          "what": "{{ output.value }}", "fail": compensate_fail and i == 1}}})
    return steps


def test_fail_fast_compensates_in_reverse_completion_order_once(saga: Saga) -> None:
    run = saga.run(saga.load(chain(*_saga_steps(4, fail_at=3))))
    assert run.status == "compensated"
    assert [c["params"]["what"] for c in calls("undo")] == [2, 1, 0]
    assert calls("undo")[0]["key"] == f"{run.run_id}:s2:0:compensate"
    events = saga.history(run.run_id)
    started = [e for e in events if e["type"] == "CompensationStarted"]
    assert started[0]["payload"]["steps"] == ["s2", "s1", "s0"]
    assert [e["step_id"] for e in events if e["type"] == "StepCompensated"] == ["s2", "s1", "s0"]
    assert types(saga, run.run_id)[-1] == "RunCompensated"
    assert run.failed_step == "s3"
    assert {k: s["status"] for k, s in run.steps.items()} == {
        "s0": "compensated", "s1": "compensated", "s2": "compensated", "s3": "failed"}


def test_a_failed_compensation_leaves_the_run_failed_after_the_rest(saga: Saga) -> None:
    run = saga.run(saga.load(chain(*_saga_steps(4, fail_at=3, compensate_fail=True))))
    assert run.status == "failed"
    assert [c["params"]["what"] for c in calls("undo")] == [2, 1, 0]
    assert run.error["compensation_failed"] == ["s1"]
    assert "CompensationFailed" in types(saga, run.run_id)


def test_without_rollback_a_failure_just_fails(saga: Saga) -> None:
    run = saga.run(saga.load(chain(*_saga_steps(3, fail_at=2),
                                   error_handling={"rollback_on_failure": False})))
    assert run.status == "failed"
    assert not calls("undo")
    assert "CompensationStarted" not in types(saga, run.run_id)


def test_rollback_strategy_compensates_even_without_rollback_flag(saga: Saga) -> None:
    run = saga.run(saga.load(chain(*_saga_steps(3, fail_at=2), error_handling={
        "rollback_on_failure": False, "failure_strategy": "rollback"})))
    assert run.status == "compensated"
    assert [c["params"]["what"] for c in calls("undo")] == [1, 0]


def test_partial_success_finishes_independent_work(saga: Saga) -> None:
    plan = saga.load({"name": "p", "error_handling": {"failure_strategy": "partial_success",
                                                      "rollback_on_failure": False},
                      "steps": [
                          {"id": "bad", "tool": "act", "args": {"fail": True}, "depends_on": []},
                          {"id": "after_bad", "tool": "act", "depends_on": ["bad"]},
                          {"id": "good", "tool": "act", "args": {"value": 1}, "depends_on": []},
                          {"id": "after_good", "tool": "act", "depends_on": ["good"]},
                      ]})
    run = saga.run(plan)
    assert run.status == "failed"
    assert run.steps["after_bad"]["status"] == "skipped"
    assert "upstream" in run.steps["after_bad"]["reason"]
    assert run.steps["after_good"]["status"] == "completed"
    assert set(run.outputs) == {"good", "after_good"}


def test_fail_fast_starts_nothing_new_after_a_failure(saga: Saga) -> None:
    plan = saga.load({"name": "f", "error_handling": {"rollback_on_failure": False},
                      "steps": [
                          {"id": "bad", "tool": "act", "args": {"fail": True}, "depends_on": []},
                          {"id": "slow", "tool": "block", "args": {"seconds": 0.3},
                           "depends_on": []},
                          {"id": "after_slow", "tool": "act", "depends_on": ["slow"]},
                      ]})
    run = saga.run(plan)
    assert run.status == "failed"
    assert run.steps["slow"]["status"] == "completed"  # was already running: it finishes
    assert "after_slow" not in run.steps
    assert not [c for c in calls("act") if c["step"] == "after_slow"]


def test_retry_strategy_retries_with_backoff(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "act", "args": {"fail_times": 1}},
                           error_handling={"failure_strategy": "retry", "max_retries": 1}))
    run = saga.run(plan)
    assert run.status == "completed"
    assert [c["attempt"] for c in calls("act")] == [1, 2]


def test_on_error_continue_keeps_going(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "act", "args": {"fail": True},
                            "on_error": "continue"},
                           {"id": "b", "tool": "echo", "when": "a.failed and '❌' in str(a)",
                            "args": {"why": "{{ a.error.message }}", "text": "{{ a.message }}"}}))
    run = saga.run(plan)
    assert run.status == "completed"
    assert run.steps["a"]["status"] == "failed"
    assert run.steps["b"]["status"] == "completed"
    error = run.steps["a"]["error"]
    assert run.steps["b"]["output"] == {
        "why": error["message"], "text": f"❌ {error['type']}: {error['message']}"}


def test_on_error_retry_n(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "act", "args": {"fail_times": 2},
                            "on_error": "retry:2"}))
    assert saga.run(plan).status == "completed"
    assert len(calls("act")) == 3


def test_skips_do_not_cascade(saga: Saga) -> None:
    plan = saga.load(chain(
        {"id": "maybe", "tool": "echo", "args": {"x": 1}, "when": "inputs.go"},
        {"id": "always", "tool": "echo", "args": {"prev": "{{ maybe }}"}},
        {"id": "only_if", "tool": "echo", "args": {}, "when": "maybe and maybe.x == 1"},
    ))
    run = saga.run(plan, {"go": False})
    assert run.steps["maybe"] == run.steps["maybe"] | {"status": "skipped",
                                                       "reason": "condition false"}
    assert run.steps["always"]["output"] == {"prev": None}
    assert run.steps["only_if"]["status"] == "skipped"
    run = saga.run(plan, {"go": True})
    assert run.steps["only_if"]["status"] == "completed"


def test_whole_value_templates_keep_types(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "echo", "args": {"n": 3, "l": [1, 2]}},
                           {"id": "b", "tool": "echo", "args": {"whole": "{{ a }}",
                                                               "n": "{{ a.n }}",
                                                               "text": "n={{ a.n }}"}}))
    run = saga.run(plan)
    assert run.steps["b"]["output"] == {"whole": {"n": 3, "l": [1, 2]}, "n": 3, "text": "n=3"}


def test_a_missing_reference_at_run_time_fails_the_step_with_its_path(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "echo", "args": {"n": 3}},
                           {"id": "b", "tool": "echo", "args": {"x": "{{ a.missing }}"}}))
    run = saga.run(plan)
    assert run.status == "failed"
    assert run.steps["b"]["error"]["type"] == "ExpressionError"
    assert "missing" in run.steps["b"]["error"]["message"]


def test_parallel_levels_overlap_in_time(saga: Saga) -> None:
    plan = saga.load({"name": "par", "steps": [
        {"id": f"p{i}", "tool": "block", "args": {"seconds": 0.4}, "depends_on": []}
        for i in range(3)]})
    assert saga.run(plan).status == "completed"
    spans = sorted((c["start"], c["end"]) for c in calls("block"))
    assert len(spans) == 3
    assert max(s for s, _ in spans) < min(e for _, e in spans)  # all three were running at once


def test_max_concurrency_bounds_parallelism(saga: Saga) -> None:
    plan = saga.load({"name": "par", "max_concurrency": 1, "steps": [
        {"id": f"p{i}", "tool": "block", "args": {"seconds": 0.1}, "depends_on": []}
        for i in range(3)]})
    assert saga.run(plan).status == "completed"
    spans = sorted((c["start"], c["end"]) for c in calls("block"))
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(2))


def test_compute_steps_run_in_the_sandbox(saga: Saga) -> None:
    plan = saga.load(chain(
        {"id": "pods", "tool": "echo", "args": {"items": [
            {"name": "a", "status": "Running"}, {"name": "b", "status": "Crash"}]}},
        {"id": "analyze", "compute": "items = pods['items']\n"
                                     "bad = [p['name'] for p in items\n"
                                     "       if p['status'] != 'Running']\n"
                                     "result = {'unhealthy': bad, 'n': len(items)}",
         "output": "analysis"},
        {"id": "restart", "tool": "echo", "args": {"pods": "{{ analysis.unhealthy }}"},
         "when": "analysis.n > 0"}))
    run = saga.run(plan)
    assert run.steps["restart"]["output"] == {"pods": ["b"]}


def test_the_definition_is_recorded_normalised_with_its_hash(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "echo", "args": {"x": 1}}))
    run = saga.run(plan)
    started = saga.history(run.run_id)[0]
    assert started["type"] == "RunStarted"
    assert started["payload"]["definition"]["steps"][0]["parameters"] == {"x": 1}
    assert started["payload"]["definition_hash"] == plan.definition.digest()
    assert started["payload"]["context"]["actor"] == "tester"
    json.dumps(saga.history(run.run_id))  # every payload is plain JSON


def test_a_step_transition_is_one_commit(saga: Saga) -> None:
    plan = saga.load(chain(*[{"id": f"s{i}", "tool": "noop"} for i in range(5)]))
    commits: list[int] = []
    run = saga.run(plan, on_events=lambda r, events: commits.append(len(events)))
    assert run.status == "completed"
    # RunStarted+StepStarted, then one commit per completion (with the next start),
    # the last one carrying RunCompleted.
    assert len(commits) == 6
    assert sum(commits) == len(saga.history(run.run_id)) == 12


def test_runs_are_listed_newest_first(saga: Saga) -> None:
    plan = saga.load(chain({"id": "a", "tool": "noop"}))
    first, second = saga.run(plan), saga.run(plan)
    listed = [r["run_id"] for r in saga.list_runs()]
    assert listed[:2] == [second.run_id, first.run_id]
    assert saga.list_runs(status="failed") == []


def test_compensate_true_uses_the_tools_own_compensation(saga: Saga) -> None:
    plan = saga.load(chain({"id": "save", "tool": "checkpoint_save",
                            "args": {"tags": ["x"]}, "compensate": True},
                           {"id": "boom", "tool": "act", "args": {"fail": True}}))
    run = saga.run(plan)
    assert run.status == "compensated"
    deleted = calls("checkpoint_delete")
    assert len(deleted) == 1 and deleted[0]["params"] == {"tags": ["x"]}
    assert deleted[0]["key"] == f"{run.run_id}:save:0:compensate"


def test_compensate_true_needs_a_tool_with_a_compensation(saga: Saga) -> None:
    from saga.errors import DefinitionError

    with pytest.raises(DefinitionError, match="has no compensation of its own"):
        saga.load(chain({"id": "a", "tool": "echo", "compensate": True}))


# -- for-each loops ----------------------------------------------------------------------

LOOP = {"name": "batch", "steps": [
    {"id": "list", "tool": "echo", "args": {"items": [{"key": "A-1"}, {"key": "A-2"},
                                                       {"key": "A-3"}]}},
    {"id": "update", "tool": "effect", "loop": "{{ list.items }}", "loop_var": "issue",
     "args": {"value": "{{ issue.key }}", "index": "{{ loop_index }}"},
     "compensate": {"tool": "undo", "args": {"what": "{{ issue.key }}"}}},
    {"id": "after", "tool": "echo", "args": {"updated": "{{ update }}"}},
]}


def test_a_loop_runs_each_item_as_an_iteration_and_collects_outputs(saga: Saga) -> None:
    run = saga.run(saga.load(LOOP))
    assert run.status == "completed"
    assert [c["params"]["value"] for c in calls("effect")] == ["A-1", "A-2", "A-3"]
    assert sorted(c["key"] for c in calls("effect")) == [
        f"{run.run_id}:update:{i}" for i in (1, 2, 3)]
    assert run.steps["update"]["output"] == [
        {"step": "update", "value": v} for v in ("A-1", "A-2", "A-3")]
    assert run.steps["after"]["output"]["updated"][2] == {"step": "update", "value": "A-3"}
    started = [e for e in saga.history(run.run_id)
               if e["type"] == "StepStarted" and e["step_id"] == "update"]
    assert started[0]["payload"]["parameters"]["items"][0] == {"key": "A-1"}
    assert sorted(e["payload"]["iteration"] for e in started) == [0, 1, 2, 3]


def test_a_failed_iteration_fails_the_loop_and_compensates_done_iterations(saga: Saga) -> None:
    definition = json.loads(json.dumps(LOOP))
    definition["steps"][1]["args"]["fail"] = "{{ issue.key == 'A-3' }}"
    definition["steps"][1]["loop_concurrency"] = 1
    run = saga.run(saga.load(definition))
    assert run.status == "compensated"
    assert run.failed_step == "update"
    assert [c["params"]["what"] for c in calls("undo")] == ["A-2", "A-1"]
    assert "after" not in run.steps


def test_loop_concurrency_bounds_iterations(saga: Saga) -> None:
    plan = saga.load({"name": "lc", "steps": [
        {"id": "each", "tool": "block", "loop": [1, 2, 3, 4], "loop_concurrency": 2,
         "args": {"seconds": 0.15, "n": "{{ item }}"}}]})
    run = saga.run(plan)
    assert run.status == "completed"
    spans = sorted((c["start"], c["end"]) for c in calls("block"))
    overlapping = max(sum(1 for s, e in spans if s < t < e) for t, _ in spans for t in [t + 1e-4])
    assert overlapping <= 2
    assert spans[1][0] < spans[0][1]  # two at once


def test_an_empty_loop_completes_with_an_empty_list(saga: Saga) -> None:
    run = saga.run(saga.load({"name": "empty", "steps": [
        {"id": "each", "tool": "effect", "loop": "{{ inputs.items }}",
         "args": {"value": "{{ item }}"}}]}), {"items": []})
    assert run.status == "completed" and run.steps["each"]["output"] == []


# -- layers (guarantee, enhancement, execution) and eco mode -------------------------------

LAYERED = {"name": "gate", "steps": [
    {"id": "work", "tool": "effect", "layer": "execution", "args": {"value": 1},
     "depends_on": []},
    {"id": "polish", "tool": "effect", "layer": "enhancement", "args": {"value": 2, "fail": True},
     "depends_on": ["work"]},
    {"id": "lint", "tool": "effect", "layer": "guarantee", "args": {"value": 0},
     "depends_on": []},
    {"id": "ship", "tool": "effect", "layer": "execution", "args": {"value": 3},
     "depends_on": ["polish"]},
]}


def test_guarantees_run_first_and_enhancement_failures_degrade(saga: Saga) -> None:
    plan = saga.load(LAYERED)
    assert plan.levels()[0] == ["lint"]
    run = saga.run(plan)
    assert run.status == "completed"
    assert [c["step"] for c in calls("effect")] == ["lint", "work", "polish", "ship"]
    layers = run.outputs["_layers"]
    assert layers["degraded"] is True
    assert layers["enhancement"]["failed"] == ["polish"]
    assert layers["guarantee"] == layers["guarantee"] | {"steps": 1, "completed": 1}
    assert layers["execution"]["completed"] == 2
    assert all(isinstance(layers[k]["duration_ms"], int) for k in ("guarantee", "execution"))


def test_a_failed_guarantee_blocks_everything(saga: Saga) -> None:
    definition = json.loads(json.dumps(LAYERED))
    definition["steps"][2]["args"]["fail"] = True
    run = saga.run(saga.load(definition))
    assert run.status == "failed" and run.failed_step == "lint"
    assert [c["step"] for c in calls("effect")] == ["lint"]


def test_eco_mode_skips_enhancements(saga: Saga) -> None:
    run = saga.run(saga.load(LAYERED), options={"mode": "eco"})
    assert run.status == "completed"
    assert run.steps["polish"]["status"] == "skipped"
    assert run.steps["polish"]["reason"] == "eco mode"
    assert run.outputs["_layers"]["degraded"] is False


def test_execution_steps_retry_by_default(saga: Saga) -> None:
    plan = saga.load({"name": "x", "steps": [
        {"id": "a", "tool": "act", "layer": "execution", "args": {"fail_times": 2},
         "retry": {"max_attempts": 3, "delay": 0.01}},
        {"id": "b", "tool": "act", "layer": "execution", "args": {"fail_times": 1}}]})
    assert saga.run(plan).status == "completed"
    assert [c["attempt"] for c in calls("act") if c["step"] == "b"] == [1, 2]


def test_a_guarantee_cannot_wait_for_other_layers(saga: Saga) -> None:
    from saga.errors import DefinitionError

    definition = json.loads(json.dumps(LAYERED))
    definition["steps"][2]["depends_on"] = ["work"]
    with pytest.raises(DefinitionError, match="guarantee step cannot wait"):
        saga.load(definition)


# -- nested compositions -------------------------------------------------------------------

CHILD = str(Path(__file__).parents[1] / "compositions" / "child.yaml")


def parent(fail_child: bool = False, fail_after: bool = False) -> dict[str, Any]:
    return {"name": "parent", "steps": [
        {"id": "first", "tool": "effect", "args": {"value": 1},
         "compensate": {"tool": "undo", "args": {"what": "first"}}},
        {"id": "nested", "use": CHILD, "args": {"who": "ada", "fail": fail_child}},
        {"id": "last", "tool": "effect", "args": {"value": "{{ nested.outputs.made }}",
                                                 "fail": fail_after}}]}


def test_a_nested_composition_runs_as_a_linked_child_run(saga: Saga) -> None:
    run = saga.run(saga.load(parent()))
    assert run.status == "completed"
    output = run.steps["nested"]["output"]
    assert output["outputs"] == {"made": "ada"}
    assert run.steps["last"]["output"]["value"] == "ada"
    child = saga.get(output["run_id"])
    assert child.status == "completed"
    assert child.context["parent"] == {"run_id": run.run_id, "step_id": "nested",
                                       "iteration": 0}
    assert run.steps["nested"]["parameters"]["run"] == child.run_id
    tree = saga.status(run.run_id)
    assert tree["children"][0]["run_id"] == child.run_id
    assert tree["children"][0]["status"] == "completed"


def test_a_failed_child_fails_its_step_and_the_parent_compensates(saga: Saga) -> None:
    run = saga.run(saga.load(parent(fail_child=True)))
    assert run.status == "compensated"
    assert run.steps["nested"]["error"]["type"] == "ChildRunFailed"
    # The child undid its own work; then the parent undid its completed steps.
    assert [c["params"]["what"] for c in calls("undo")] == ["child-ada", "first"]
    child_id = run.steps["nested"]["parameters"]["run"]
    assert saga.get(child_id).status == "compensated"
    assert saga.status(run.run_id)["children"][0]["status"] == "compensated"


def test_compensating_the_parent_compensates_a_completed_child(saga: Saga) -> None:
    run = saga.run(saga.load(parent(fail_after=True)))
    assert run.status == "compensated"
    assert [c["params"]["what"] for c in calls("undo")] == ["child-ada", "first"]
    child = saga.get(run.steps["nested"]["output"]["run_id"])
    assert child.status == "compensated"
    assert child.compensation["requested"] is True


def test_a_missing_nested_composition_is_a_validation_error(saga: Saga) -> None:
    from saga.errors import DefinitionError

    with pytest.raises(DefinitionError, match=r"steps\[0\]\.use"):
        saga.load({"name": "p", "steps": [{"id": "n", "use": "no/such/file.yaml"}]})


def test_children_are_not_picked_up_by_workers_on_their_own(saga: Saga) -> None:
    from saga.worker import RunIndex

    index = RunIndex(saga.app)
    followed: set[str] = set()  # every run the index followed, at any point
    original = index._apply

    def spy(run_id: str, topic: str, state: bytes, version: int = 0) -> None:
        original(run_id, topic, state, version)
        followed.update(index.runs)
    index._apply = spy  # type: ignore[method-assign]
    run = saga.run(saga.load(parent()))
    pending = saga.submit(saga.load(parent()))
    index.refresh()
    assert index.children and not index.children & followed  # never followed
    assert {str(run.id), str(pending.id)} <= followed
    assert set(index.runs) == {str(pending.id)}  # finished runs are not followed


def test_expect_fails_a_step_whose_output_does_not_meet_it(saga: Saga) -> None:
    plan = saga.load(chain({"id": "gate", "tool": "echo", "args": {"passed": False},
                            "expect": "output.passed"}))
    run = saga.run(plan)
    assert run.status == "failed"
    assert run.steps["gate"]["error"]["type"] == "ExpectationFailed"
    ok = saga.run(saga.load(chain({"id": "gate", "tool": "echo", "args": {"passed": True},
                                   "expect": "output.passed == True"})))
    assert ok.status == "completed"


def test_cached_results_are_reused_across_runs_and_recorded_as_hits(saga: Saga) -> None:
    plan = saga.load(chain({"id": "config", "tool": "effect", "args": {"value": "cfg"},
                            "cache": 300}))
    first = saga.run(plan)
    second = saga.run(plan)
    assert len(calls("effect")) == 1
    assert second.steps["config"]["output"] == first.steps["config"]["output"]
    hit = second.steps["config"]["cache"]
    assert hit["hit"] is True and hit["run_id"] == first.run_id and hit["step_id"] == "config"
    assert "cache" not in first.steps["config"]
    other = saga.run(saga.load(chain({"id": "config", "tool": "effect", "args": {"value": "x"},
                                      "cache": 300})))
    assert "cache" not in other.steps["config"] and len(calls("effect")) == 2


@pytest.mark.doctored
def test_an_edited_cache_row_is_not_reused(saga: Saga) -> None:
    plan = saga.load(chain({"id": "c", "tool": "effect", "args": {"value": 1}, "cache": 300}))
    first = saga.run(plan)
    saga.cache.db.execute("UPDATE saga_cache SET output = ?",
                          (json.dumps({"step": "c", "value": "poisoned"}),))
    second = saga.run(plan)
    assert len(calls("effect")) == 2  # a miss: the tool ran again
    assert second.steps["c"]["output"] == first.steps["c"]["output"]
    assert "cache" not in second.steps["c"]


def test_an_expired_cache_entry_is_not_used(saga: Saga) -> None:
    plan = saga.load(chain({"id": "c", "tool": "effect", "args": {"value": 1}, "cache": 300}))
    saga.run(plan)
    saga.cache.clock = lambda: 10**12  # far in the future: every entry has expired
    saga.run(plan)
    assert len(calls("effect")) == 2


# -- bounded repetition --------------------------------------------------------------------

def test_repeat_until_runs_again_until_the_condition_holds(saga: Saga) -> None:
    plan = saga.load(chain({"id": "poll", "tool": "echo",
                            "args": {"n": "{{ iteration }}", "prev": "{{ previous }}"},
                            "until": "output.n >= 3", "max_iterations": 5}))
    run = saga.run(plan)
    assert run.status == "completed"
    assert run.steps["poll"]["output"] == {"n": 3, "prev": {"n": 2, "prev": {"n": 1,
                                                                          "prev": None}}}
    assert [k for k in run.steps if k.startswith("poll[")] == ["poll[1]", "poll[2]", "poll[3]"]


def test_repeat_records_reaching_its_bound(saga: Saga) -> None:
    plan = saga.load(chain({"id": "poll", "tool": "echo", "args": {"n": "{{ iteration }}"},
                            "until": "output.n > 10", "max_iterations": 2}))
    run = saga.run(plan)
    assert run.status == "failed"
    assert run.steps["poll"]["error"]["type"] == "MaxIterationsReached"
    assert "after 2 iterations" in run.steps["poll"]["error"]["message"]


def test_repeat_needs_a_bound(saga: Saga) -> None:
    from saga.errors import DefinitionError

    with pytest.raises(DefinitionError, match="max_iterations"):
        saga.load(chain({"id": "poll", "tool": "echo", "until": "output"}))


def test_a_repeated_group_is_a_nested_composition(saga: Saga) -> None:
    plan = saga.load(chain({"id": "attempt", "use": CHILD, "args": {"who": "try{{ iteration }}"},
                            "until": "output.outputs.made == 'try2'", "max_iterations": 3}))
    run = saga.run(plan)
    assert run.status == "completed"
    assert run.steps["attempt"]["output"]["outputs"] == {"made": "try2"}
    children = saga.status(run.run_id)["children"]
    assert [c["step"] for c in children] == ["attempt[1]", "attempt[2]"]
    assert [c["outputs"] for c in children] == [{"made": "try1"}, {"made": "try2"}]


# -- auto-heal -----------------------------------------------------------------------------

def test_auto_heal_runs_remedies_then_retries(saga: Saga) -> None:
    plan = saga.load(chain({
        "id": "create_branch", "tool": "act", "args": {"fail_times": 1,
                                                        "error_type": "NetworkTimeout"},
        "heal": [
            {"when": "'Auth' in error.type", "do": [{"tool": "kube_login",
                                                      "args": {"cluster": "ephemeral"}}]},
            {"when": "error.type == 'NetworkTimeout'",
             "do": [{"tool": "vpn_connect"},
                    {"tool": "echo", "args": {"why": "{{ error.message }}"}}]},
        ]}))
    run = saga.run(plan)
    assert run.status == "completed"
    assert [c["tool"] for c in standins.CALLS] == ["act", "vpn_connect", "act"]
    events = saga.history(run.run_id)
    heal = next(e for e in events if e["type"] == "HealStarted")["payload"]
    assert heal["handler"] == 1 and heal["attempt"] == 1
    assert heal["remedies"][1] == {"tool": "echo",
                                   "parameters": {"why": "act create_branch failed"}}
    applied = [e["payload"] for e in events if e["type"] == "RemedyApplied"]
    assert [a["index"] for a in applied] == [0, 1] and all(a["ok"] for a in applied)
    assert calls("vpn_connect")[0]["key"] == f"{run.run_id}:create_branch:0:heal0"


def test_auto_heal_is_bounded(saga: Saga) -> None:
    plan = saga.load(chain({
        "id": "flaky", "tool": "act", "args": {"fail": True},
        "heal": [{"when": "true", "do": [{"tool": "vpn_connect"}], "max": 2}]}))
    run = saga.run(plan)
    assert run.status == "failed"
    assert [c["tool"] for c in standins.CALLS] == ["act", "vpn_connect", "act", "vpn_connect",
                                                  "act"]
    assert len([e for e in saga.history(run.run_id) if e["type"] == "HealStarted"]) == 2


# -- secrets -------------------------------------------------------------------------------

def test_secrets_reach_tools_but_never_the_log(saga: Saga, monkeypatch: pytest.MonkeyPatch
                                               ) -> None:
    monkeypatch.setenv("SAGA_SECRET_API_TOKEN", "s3cr3t-t0ken")
    plan = saga.load({"name": "secretive",
                      "inputs": [{"name": "password", "secret": True}, {"name": "user"}],
                      "steps": [
                          {"id": "call", "tool": "effect",
                           "args": {"value": "Bearer {{ secret.API_TOKEN }}",
                                    "pw": "{{ inputs.password }}"}},
                          {"id": "oops", "tool": "fail",
                           "args": {"message": "login failed for {{ inputs.password }}"}}]})
    run = saga.run(plan, {"password": "hunter2", "user": "ada"})
    sent = calls("effect")[0]["params"]
    assert sent == {"value": "Bearer s3cr3t-t0ken", "pw": "hunter2"}
    log = json.dumps(saga.history(run.run_id))
    assert "s3cr3t-t0ken" not in log and "hunter2" not in log
    assert run.inputs == {"password": "«secret:password»", "user": "ada"}
    assert run.steps["call"]["output"] == {"step": "call", "value": "Bearer «secret:API_TOKEN»"}
    assert run.steps["oops"]["error"]["message"] == "login failed for «secret:password»"


def test_a_missing_secret_fails_the_step_clearly(saga: Saga) -> None:
    run = saga.run(saga.load(chain({"id": "a", "tool": "echo",
                                    "args": {"t": "{{ secret.NOT_SET_ANYWHERE_42 }}"}})))
    assert run.status == "failed"
    assert run.steps["a"]["error"]["type"] == "SecretMissing"
    assert "NOT_SET_ANYWHERE_42" in run.steps["a"]["error"]["message"]


def test_rendered_parameters_are_checked_against_the_tool_schema(saga: Saga,
                                                                 tmp_path: Path) -> None:
    plan = saga.load(chain({"id": "w", "tool": "file",
                            "args": {"action": "{{ inputs.action }}",
                                     "path": str(tmp_path / "x.txt"), "content": "hi"}}))
    run = saga.run(plan, {"action": "explode"})
    assert run.status == "failed"
    assert run.steps["w"]["error"]["type"] == "InvalidParameters"
    assert not (tmp_path / "x.txt").exists()


def test_parallel_groups_run_together_in_list_order_mode(saga: Saga) -> None:
    plan = saga.load({"name": "groups", "steps": [
        {"id": "a", "tool": "block", "args": {"seconds": 0.3}, "parallel_group": 1},
        {"id": "b", "tool": "block", "args": {"seconds": 0.3}, "parallel_group": 1},
        {"id": "c", "tool": "effect", "args": {"value": "{{ a.step }}{{ b.step }}"}}]})
    assert plan.levels() == [["a", "b"], ["c"]]
    run = saga.run(plan)
    assert run.status == "completed"
    (a, b) = sorted((c["start"], c["end"]) for c in calls("block"))
    assert b[0] < a[1]  # a and b overlapped
    assert run.steps["c"]["output"]["value"] == "ab"


# -- found by review: rollback beside retries and loops, cancel races, secrets, status --

def test_a_failure_beside_a_pending_retry_still_rolls_back(saga: Saga) -> None:
    plan = saga.load({"name": "stuck", "steps": [
        {"id": "made", "tool": "effect", "args": {"value": 1}, "depends_on": [],
         "compensate": {"tool": "undo", "args": {"what": "made"}}},
        {"id": "a", "tool": "fail", "args": {"message": "boom", "retryable": False},
         "depends_on": ["made"]},
        {"id": "b", "tool": "fail", "args": {"message": "flaky", "times": 1},
         "depends_on": ["made"], "retry": {"max_attempts": 3, "delay": 0.2}}]})
    run = saga.run(plan)
    assert run.status == "compensated"
    assert [c["params"]["what"] for c in standins.CALLS if c["tool"] == "undo"] == ["made"]


def test_a_failure_beside_a_running_loop_still_rolls_back(saga: Saga) -> None:
    plan = saga.load({"name": "stuck-loop", "steps": [
        {"id": "each", "tool": "block", "loop": [1, 2], "args": {"seconds": 0.2},
         "depends_on": []},
        {"id": "bad", "tool": "fail", "args": {"message": "boom"}, "depends_on": []}],
        "error_handling": {"rollback_on_failure": False}})
    run = saga.run(plan)
    assert run.status == "failed" and run.failed_step == "bad"


def test_a_cancel_racing_a_driver_undoes_the_attempt_it_cut_short(
        settings: Settings, registry: Registry) -> None:
    settings = replace(settings, lease_seconds=2)
    driver = Saga(settings, registry=registry, worker="A")
    other = Saga(settings, registry=registry, worker="B")
    plan = driver.load({"name": "race", "steps": [
        {"id": "one", "tool": "effect", "args": {"value": 1},
         "compensate": {"tool": "undo", "args": {"what": "one"}}},
        {"id": "two", "tool": "block", "args": {"seconds": 0.6},
         "compensate": {"tool": "undo", "args": {"what": "two"}}}]})
    run_id = driver.submit(plan).run_id
    outcome: dict[str, Any] = {}

    def drive() -> None:
        try:
            outcome["a"] = driver.drive(driver.get(run_id)).status
        except Exception as e:
            outcome["a"] = type(e).__name__

    thread = threading.Thread(target=drive)
    thread.start()
    time.sleep(0.3)  # "two" is running in the driver
    final = other.cancel(run_id, actor="op", reason="stop")
    thread.join()
    assert outcome["a"] == "cancelled"  # the driver took the cancel in (see incoming)
    assert final.status == "cancelled"
    undone = [c["params"]["what"] for c in standins.CALLS if c["tool"] == "undo"]
    assert sorted(undone) == ["one", "two"]
    assert other.verify(run_id) is None
    driver.close()
    other.close()


def test_retrying_a_failed_loop_retries_its_failed_iterations(saga: Saga) -> None:
    plan = saga.load({"name": "loop-retry", "error_handling": {"rollback_on_failure": False},
                      "steps": [{"id": "each", "tool": "fail", "loop": ["a", "b"],
                                 "args": {"message": "{{ item }}", "times": 1}}]})
    run = saga.run(plan)
    assert run.status == "failed" and run.failed_step == "each"
    run = saga.retry(run.run_id, actor="ops")
    assert run.status == "completed"
    assert [o["attempt"] for o in run.steps["each"]["output"]] == [2, 2]
    assert saga.verify(run.run_id) is None


def test_secrets_stay_out_of_schema_errors_and_the_cache(saga: Saga,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Any) -> None:
    monkeypatch.setenv("SAGA_SECRET_ACTION_SECRET", "hunter2-TOPSECRET")
    bad = saga.run(saga.load({"name": "s", "steps": [
        {"id": "w", "tool": "file", "args": {"action": "{{ secret.ACTION_SECRET }}",
                                              "path": str(tmp_path / "f")}}]}))
    assert bad.steps["w"]["error"]["type"] == "InvalidParameters"
    assert "hunter2" not in json.dumps(saga.history(bad.run_id))
    cached = {"name": "c", "steps": [{"id": "who", "tool": "effect", "cache": 300,
                                      "args": {"value": "{{ secret.WHO }}"}}]}
    monkeypatch.setenv("SAGA_SECRET_WHO", "alice")
    first = saga.run(saga.load(cached))
    monkeypatch.setenv("SAGA_SECRET_WHO", "bob")
    second = saga.run(saga.load(cached))
    assert "cache" not in second.steps["who"] and "cache" not in first.steps["who"]
    assert [c["params"]["value"] for c in standins.CALLS if c["tool"] == "effect"] == [
        "alice", "bob"]


def test_a_secret_input_reaches_a_nested_composition(saga: Saga, tmp_path: Any) -> None:
    child = tmp_path / "child.yaml"
    child.write_text("name: child\ninputs: [{name: token}]\nsteps:\n"
                     "  - {id: use, tool: effect, args: {value: '{{ inputs.token }}'}}\n")
    plan = saga.load({"name": "parent", "inputs": [{"name": "token", "secret": True}],
                      "steps": [{"id": "n", "use": str(child),
                                 "args": {"token": "{{ inputs.token }}"}}]})
    run = saga.run(plan, {"token": "s3cret"})
    assert run.status == "completed"
    assert [c["params"]["value"] for c in standins.CALLS if c["tool"] == "effect"] == ["s3cret"]


def test_status_shows_children_only_for_nested_steps(saga: Saga) -> None:
    run = saga.run(saga.load({"name": "ticket", "steps": [
        {"id": "t", "tool": "echo", "args": {"run_id": "ticket-42"}}]}))
    assert "children" not in saga.status(run.run_id)
