"""Tests for saga.definition: the models users write, loading, inputs and the digest.

The seed documents' examples are copied verbatim from /work/shared/seeds so that the
formats users already wrote keep loading exactly as written.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from saga.composition.definition import (
    Confirmation,
    Definition,
    ErrorHandling,
    InputSpec,
    RetryPolicy,
    Step,
    ToolCall,
    build,
    check_value,
    coerce_text,
    definition_hash,
    load_file,
    parse_text,
    resolve_inputs,
)
from saga.errors import DefinitionError, InputError, Problem

#: Seed 001, "Composition Structure": the search -> fold -> store workflow, verbatim.
SEED_001_COMPOSITION = r'''
{
  "name": "search-fold-store-workflow",
  "description": "Search for context, fold it, then store the result",
  "version": "1.0.0",
  "steps": [
    {
      "id": "search",
      "tool": "checkpoint_search",
      "parameters": {
        "query": "{{input.query}}",
        "top_k": 10
      },
      "output_key": "search_results"
    },
    {
      "id": "fold",
      "tool": "context_fold",
      "parameters": {
        "content": "{{search_results.content}}",
        "strategy": "abstractive",
        "target_ratio": 0.6
      },
      "depends_on": ["search"],
      "output_key": "folded_content"
    },
    {
      "id": "store",
      "tool": "checkpoint_save",
      "parameters": {
        "summary": "{{folded_content.summary}}",
        "content": "{{folded_content.folded}}",
        "tags": ["folded", "auto-generated"]
      },
      "depends_on": ["fold"],
      "output_key": "saved_checkpoint"
    }
  ],
  "error_handling": {
    "max_retries": 2,
    "rollback_on_failure": true,
    "failure_strategy": "partial_success"
  },
  "metadata": {
    "author": "contextd",
    "tags": ["search", "folding", "storage"],
    "estimated_duration_ms": 500
  }
}
'''

#: Seed 001, "Step Definition": the shape of one step, verbatim.
SEED_001_STEP = r'''
{
  "id": "unique_step_identifier",
  "tool": "tool_name",
  "parameters": {
    "param1": "value1",
    "param2": "{{variable_reference}}"
  },
  "depends_on": ["step_id_1", "step_id_2"],
  "output_key": "result_variable_name",
  "timeout_ms": 5000,
  "retry_count": 1
}
'''

#: Seed 001, "Dependency Resolution": the step1/step2/step3 DAG, verbatim (a fragment: no name).
SEED_001_DAG = r'''
{
  "steps": [
    {
      "id": "step1",
      "tool": "tool_a"
    },
    {
      "id": "step2",
      "tool": "tool_b",
      "depends_on": ["step1"]
    },
    {
      "id": "step3",
      "tool": "tool_c",
      "depends_on": ["step1", "step2"]
    }
  ]
}
'''

#: Seed 002, "Complete Skill Definition": the start_work skill, verbatim.
SEED_002_START_WORK = r'''
# Skill metadata
name: start_work
description: Begin work on a Jira issue with branch creation
version: "1.0"
author: "AI Workflow"

# Input parameters
inputs:
  - name: issue_key
    type: string
    required: true
    description: Jira issue key (e.g., AAP-12345)
    pattern: "^[A-Z]+-\\d+$"

  - name: branch_prefix
    type: string
    required: false
    default: "feature"
    enum: ["feature", "fix", "hotfix", "chore"]

# Execution steps
steps:
  # Step 1: Tool call
  - id: get_issue
    tool: jira_view_issue
    args:
      issue_key: "{{ inputs.issue_key }}"
    output: issue_data
    on_error: fail

  # Step 2: Compute step (Python evaluation)
  - id: build_branch_name
    compute: |
      issue_type = issue_data.get("type", "task").lower()
      summary = issue_data.get("summary", "work")[:40]
      slug = summary.lower().replace(" ", "-").replace("/", "-")
      result = f"{inputs.branch_prefix}/{inputs.issue_key}-{slug}"
    output: branch_name

  # Step 3: Conditional step
  - id: check_existing_branch
    tool: git_branch_exists
    args:
      branch: "{{ branch_name }}"
    on_error: continue

  # Step 4: Skip if branch exists
  - id: create_branch
    condition: "not check_existing_branch or '✅' not in str(check_existing_branch)"
    tool: git_create_branch
    args:
      branch: "{{ branch_name }}"
      from_branch: main
    on_error: continue

  # ========== AUTO-HEAL PATTERN ==========
  - id: detect_failure
    condition: "create_branch and '❌' in str(create_branch)"
    compute: |
      error_text = str(create_branch)[:300].lower()
      result = {
        "needs_vpn": any(x in error_text for x in ['no route', 'timeout', 'network']),
        "needs_auth": any(x in error_text for x in ['unauthorized', '401', 'forbidden']),
      }
    output: failure_info

  - id: fix_vpn
    condition: "failure_info and failure_info.get('needs_vpn')"
    tool: vpn_connect
    on_error: continue

  - id: fix_auth
    condition: "failure_info and failure_info.get('needs_auth')"
    tool: kube_login
    args:
      cluster: ephemeral
    on_error: continue

  - id: retry_create_branch
    condition: "failure_info"
    tool: git_create_branch
    args:
      branch: "{{ branch_name }}"
      from_branch: main
    output: create_branch_retry
  # ========== END AUTO-HEAL ==========

  # Step 5: Update Jira
  - id: transition_issue
    tool: jira_transition
    args:
      issue_key: "{{ inputs.issue_key }}"
      status: "In Progress"

# Output definition
outputs:
  branch: "{{ branch_name }}"
  issue: "{{ issue_data }}"
  success: true

# Optional: Confirmation prompts
confirmations:
  - step: create_branch
    message: "Create branch {{ branch_name }}?"
    default: true
'''

#: Seed 002, "Parallel Step Execution": parallel_group plus depends_on, verbatim (a fragment).
SEED_002_PARALLEL = r'''
steps:
  - id: step_a
    tool: tool_a
    parallel_group: 1

  - id: step_b
    tool: tool_b
    parallel_group: 1  # Runs parallel with step_a

  - id: step_c
    tool: tool_c
    depends_on: [step_a, step_b]  # Waits for both
'''

ONE_ACTION = "a step needs exactly one of 'tool', 'compute', 'use', 'sleep' or 'signal'"


def built(data: dict[str, Any]) -> Definition:
    """The Definition for ``data``, failing the test with every problem if it is invalid."""
    definition, problems = build(data)
    assert problems == []
    assert definition is not None
    return definition


def problems_of(data: dict[str, Any]) -> list[Problem]:
    """The model problems ``build`` finds in ``data`` (the definition must be rejected)."""
    definition, problems = build(data)
    assert definition is None
    return problems


def one_step(**step: Any) -> dict[str, Any]:
    """A minimal composition around one step."""
    return {"name": "one", "steps": [{"id": "only", **step}]}


# -- seed 001: the JSON step format ------------------------------------------------------


def test_seed_001_composition_reads_every_field_as_written() -> None:
    definition = built(parse_text(SEED_001_COMPOSITION, "seed001.json"))

    assert definition.name == "search-fold-store-workflow"
    assert definition.description == "Search for context, fold it, then store the result"
    assert definition.version == "1.0.0"
    assert [s.id for s in definition.steps] == ["search", "fold", "store"]
    assert [s.tool for s in definition.steps] == [
        "checkpoint_search", "context_fold", "checkpoint_save"]
    assert [s.key for s in definition.steps] == [
        "search_results", "folded_content", "saved_checkpoint"]
    assert [s.depends_on for s in definition.steps] == [None, ["search"], ["fold"]]
    assert definition.explicit_graph is True
    assert definition.step("fold").parameters == {
        "content": "{{search_results.content}}", "strategy": "abstractive", "target_ratio": 0.6}
    assert definition.step("store").parameters["tags"] == ["folded", "auto-generated"]


def test_seed_001_error_handling_values_are_read() -> None:
    definition = built(parse_text(SEED_001_COMPOSITION))

    assert definition.error_handling == ErrorHandling(
        max_retries=2, rollback_on_failure=True, failure_strategy="partial_success")
    assert definition.error_handling.max_retries == 2
    assert definition.error_handling.rollback_on_failure is True
    assert definition.error_handling.failure_strategy == "partial_success"


def test_error_handling_defaults_and_unknown_strategy() -> None:
    assert built(one_step(tool="t")).error_handling == ErrorHandling(
        max_retries=0, rollback_on_failure=True, failure_strategy="fail_fast")

    data = {**one_step(tool="t"), "error_handling": {"failure_strategy": "give_up"}}
    assert [p.path for p in problems_of(data)] == ["error_handling.failure_strategy"]


def test_seed_001_metadata_is_kept_unchanged() -> None:
    definition = built(parse_text(SEED_001_COMPOSITION))

    assert definition.metadata == {
        "author": "contextd",
        "tags": ["search", "folding", "storage"],
        "estimated_duration_ms": 500,
    }
    assert definition.to_json()["metadata"] == definition.metadata


def test_seed_001_step_definition_example() -> None:
    step = Step.model_validate(json.loads(SEED_001_STEP))

    assert step.id == "unique_step_identifier"
    assert step.tool == "tool_name"
    assert step.parameters == {"param1": "value1", "param2": "{{variable_reference}}"}
    assert step.depends_on == ["step_id_1", "step_id_2"]
    assert step.output_key == "result_variable_name"
    assert step.key == "result_variable_name"
    assert step.timeout_ms == 5000
    assert step.timeout_seconds == 5.0
    assert step.retry_count == 1
    assert step.on_error == "fail"


def test_seed_001_dag_fragment_needs_only_a_name() -> None:
    fragment = json.loads(SEED_001_DAG)
    assert [p.path for p in problems_of(fragment)] == ["name"]

    definition = built({"name": "dag", **fragment})
    assert [(s.id, s.tool, s.depends_on) for s in definition.steps] == [
        ("step1", "tool_a", None),
        ("step2", "tool_b", ["step1"]),
        ("step3", "tool_c", ["step1", "step2"]),
    ]


# -- seed 002: the YAML step format ------------------------------------------------------


def test_seed_002_start_work_reads_every_field_as_written() -> None:
    definition = built(parse_text(SEED_002_START_WORK, "start_work.yaml"))

    assert definition.name == "start_work"
    assert definition.description == "Begin work on a Jira issue with branch creation"
    assert definition.version == "1.0"
    assert definition.author == "AI Workflow"
    assert definition.explicit_graph is False
    assert [s.id for s in definition.steps] == [
        "get_issue", "build_branch_name", "check_existing_branch", "create_branch",
        "detect_failure", "fix_vpn", "fix_auth", "retry_create_branch", "transition_issue"]
    assert definition.outputs == {
        "branch": "{{ branch_name }}", "issue": "{{ issue_data }}", "success": True}
    assert definition.confirmations == [
        Confirmation(step="create_branch", message="Create branch {{ branch_name }}?",
                     default=True)]


def test_seed_002_inputs_are_typed_as_written() -> None:
    definition = built(parse_text(SEED_002_START_WORK))

    issue_key, branch_prefix = definition.inputs
    assert issue_key == InputSpec(name="issue_key", type="string", required=True,
                                  description="Jira issue key (e.g., AAP-12345)",
                                  pattern=r"^[A-Z]+-\d+$")
    assert branch_prefix == InputSpec(name="branch_prefix", type="string", required=False,
                                      default="feature",
                                      enum=["feature", "fix", "hotfix", "chore"])


def test_seed_002_aliases_map_to_canonical_fields() -> None:
    definition = built(parse_text(SEED_002_START_WORK))

    get_issue = definition.step("get_issue")
    assert get_issue.parameters == {"issue_key": "{{ inputs.issue_key }}"}
    assert get_issue.output_key == "issue_data"
    assert get_issue.on_error == "fail"
    build_branch = definition.step("build_branch_name")
    assert build_branch.tool is None
    assert build_branch.compute is not None
    assert build_branch.compute.startswith('issue_type = issue_data.get("type", "task")')
    assert build_branch.key == "branch_name"
    assert definition.step("check_existing_branch").key == "check_existing_branch"
    create = definition.step("create_branch")
    assert create.condition == (
        "not check_existing_branch or '✅' not in str(check_existing_branch)")
    assert create.parameters == {"branch": "{{ branch_name }}", "from_branch": "main"}
    assert create.on_error == "continue"
    assert definition.step("fix_vpn").parameters == {}
    assert definition.step("retry_create_branch").output_key == "create_branch_retry"


def test_when_args_and_output_are_aliases_of_the_canonical_names() -> None:
    aliased = Step.model_validate(
        {"id": "s", "tool": "t", "args": {"a": 1}, "output": "o", "when": "x > 1"})
    canonical = Step.model_validate(
        {"id": "s", "tool": "t", "parameters": {"a": 1}, "output_key": "o",
         "condition": "x > 1"})

    assert aliased == canonical
    assert (aliased.parameters, aliased.output_key, aliased.condition) == ({"a": 1}, "o", "x > 1")


def test_to_json_writes_canonical_names_and_drops_defaults() -> None:
    data = built(parse_text(SEED_002_START_WORK)).to_json()

    first = data["steps"][0]
    assert first == {"id": "get_issue", "tool": "jira_view_issue",
                     "parameters": {"issue_key": "{{ inputs.issue_key }}"},
                     "output_key": "issue_data"}
    assert data["steps"][3]["condition"].startswith("not check_existing_branch")
    assert "args" not in json.dumps(data["steps"])
    assert "error_handling" not in data
    assert built(data) == built(parse_text(SEED_002_START_WORK))


def test_compensation_accepts_a_bare_tool_name_or_a_call() -> None:
    assert Step.model_validate({"id": "s", "tool": "t", "compensate": "undo"}).compensate == (
        ToolCall(tool="undo"))
    step = Step.model_validate(
        {"id": "s", "tool": "t", "compensate": {"tool": "undo", "args": {"id": "{{ output.id }}"},
                                                "timeout_ms": 100}})
    assert step.compensate == ToolCall(tool="undo", parameters={"id": "{{ output.id }}"},
                                       timeout_ms=100)


def test_compensate_true_means_the_tools_own_compensation() -> None:
    own = Step.model_validate({"id": "s", "tool": "t", "compensate": True}).compensate
    named = Step.model_validate({"id": "s", "tool": "t", "compensate": "undo"}).compensate

    assert own == ToolCall(tool=None)
    assert own is not None and own.uses_tool_compensation is True
    assert named is not None and named.uses_tool_compensation is False


def test_compensate_false_means_no_compensation() -> None:
    assert Step.model_validate({"id": "s", "tool": "t", "compensate": False}).compensate is None


def test_compensate_true_needs_a_tool_step() -> None:
    assert problems_of(one_step(compute="result = 1", compensate=True)) == [Problem(
        "steps[0]", "'compensate: true' needs a tool step (it uses the tool's own compensation)")]


def test_retry_policy_defaults_and_bounds() -> None:
    step = Step.model_validate({"id": "s", "tool": "t", "retry": {"max_attempts": 5}})
    assert step.retry == RetryPolicy(max_attempts=5, backoff="exponential", delay=0.2,
                                     multiplier=2.0, max_delay=30.0, jitter=0.1)

    problems = problems_of(one_step(tool="t", retry={"max_attempts": 0, "backoff": "random"}))
    assert sorted(p.path for p in problems) == [
        "steps[0].retry.backoff", "steps[0].retry.max_attempts"]


def test_version_numbers_become_text() -> None:
    assert built({**one_step(tool="t"), "version": 2}).version == "2"
    assert built(parse_text("name: v\nversion: 1.5\nsteps: [{id: a, tool: t}]")).version == "1.5"
    assert built(one_step(tool="t")).version == "1"


# -- model problems ----------------------------------------------------------------------


def test_unknown_key_is_an_error_naming_the_key() -> None:
    data = {"name": "typo", "steps": [{"id": "a", "tool": "t"},
                                      {"id": "b", "tool": "t", "depend_on": ["a"]}]}

    assert problems_of(data) == [
        Problem("steps[1].depend_on", "unknown key (not part of the composition language); "
                                      "did you mean 'depends_on'?")]


def test_unknown_top_level_key_is_an_error() -> None:
    problems = problems_of({"name": "typo", "step": [{"id": "a", "tool": "t"}]})

    assert sorted(p.path for p in problems) == ["step", "steps"]
    assert Problem("step", "unknown key (not part of the composition language); "
                           "did you mean 'steps'?") in problems


@pytest.mark.parametrize("on_error", ["fail", "continue", "compensate", "retry:3", "retry:10"])
def test_on_error_accepts_the_documented_policies(on_error: str) -> None:
    assert built(one_step(tool="t", on_error=on_error)).steps[0].on_error == on_error


@pytest.mark.parametrize("on_error", ["explode", "retry", "retry:", "retry:x", "Fail", "fail "])
def test_on_error_rejects_anything_else(on_error: str) -> None:
    assert problems_of(one_step(tool="t", on_error=on_error)) == [
        Problem("steps[0].on_error", "must be fail, continue, compensate or retry:N")]


@pytest.mark.parametrize("action", [{"tool": "t", "compute": "result = 1"}, {}])
def test_a_step_needs_exactly_one_action(action: dict[str, Any]) -> None:
    assert problems_of(one_step(**action)) == [
        Problem("steps[0]", ONE_ACTION)]


def test_a_compute_step_takes_no_parameters() -> None:
    assert problems_of(one_step(compute="result = 1", args={"a": 1})) == [
        Problem("steps[0]", "a compute step takes no parameters")]


def test_step_ids_must_be_identifiers() -> None:
    assert [p.path for p in problems_of({"name": "n", "steps": [{"id": "has space", "tool": "t"}]})
            ] == ["steps[0].id"]
    assert [p.path for p in problems_of({"name": "n", "steps": [{"id": "2nd", "tool": "t"}]})
            ] == ["steps[0].id"]
    assert built({"name": "n", "steps": [{"id": "get-issue_2", "tool": "t"}]}).steps[0].id == (
        "get-issue_2")


def test_empty_steps_and_missing_name_are_problems() -> None:
    problems = problems_of({"name": "", "steps": []})

    assert sorted(p.path for p in problems) == ["name", "steps"]


def test_every_model_problem_is_reported_at_once() -> None:
    data = {
        "name": "many",
        "inputs": [{"name": "code", "pattern": "([a-z"}],
        "steps": [
            {"id": "a", "tool": "t", "on_error": "explode"},
            {"id": "b", "tool": "t", "compute": "result = 1"},
            {"id": "c", "tool": "t", "depend_on": ["a"]},
        ],
        "max_concurrency": 0,
    }

    problems = problems_of(data)

    assert sorted(p.path for p in problems) == [
        "inputs[0].pattern", "max_concurrency", "steps[0].on_error", "steps[1]",
        "steps[2].depend_on"]


# -- input schema ------------------------------------------------------------------------


def test_bad_input_schema_is_reported_with_paths() -> None:
    data = {
        "name": "schema",
        "inputs": [
            {"name": "code", "pattern": "([a-z"},
            {"name": "kind", "default": "other", "enum": ["a", "b"]},
            {"name": "count", "type": "decimal"},
            {"name": "size", "type": "integer", "default": "big"},
            {"name": "text", "max_length": -1},
        ],
        "steps": [{"id": "a", "tool": "t"}],
    }

    problems = {p.path: p.message for p in problems_of(data)}

    assert set(problems) == {
        "inputs[0].pattern", "inputs[1]", "inputs[2].type", "inputs[3]", "inputs[4].max_length"}
    assert problems["inputs[0].pattern"].startswith("pattern does not compile: ")
    assert problems["inputs[1]"] == "default 'other' is invalid: must be one of ['a', 'b']"
    assert "'string', 'integer', 'number', 'boolean', 'array', 'object' or 'any'" in (
        problems["inputs[2].type"])
    assert problems["inputs[3]"] == "default 'big' is invalid: expected integer, got str"


def test_inputs_may_be_a_mapping_of_name_to_spec_or_type() -> None:
    definition = built({
        "name": "m",
        "inputs": {"count": "integer", "key": {"required": True, "pattern": "^K"}},
        "steps": [{"id": "a", "tool": "t"}],
    })

    assert definition.inputs == [
        InputSpec(name="count", type="integer"),
        InputSpec(name="key", required=True, pattern="^K"),
    ]


# -- resolving run inputs ----------------------------------------------------------------


START_WORK = built(parse_text(SEED_002_START_WORK))
CHECKED = built({
    "name": "checked",
    "inputs": [
        {"name": "key", "required": True, "pattern": r"^[A-Z]+-\d+$"},
        {"name": "prefix", "default": "feature", "enum": ["feature", "fix"]},
        {"name": "command", "max_length": 5},
        {"name": "count", "type": "integer", "minimum": 1, "maximum": 10, "default": 3},
        {"name": "tags", "type": "array", "default": []},
        {"name": "dry_run", "type": "boolean", "default": False},
    ],
    "steps": [{"id": "a", "tool": "t"}],
})


def test_resolve_inputs_applies_defaults() -> None:
    assert resolve_inputs(START_WORK, {"issue_key": "AAP-12345"}) == {
        "issue_key": "AAP-12345", "branch_prefix": "feature"}
    assert resolve_inputs(CHECKED, {"key": "AB-1", "count": 7}) == {
        "key": "AB-1", "prefix": "feature", "command": None, "count": 7, "tags": [],
        "dry_run": False}


def test_resolve_inputs_keeps_given_values_over_defaults() -> None:
    resolved = resolve_inputs(START_WORK, {"issue_key": "AAP-1", "branch_prefix": "hotfix"})

    assert resolved == {"issue_key": "AAP-1", "branch_prefix": "hotfix"}


def test_resolve_inputs_reports_every_problem_at_once() -> None:
    given = {"prefix": "bugfix", "command": "rm -rf /", "count": "3", "dry_run": 1,
             "tags": "a,b", "extra": True}

    with pytest.raises(InputError) as caught:
        resolve_inputs(CHECKED, given)

    assert caught.value.problems == [
        Problem("inputs.extra", "unknown input"),
        Problem("inputs.key", "is required"),
        Problem("inputs.prefix", "must be one of ['feature', 'fix']"),
        Problem("inputs.command", "is longer than 5 characters"),
        Problem("inputs.count", "expected integer, got str"),
        Problem("inputs.tags", "expected array, got str"),
        Problem("inputs.dry_run", "expected boolean, got int"),
    ]
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith("invalid inputs: inputs.extra: unknown input; ")


def test_resolve_inputs_checks_patterns_and_bounds() -> None:
    with pytest.raises(InputError) as caught:
        resolve_inputs(START_WORK, {"issue_key": "aap-12345", "branch_prefix": "feature"})
    assert caught.value.problems == [
        Problem("inputs.issue_key", r"does not match pattern '^[A-Z]+-\\d+$'")]

    with pytest.raises(InputError) as caught:
        resolve_inputs(CHECKED, {"key": "AB-1", "count": 11})
    assert [(p.path, p.message.split(" ")[:3]) for p in caught.value.problems] == [
        ("inputs.count", ["is", "greater", "than"])]

    with pytest.raises(InputError) as caught:
        resolve_inputs(CHECKED, {"key": "AB-1", "count": True})
    assert caught.value.problems == [Problem("inputs.count", "expected integer, got boolean")]


def test_a_composition_without_declared_inputs_accepts_anything() -> None:
    seed_001 = built(parse_text(SEED_001_COMPOSITION))
    given = {"query": "billing", "anything": [1, {"x": None}]}

    assert seed_001.inputs == []
    assert resolve_inputs(seed_001, given) == given
    assert resolve_inputs(seed_001, {}) == {}


@pytest.mark.parametrize(("spec", "value", "problems"), [
    (InputSpec(name="n", type="number"), 3, []),
    (InputSpec(name="n", type="number"), 2.5, []),
    (InputSpec(name="n", type="number"), False, ["expected number, got boolean"]),
    (InputSpec(name="b", type="boolean"), True, []),
    (InputSpec(name="o", type="object"), [], ["expected object, got list"]),
    (InputSpec(name="a", type="any"), {"x": 1}, []),
    (InputSpec(name="s", min_length=2), "x", ["is shorter than 2 characters"]),
    (InputSpec(name="i", type="integer", minimum=0), -1, ["is less than 0.0"]),
    (InputSpec(name="s", enum=["a"], max_length=1), "bb",
     ["must be one of ['a']", "is longer than 1 characters"]),
])
def test_check_value(spec: InputSpec, value: Any, problems: list[str]) -> None:
    assert check_value(spec, value) == problems


@pytest.mark.parametrize(("kind", "text", "value"), [
    ("integer", "42", 42),
    ("number", "2.5", 2.5),
    ("boolean", "true", True),
    ("boolean", "Yes", True),
    ("boolean", "1", True),
    ("boolean", "false", False),
    ("boolean", "no", False),
    ("boolean", "0", False),
    ("array", '["a", 2]', ["a", 2]),
    ("object", '{"k": [1]}', {"k": [1]}),
    ("string", "42", "42"),
    ("string", "true", "true"),
    ("string", '["a"]', '["a"]'),
    ("integer", "many", "many"),
])
def test_coerce_text_types_command_line_values(kind: str, text: str, value: Any) -> None:
    coerced = coerce_text(InputSpec(name="x", type=kind), text)

    assert coerced == value
    assert type(coerced) is type(value)


def test_coerce_text_without_a_spec_reads_json_else_keeps_text() -> None:
    assert coerce_text(None, "7") == 7
    assert coerce_text(None, "billing") == "billing"


# -- the digest --------------------------------------------------------------------------


SEED_001_AS_YAML = """
name: search-fold-store-workflow
description: Search for context, fold it, then store the result
version: 1.0.0
steps:
  - id: search
    tool: checkpoint_search
    args: {query: "{{input.query}}", top_k: 10}
    output: search_results
  - id: fold
    tool: context_fold
    args:
      content: "{{search_results.content}}"
      strategy: abstractive
      target_ratio: 0.6
    depends_on: [search]
    output: folded_content
  - id: store
    tool: checkpoint_save
    args:
      summary: "{{folded_content.summary}}"
      content: "{{folded_content.folded}}"
      tags: [folded, auto-generated]
    depends_on: [fold]
    output: saved_checkpoint
