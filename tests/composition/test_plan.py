"""Tests for saga.composition.plan: compiling a composition into its checked graph.

Ordering rules, levels, critical path, and the promise that validation reports every
problem at once, each with its path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from saga.composition.definition import Definition, parse_text
from saga.composition.plan import Plan, compile_plan
from saga.errors import DefinitionError, Problem
from saga.tools import Tool
from tests.composition.test_definition import (
    SEED_001_COMPOSITION,
    SEED_001_DAG,
    SEED_001_STEP,
    SEED_002_PARALLEL,
    SEED_002_START_WORK,
)

SEED_001_TOOLS = {"checkpoint_search", "context_fold", "checkpoint_save"}
START_WORK_TOOLS = {"jira_view_issue", "git_branch_exists", "git_create_branch", "vpn_connect",
                    "kube_login", "jira_transition"}
START_WORK_ORDER = ["get_issue", "build_branch_name", "check_existing_branch", "create_branch",
                    "detect_failure", "fix_vpn", "fix_auth", "retry_create_branch",
                    "transition_issue"]

ONE_ACTION = "a step needs exactly one of 'tool', 'compute', 'use', 'sleep' or 'signal'"


def steps(*specs: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A composition named ``t`` with these steps (a step without an action calls ``t``)."""
    return {"name": "t", "steps": [
        s if "tool" in s or "compute" in s else {**s, "tool": "t"} for s in specs], **extra}


def rejected(data: dict[str, Any], **options: Any) -> list[Problem]:
    """The problems compile_plan raises for ``data`` (it must raise)."""
    with pytest.raises(DefinitionError) as caught:
        compile_plan(data, **options)
    assert caught.value.problems, "a DefinitionError must carry its problems"
    return caught.value.problems


def dependencies(plan: Plan) -> dict[str, list[str]]:
    """Each step's direct dependencies, in plan order."""
    return {step_id: plan.dependencies(step_id) for step_id in plan.order}


# -- the seeds ---------------------------------------------------------------------------


def test_seed_001_compiles_to_search_fold_store() -> None:
    plan = compile_plan(parse_text(SEED_001_COMPOSITION), tools=SEED_001_TOOLS,
                        source="seed001.json")

    assert plan.order == ("search", "fold", "store")
    assert plan.levels() == [["search"], ["fold"], ["store"]]
    assert dependencies(plan) == {"search": [], "fold": ["search"], "store": ["fold"]}
    assert plan.upstream("store") == {"search", "fold"}
    assert plan.critical_path() == ["search", "fold", "store"]
    assert list(plan.steps) == ["search", "fold", "store"]
    assert plan.step("store").output_key == "saved_checkpoint"
    assert plan.definition.error_handling.failure_strategy == "partial_success"
    assert plan.definition.metadata["author"] == "contextd"


def test_seed_001_needs_its_three_tools() -> None:
    problems = rejected(parse_text(SEED_001_COMPOSITION),
                        tools={"checkpoint_search", "context_fold"})

    assert problems == [Problem("steps[2].tool", "unknown tool 'checkpoint_save'; "
                                                 "did you mean 'checkpoint_search'?")]


def test_seed_001_dag_example_levels() -> None:
    plan = compile_plan({"name": "dag", **json.loads(SEED_001_DAG)},
                        tools={"tool_a", "tool_b", "tool_c"})

    assert plan.order == ("step1", "step2", "step3")
    assert plan.levels() == [["step1"], ["step2"], ["step3"]]
    assert plan.dependencies("step3") == ["step1", "step2"]
    assert plan.dependencies("step2") == ["step1"]
    assert plan.dependencies("step1") == []


def test_seed_001_step_definition_example_in_a_composition() -> None:
    data = steps({"id": "step_id_1", "output_key": "variable_reference", "timeout_ms": 100},
                 {"id": "step_id_2", "depends_on": [], "timeout_ms": 200},
                 json.loads(SEED_001_STEP))

    plan = compile_plan(data, tools={"t", "tool_name"})

    assert plan.levels() == [["step_id_1", "step_id_2"], ["unique_step_identifier"]]
    assert plan.dependencies("unique_step_identifier") == ["step_id_1", "step_id_2"]
    assert plan.step("unique_step_identifier").retry_count == 1
    assert plan.step("unique_step_identifier").timeout_seconds == 5.0


def test_seed_002_start_work_runs_in_list_order() -> None:
    plan = compile_plan(parse_text(SEED_002_START_WORK), tools=START_WORK_TOOLS,
                        source="start_work.yaml")

    assert list(plan.order) == START_WORK_ORDER
    assert plan.levels() == [[step_id] for step_id in START_WORK_ORDER]
    assert dependencies(plan) == {
        step_id: START_WORK_ORDER[i - 1:i] for i, step_id in enumerate(START_WORK_ORDER)}
    assert plan.upstream("transition_issue") == set(START_WORK_ORDER[:-1])


def test_seed_002_aliases_survive_compilation() -> None:
    plan = compile_plan(parse_text(SEED_002_START_WORK), tools=START_WORK_TOOLS)

    assert plan.step("get_issue").parameters == {"issue_key": "{{ inputs.issue_key }}"}
    assert plan.step("get_issue").key == "issue_data"
    assert plan.step("build_branch_name").key == "branch_name"
    assert plan.step("fix_vpn").condition == "failure_info and failure_info.get('needs_vpn')"
    assert plan.definition.outputs == {
        "branch": "{{ branch_name }}", "issue": "{{ issue_data }}", "success": True}
    assert plan.definition.author == "AI Workflow"
    assert [c.step for c in plan.definition.confirmations] == ["create_branch"]


def test_seed_002_with_when_args_and_output_spellings_compiles_the_same() -> None:
    data = parse_text(SEED_002_START_WORK)
    for step in data["steps"]:
        if "condition" in step:
            step["when"] = step.pop("condition")
    plan = compile_plan(data, tools=START_WORK_TOOLS)

    reference = compile_plan(parse_text(SEED_002_START_WORK), tools=START_WORK_TOOLS)
    assert plan.definition == reference.definition
    assert plan.definition.digest() == reference.definition.digest()


def test_seed_002_names_the_missing_stand_in_tools() -> None:
    problems = rejected(parse_text(SEED_002_START_WORK),
                        tools=START_WORK_TOOLS - {"vpn_connect", "git_create_branch"})

    assert problems == [
        Problem("steps[3].tool", "unknown tool 'git_create_branch'"),
        Problem("steps[5].tool", "unknown tool 'vpn_connect'"),
        Problem("steps[7].tool", "unknown tool 'git_create_branch'"),
    ]


def test_seed_002_parallel_group_example() -> None:
    plan = compile_plan({"name": "parallel", **parse_text(SEED_002_PARALLEL)})

    assert plan.levels() == [["step_a", "step_b"], ["step_c"]]
    assert plan.dependencies("step_c") == ["step_a", "step_b"]


# -- ordering rules ----------------------------------------------------------------------


def test_without_depends_on_steps_chain_in_list_order() -> None:
    plan = compile_plan(steps({"id": "c"}, {"id": "a"}, {"id": "b"}))

    assert plan.order == ("c", "a", "b")
    assert plan.levels() == [["c"], ["a"], ["b"]]
    assert dependencies(plan) == {"c": [], "a": ["c"], "b": ["a"]}


def test_consecutive_parallel_group_steps_share_a_level() -> None:
    plan = compile_plan(steps(
        {"id": "first"},
        {"id": "b1", "parallel_group": 1},
        {"id": "b2", "parallel_group": 1},
        {"id": "b3", "parallel_group": 1},
        {"id": "middle"},
        {"id": "g1", "parallel_group": "fanout"},
        {"id": "g2", "parallel_group": "fanout"},
        {"id": "h1", "parallel_group": "other"},
        {"id": "last"},
    ))

    assert plan.levels() == [
        ["first"], ["b1", "b2", "b3"], ["middle"], ["g1", "g2"], ["h1"], ["last"]]
    assert dependencies(plan) == {
        "first": [], "b1": ["first"], "b2": ["first"], "b3": ["first"],
        "middle": ["b1", "b2", "b3"], "g1": ["middle"], "g2": ["middle"],
        "h1": ["g1", "g2"], "last": ["h1"]}