error_handling: {max_retries: 2, rollback_on_failure: true, failure_strategy: partial_success}
metadata:
  author: contextd
  tags: [search, folding, storage]
  estimated_duration_ms: 500
"""


def test_digest_is_the_same_for_yaml_and_json_spellings() -> None:
    from_json = built(parse_text(SEED_001_COMPOSITION))
    from_yaml = built(parse_text(SEED_001_AS_YAML))

    assert from_yaml == from_json
    assert from_yaml.digest() == from_json.digest()
    assert len(from_json.digest()) == 64
    assert from_json.digest() == definition_hash(from_json.to_json())


def test_digest_ignores_alias_spellings_and_spelled_out_defaults() -> None:
    short = built(one_step(tool="t", args={"a": 1}, output="o", when="x"))
    long = built({"name": "one", "version": "1", "max_concurrency": 8, "steps": [
        {"id": "only", "tool": "t", "parameters": {"a": 1}, "output_key": "o", "condition": "x",
         "on_error": "fail"}]})

    assert short.digest() == long.digest()


def test_digest_changes_when_a_parameter_changes() -> None:
    original = built(parse_text(SEED_001_COMPOSITION))
    data = json.loads(SEED_001_COMPOSITION)
    data["steps"][0]["parameters"]["top_k"] = 11
    changed = built(data)

    assert changed.digest() != original.digest()
    data["steps"][0]["parameters"]["top_k"] = 10
    assert built(data).digest() == original.digest()


def test_definition_hash_is_sha256_of_canonical_json() -> None:
    expected = hashlib.sha256(b'{"a":[1,"\xc3\xa9"],"b":{"c":null}}').hexdigest()

    assert definition_hash({"b": {"c": None}, "a": [1, "é"]}) == expected
    assert definition_hash({"a": [1, "é"], "b": {"c": None}}) == expected


# -- parsing and loading -----------------------------------------------------------------


def test_parse_text_reads_json_and_yaml() -> None:
    assert parse_text(SEED_001_COMPOSITION) == json.loads(SEED_001_COMPOSITION)
    assert parse_text(SEED_002_START_WORK) == yaml.safe_load(SEED_002_START_WORK)


def test_parse_text_reports_invalid_yaml_with_its_line() -> None:
    text = "name: broken\nsteps:\n  - id: a\n    tool: [t\n  - id: b\n"

    with pytest.raises(DefinitionError) as caught:
        parse_text(text, "broken.yaml")

    (problem,) = caught.value.problems
    assert problem.path.startswith("line 5, column ")
    assert problem.message.startswith("not valid YAML/JSON: ")
    assert caught.value.source == "broken.yaml"
    assert str(caught.value).startswith("broken.yaml is invalid for 1 reason: line 5, column")
    assert caught.value.exit_code == 2


def test_parse_text_reports_invalid_json_with_its_line() -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_text('{\n  "name": "x",\n  "steps": [\n}\n', "bad.json")

    assert [p.path.split(",")[0] for p in caught.value.problems] == ["line 4"]


@pytest.mark.parametrize("text", ["- id: a\n- id: b\n", "just words", "42", "", "null"])
def test_a_composition_must_be_a_mapping(text: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_text(text, "list.yaml")

    assert caught.value.problems == [Problem("", "a composition must be a mapping")]
    assert str(caught.value) == "list.yaml is invalid for 1 reason: a composition must be a mapping"


def test_load_file_reads_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "start_work.yaml").write_text(SEED_002_START_WORK, encoding="utf-8")
    (tmp_path / "seed001.json").write_text(SEED_001_COMPOSITION, encoding="utf-8")

    assert load_file(tmp_path / "start_work.yaml") == parse_text(SEED_002_START_WORK)
    assert load_file(str(tmp_path / "seed001.json")) == json.loads(SEED_001_COMPOSITION)


def test_load_file_on_a_missing_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"

    with pytest.raises(DefinitionError) as caught:
        load_file(missing)

    assert caught.value.source == str(missing)
    assert caught.value.problems == [
        Problem("", "cannot read file: No such file or directory")]
    assert str(missing) in str(caught.value)


def test_load_file_names_the_file_when_its_text_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n", encoding="utf-8")

    with pytest.raises(DefinitionError) as caught:
        load_file(path)

    assert caught.value.source == str(path)
    assert str(caught.value).startswith(f"{path} is invalid for 1 reason: line ")