def test_a_parallel_group_split_by_another_step_is_two_groups() -> None:
    plan = compile_plan(steps({"id": "a", "parallel_group": 1}, {"id": "b"},
                              {"id": "c", "parallel_group": 1}, {"id": "d", "parallel_group": 1}))

    assert plan.levels() == [["a"], ["b"], ["c", "d"]]


def test_a_leading_parallel_group_is_the_first_level() -> None:
    plan = compile_plan(steps({"id": "a", "parallel_group": "g"},
                              {"id": "b", "parallel_group": "g"}, {"id": "c"}))

    assert plan.levels() == [["a", "b"], ["c"]]
    assert plan.dependencies("c") == ["a", "b"]


def test_any_depends_on_makes_the_graph_explicit() -> None:
    plan = compile_plan(steps({"id": "a"}, {"id": "b", "depends_on": []}, {"id": "c"},
                              {"id": "d", "depends_on": ["a", "c"]}))

    assert plan.definition.explicit_graph is True
    assert plan.levels() == [["a", "b", "c"], ["d"]]
    assert dependencies(plan) == {"a": [], "b": [], "c": [], "d": ["a", "c"]}


def test_an_empty_depends_on_alone_makes_every_step_a_root() -> None:
    plan = compile_plan(steps({"id": "a"}, {"id": "b"}, {"id": "c", "depends_on": []}))

    assert plan.levels() == [["a", "b", "c"]]


def test_explicit_graph_ignores_parallel_groups_for_ordering() -> None:
    plan = compile_plan(steps({"id": "a", "parallel_group": 1}, {"id": "b", "parallel_group": 2},
                              {"id": "c", "depends_on": ["b"]}))

    assert plan.levels() == [["a", "b"], ["c"]]


def test_order_follows_the_list_among_ready_steps() -> None:
    plan = compile_plan(steps({"id": "z", "depends_on": ["m"]}, {"id": "m", "depends_on": []},
                              {"id": "a", "depends_on": []}))

    assert plan.order == ("m", "z", "a")
    assert plan.levels() == [["m", "a"], ["z"]]


def test_a_built_definition_compiles_like_its_data() -> None:
    definition = compile_plan(parse_text(SEED_002_START_WORK), tools=START_WORK_TOOLS).definition

    from_model = compile_plan(definition, tools=START_WORK_TOOLS)

    assert from_model.levels() == [[step_id] for step_id in START_WORK_ORDER]
    assert from_model.order == tuple(START_WORK_ORDER)


def test_a_built_definition_keeps_parallel_groups() -> None:
    data = steps({"id": "a"}, {"id": "b", "parallel_group": 1}, {"id": "c", "parallel_group": 1},
                 {"id": "d"})

    from_model = compile_plan(Definition.model_validate(data))

    assert from_model.levels() == compile_plan(data).levels() == [["a"], ["b", "c"], ["d"]]


# -- every problem at once ---------------------------------------------------------------


EVERYTHING_WRONG: dict[str, Any] = {
    "name": "everything-wrong",
    "inputs": [
        {"name": "code", "pattern": "([a-z"},
        {"name": "kind", "default": "other", "enum": ["a", "b"]},
        {"name": "count", "type": "decimal"},
    ],
    "steps": [
        {"id": "a", "tool": "t", "depends_on": ["b"]},                               # 0
        {"id": "b", "tool": "t", "depends_on": ["a"]},                               # 1
        {"id": "c", "tool": "t", "depends_on": ["ghost"]},                           # 2
        {"id": "a", "tool": "t", "depends_on": []},                                  # 3
        {"id": "root", "tool": "nope", "depends_on": [],                             # 4
         "parameters": {"x": "{{ later.x }}", "y": "{{ mystery }}"}},
        {"id": "typo", "tool": "t", "depend_on": ["root"]},                          # 5
        {"id": "bad_policy", "tool": "t", "on_error": "explode", "depends_on": []},  # 6
        {"id": "both", "tool": "t", "compute": "result = 1", "depends_on": []},      # 7
        {"id": "later", "tool": "t", "depends_on": ["root"]},                        # 8
    ],
}


def test_every_problem_is_reported_together_with_its_path() -> None:
    with pytest.raises(DefinitionError) as caught:
        compile_plan(EVERYTHING_WRONG, tools={"t"}, source="wrong.yaml")

    found = {(p.path, p.message) for p in caught.value.problems}
    paths = {p.path for p in caught.value.problems}
    assert ("steps[3].id", "duplicate id 'a' (first at steps[0])") in found
    assert ("steps[2].depends_on", "unknown step 'ghost'") in found
    assert ("steps", "dependency cycle: a -> b -> a") in found
    assert ("steps[5].depend_on", "unknown key (not part of the composition language); "
                                  "did you mean 'depends_on'?") in found
    assert ("steps[6].on_error", "must be fail, continue, compensate or retry:N") in found
    assert ("steps[7]", ONE_ACTION) in found
    assert ("inputs[1]", "default 'other' is invalid: must be one of ['a', 'b']") in found
    assert {"inputs[0].pattern", "inputs[2].type"} <= paths
    assert ("steps[4].tool", "unknown tool 'nope'") in found
    assert ("steps[4].parameters", "references step 'later', which is not upstream "
                                   "(add it to depends_on)") in found
    assert ("steps[4].parameters", "unknown name 'mystery'") in found
    assert len(caught.value.problems) == 12
    assert str(caught.value).startswith("wrong.yaml is invalid for 12 reasons: ")


def test_model_and_graph_problems_are_reported_together() -> None:
    data = {**EVERYTHING_WRONG, "steps": [
        s for s in EVERYTHING_WRONG["steps"] if s["id"] not in ("root", "later")]}

    problems = rejected(data, tools={"t"})

    assert sorted(problems, key=lambda p: p.path) == [
        Problem("inputs[0].pattern",
                "pattern does not compile: unterminated character set at position 1"),
        Problem("inputs[1]", "default 'other' is invalid: must be one of ['a', 'b']"),
        Problem("inputs[2].type", "Input should be 'string', 'integer', 'number', 'boolean', "
                                  "'array', 'object' or 'any'"),
        Problem("steps", "dependency cycle: a -> b -> a"),
        Problem("steps[2].depends_on", "unknown step 'ghost'"),
        Problem("steps[3].id", "duplicate id 'a' (first at steps[0])"),
        Problem("steps[4].depend_on", "unknown key (not part of the composition language); "
                                      "did you mean 'depends_on'?"),
        Problem("steps[5].on_error", "must be fail, continue, compensate or retry:N"),
        Problem("steps[6]", ONE_ACTION),
    ]


def test_tool_and_reference_problems_are_reported_together() -> None:
    data = steps(
        {"id": "root", "tool": "nope", "depends_on": [],
         "parameters": {"x": "{{ later.x }}", "y": "{{ mystery }}", "z": "{{ steps.later }}"}},
        {"id": "later", "depends_on": [], "compensate": {"tool": "gone", "args": {"a": 1}}},
        {"id": "ok", "depends_on": ["later"], "parameters": {"x": "{{ later.x }}"}},
    )

    assert rejected(data, tools={"t"}) == [
        Problem("steps[0].tool", "unknown tool 'nope'"),
        Problem("steps[0].parameters",
                "references step 'later', which is not upstream (add it to depends_on)"),
        Problem("steps[0].parameters", "unknown name 'mystery'"),
        Problem("steps[0].parameters",
                "references step 'later', which is not upstream (add it to depends_on)"),
        Problem("steps[1].compensate.tool", "unknown tool 'gone'"),
    ]


def test_a_cycle_does_not_hide_reference_problems_elsewhere() -> None:
    data = steps({"id": "a", "depends_on": ["b"]}, {"id": "b", "depends_on": ["a"]},
                 {"id": "root", "depends_on": [], "parameters": {"x": "{{ mystery }}"}})

    assert rejected(data) == [
        Problem("steps", "dependency cycle: a -> b -> a"),
        Problem("steps[2].parameters", "unknown name 'mystery'"),
    ]


def test_a_longer_cycle_is_printed_whole() -> None:
    data = steps({"id": "a", "depends_on": ["c"]}, {"id": "b", "depends_on": ["a"]},
                 {"id": "c", "depends_on": ["b"]}, {"id": "free", "depends_on": []})

    assert rejected(data) == [Problem("steps", "dependency cycle: a -> b -> c -> a")]


def test_a_step_cannot_depend_on_itself() -> None:
    assert rejected(steps({"id": "a", "depends_on": ["a"]})) == [
        Problem("steps[0].depends_on", "a step cannot depend on itself")]


def test_unknown_tools_are_only_checked_when_tools_are_given() -> None:
    data = steps({"id": "a", "tool": "anything"})

    assert compile_plan(data).order == ("a",)
    assert rejected(data, tools=set()) == [Problem("steps[0].tool", "unknown tool 'anything'")]


def _call(params: dict[str, Any], ctx: Any) -> None:
    """The function behind the tools below (never called: compiling runs nothing)."""


def _undo(params: dict[str, Any], output: Any, ctx: Any) -> None:
    """The compensation behind the tools below (never called either)."""


@dataclass(frozen=True)
class SchemaTool(Tool):
    """A registered tool that also checks its parameters, as compile_plan allows."""

    required: tuple[str, ...] = ()

    def check_parameters(self, params: dict[str, Any]) -> list[str]:
        return [f"missing parameter {name!r}" for name in self.required if name not in params]


def test_compensate_true_needs_a_tool_with_its_own_compensation() -> None:
    tools = {"save": Tool("save", _call, compensate=_undo), "plain": Tool("plain", _call)}
    data = steps({"id": "a", "tool": "save", "compensate": True},
                 {"id": "b", "tool": "plain", "compensate": True},
                 {"id": "c", "tool": "plain", "compensate": "save"})

    assert rejected(data, tools=tools) == [
        Problem("steps[1].compensate", "tool 'plain' has no compensation of its own")]
    assert compile_plan(data, tools=set(tools)).order == ("a", "b", "c")


def test_tool_parameter_schemas_are_checked_at_compile_time() -> None:
    tools = {"send": SchemaTool("send", _call, required=("to", "body")),
             "undo": SchemaTool("undo", _call, required=("id",))}
    data = steps({"id": "a", "tool": "send", "args": {"to": "x"},
                  "compensate": {"tool": "undo", "args": {"key": "{{ output.id }}"}}},
                 {"id": "b", "tool": "send", "args": {"to": "y", "body": "{{ a }}"}},
                 {"id": "c", "tool": "gone"})

    assert rejected(data, tools=tools) == [
        Problem("steps[0].parameters", "missing parameter 'body'"),
        Problem("steps[0].compensate.parameters", "missing parameter 'id'"),
        Problem("steps[2].tool", "unknown tool 'gone'"),
    ]


def test_paths_count_malformed_steps_too() -> None:
    data = {"name": "t", "steps": [
        {"tool": "t"},
        {"id": "a", "tool": "t", "depends_on": ["ghost"]},
        {"id": "a", "tool": "t"},
    ]}

    assert rejected(data) == [
        Problem("steps[0].id", "Field required"),
        Problem("steps[2].id", "duplicate id 'a' (first at steps[1])"),
        Problem("steps[1].depends_on", "unknown step 'ghost'"),
    ]


def test_not_a_mapping_of_steps_is_reported_not_crashed() -> None:
    assert [p.path for p in rejected({"name": "t", "steps": "all of them"})] == ["steps"]
    assert [p.path for p in rejected({"name": "t", "steps": ["x", 3]})] == [
        "steps[0]", "steps[1]"]


# -- references in templates, conditions and compute ------------------------------------


def test_condition_and_compute_may_read_base_names_and_upstream_steps() -> None:
    data = steps(
        {"id": "fetch", "output": "data"},
        {"id": "shape", "compute": "result = [data, steps.fetch, steps['fetch'], inputs.q, "
                                   "input.q, context.actor, len(data)]",
         "when": "data and steps.fetch and inputs.q and input.q and context.actor"},
        {"id": "use", "when": "{{ shape and fetch }}", "args": {"v": "{{ steps.shape }}"}},
    )

    plan = compile_plan(data)

    assert plan.order == ("fetch", "shape", "use")


def test_compute_names_bound_inside_the_block_are_not_references() -> None:
    data = steps({"id": "items"}, {"id": "calc", "compute": (
        "total = 0\nfor item in items:\n    total += item\n"
        "evens = [x for x in range(10) if x % 2 == 0]\nresult = total + len(evens)")})

    assert compile_plan(data).order == ("items", "calc")


@pytest.mark.parametrize(("part", "text"), [
    ("condition", "later"),
    ("condition", "steps.later"),
    ("condition", "{{ later.ok }}"),
    ("compute", "result = later"),
    ("compute", "result = steps.later"),
    ("compute", "result = steps['later']['x']"),
    ("parameters", {"x": "{{ later }}"}),
    ("parameters", {"x": ["{{ steps.later.x }}"]}),
])
def test_reading_a_step_that_is_not_upstream_is_a_problem(part: str, text: Any) -> None:
    first: dict[str, Any] = {"id": "first", part: text}
    if part != "compute":
        first["tool"] = "t"
    data = steps(first, {"id": "later"})

    assert rejected(data) == [Problem(
        f"steps[0].{part}",
        "references step 'later', which is not upstream (add it to depends_on)")]


@pytest.mark.parametrize(("part", "text", "message"), [
    ("condition", "unknown_thing > 1", "unknown name 'unknown_thing'"),
    ("compute", "result = nobody", "unknown name 'nobody'"),
    ("condition", "steps.ghost", "references unknown step 'ghost'"),
    ("compute", "result = steps.ghost", "references unknown step 'ghost'"),
])
def test_reading_unknown_names_is_a_problem(part: str, text: str, message: str) -> None:
    step: dict[str, Any] = {"id": "only", part: text}
    if part != "compute":
        step["tool"] = "t"

    assert rejected(steps(step)) == [Problem(f"steps[0].{part}", message)]


def test_a_sibling_in_an_explicit_graph_is_not_upstream() -> None:
    data = steps({"id": "a", "depends_on": []}, {"id": "b", "depends_on": []},
                 {"id": "c", "depends_on": ["a"], "when": "b"})

    assert rejected(data) == [Problem(
        "steps[2].condition", "references step 'b', which is not upstream (add it to depends_on)")]


def test_transitive_upstream_steps_may_be_read() -> None:
    data = steps({"id": "a", "depends_on": []}, {"id": "b", "depends_on": ["a"]},
                 {"id": "c", "depends_on": ["b"], "when": "a and steps.a",
                  "args": {"x": "{{ a }}"}})

    assert compile_plan(data).levels() == [["a"], ["b"], ["c"]]


def test_outputs_may_read_any_step_but_not_unknown_names() -> None:
    data = steps({"id": "a", "depends_on": []}, {"id": "b", "depends_on": [], "output": "bee"},
                 outputs={"all": "{{ a }} {{ bee }} {{ steps.b }}", "flag": True, "n": 3})
    assert compile_plan(data).definition.outputs == {
        "all": "{{ a }} {{ bee }} {{ steps.b }}", "flag": True, "n": 3}

    data["outputs"] = {"x": "{{ nothing }}", "y": "{{ steps.ghost }}"}
    assert rejected(data) == [
        Problem("outputs.x", "unknown name 'nothing'"),
        Problem("outputs.y", "references unknown step 'ghost'"),
    ]


def test_plain_text_that_mentions_steps_is_not_a_reference() -> None:
    data = steps({"id": "docs", "args": {"path": "docs/steps.md", "note": "see steps.below"}},
                 {"id": "calc", "compute": "result = 'steps.md'"},
                 outputs={"readme": "docs/steps.md"})

    assert compile_plan(data).order == ("docs", "calc")


def test_compensation_may_read_its_own_output_parameters_and_error() -> None:
    data = steps({"id": "reserve", "output": "booking", "compensate": {"tool": "undo", "args": {
        "id": "{{ output.id }}", "same": "{{ booking.id }}", "was": "{{ parameters.seat }}",
        "why": "{{ error }}", "me": "{{ steps.reserve }}"}}})
    assert compile_plan(data, tools={"t", "undo"}).order == ("reserve",)

    data["steps"].append({"id": "after", "tool": "t"})
    data["steps"][0]["compensate"]["args"] = {"x": "{{ after }}"}
    assert rejected(data) == [Problem(
        "steps[0].compensate.parameters",
        "references step 'after', which is not upstream (add it to depends_on)")]


def test_template_syntax_and_sandbox_problems_are_reported() -> None:
    data = steps({"id": "a", "args": {"x": "{{ a. }}", "y": "{{ a.__class__ }}"}},
                 {"id": "b", "compute": "import os\nresult = 1"},
                 {"id": "c", "when": "b and"})

    problems = rejected(data)

    assert [p.path for p in problems] == [
        "steps[0].parameters", "steps[0].parameters", "steps[1].compute", "steps[2].condition"]
    assert problems[0].message.startswith("invalid template '{{ a. }}': ")
    assert problems[1].message == (
        "attribute '__class__' is not allowed in template '{{ a.__class__ }}'")
    assert problems[2].message == ("import of 'os' is not allowed (a compute block may import "
                                   "datetime, json, math, re) (line 1)")
    assert problems[3].message.startswith("syntax error: ")


def test_output_names_must_be_free_and_unique() -> None:
    data = steps({"id": "a", "output": "inputs"}, {"id": "b", "output": "shared"},
                 {"id": "c", "output": "shared"})

    assert rejected(data) == [
        Problem("steps[0]", "output name 'inputs' is reserved"),
        Problem("steps[2].output_key", "output name 'shared' is already used by step 'b'"),
    ]


def test_confirmations_must_name_a_step() -> None:
    data = steps({"id": "a"}, confirmations=[{"step": "a"}, {"step": "ghost", "message": "?"}])

    assert rejected(data) == [Problem("confirmations[1].step", "unknown step 'ghost'")]


# -- critical path -----------------------------------------------------------------------


def test_critical_path_follows_the_slow_branch_of_a_diamond() -> None:
    def diamond(left_ms: int, right_ms: int) -> Plan:
        return compile_plan(steps(
            {"id": "start", "depends_on": [], "timeout_ms": 100},
            {"id": "left", "depends_on": ["start"], "timeout_ms": left_ms},
            {"id": "right", "depends_on": ["start"], "timeout_ms": right_ms},
            {"id": "join", "depends_on": ["left", "right"], "timeout_ms": 100},
        ))

    assert diamond(5000, 50).critical_path() == ["start", "left", "join"]
    assert diamond(50, 5000).critical_path() == ["start", "right", "join"]
    assert diamond(50, 5000).levels() == [["start"], ["left", "right"], ["join"]]


def test_critical_path_weighs_timeout_seconds_like_timeout_ms() -> None:
    plan = compile_plan(steps({"id": "start", "depends_on": []},
                              {"id": "ms", "depends_on": ["start"], "timeout_ms": 2000},
                              {"id": "seconds", "depends_on": ["start"], "timeout": 3}))

    assert plan.critical_path() == ["start", "seconds"]


def test_critical_path_counts_the_slow_root() -> None:
    plan = compile_plan(steps({"id": "fast_root", "depends_on": [], "timeout_ms": 10},
                              {"id": "slow_root", "depends_on": [], "timeout_ms": 90_000},
                              {"id": "join", "depends_on": ["fast_root", "slow_root"]}))

    assert plan.critical_path() == ["slow_root", "join"]


def test_critical_path_of_independent_steps_is_the_slowest_one() -> None:
    plan = compile_plan(steps({"id": "fast", "depends_on": [], "timeout_ms": 10},
                              {"id": "slow", "depends_on": [], "timeout_ms": 90_000}))

    assert plan.critical_path() == ["slow"]


def test_critical_path_of_a_single_step() -> None:
    assert compile_plan(steps({"id": "only"})).critical_path() == ["only"]
