"""The ``saga`` command line end to end.

Breadth through click's ``CliRunner`` (in process, each test with a SQLite store of its
own), the user journeys through real ``saga`` processes, and one journey on a real
PostgreSQL server. Compositions are written inline into temporary files.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from saga.cli import main
from saga.errors import DefinitionError, RunNotFoundError

ROOT = Path(__file__).resolve().parents[2]
SEEDS = ROOT / "tests" / "seeds"
STANDINS = "tests.standins.standins"
PG_URL = os.environ.get("SAGA_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
UNKNOWN_RUN = "3f1e2d4c-0000-4000-8000-000000000000"
BUILTINS = {"noop", "echo", "sleep", "fail"}
RUN_OUTCOMES = {"RunCompleted", "RunFailed", "RunCompensated", "RunCancelled"}

# -- compositions ------------------------------------------------------------------------

DIAMOND = """\
name: cli-diamond
steps:
  - id: fetch
    tool: echo
    args: {x: 1}
    depends_on: []
  - id: quick
    tool: noop
    depends_on: [fetch]
  - id: slow
    tool: sleep
    args: {seconds: 0.01}
    timeout: 5
    depends_on: [fetch]
  - id: report
    tool: echo
    args: {fetched: "{{ fetch.x }}"}
    depends_on: [quick, slow]
outputs:
  fetched: "{{ report.fetched }}"
"""

# ``reserve_late`` is listed first but completes second, so "reverse completion order"
# (late, early) differs from "reverse definition order" (early, late).
COMPENSATING = """\
name: cli-compensate
steps:
  - id: reserve_late
    tool: echo
    args: {x: late}
    depends_on: [reserve_early]
    compensate: {tool: echo, args: {undo: "{{ output.x }}"}}
  - id: reserve_early
    tool: echo
    args: {x: early}
    depends_on: []
    compensate: {tool: echo, args: {undo: "{{ output.x }}"}}
  - id: charge
    tool: fail
    args: {message: card declined}
    retry: {max_attempts: 1}
    depends_on: [reserve_late]
"""

FAILING = """\
name: cli-failing
error_handling: {rollback_on_failure: false}
steps:
  - id: prepare
    tool: noop
  - id: explode
    tool: fail
    args: {message: kaboom}
    retry: {max_attempts: 1}
"""

TYPED = """\
name: cli-typed
inputs:
  n: {type: integer, required: true}
  ratio: {type: number, default: 0.5}
  flag: {type: boolean, default: false}
  tags: {type: array, default: []}
  label: {type: string, default: none}
steps:
  - id: show
    tool: echo
    args:
      n: "{{ inputs.n }}"
      ratio: "{{ inputs.ratio }}"
      flag: "{{ inputs.flag }}"
      tags: "{{ inputs.tags }}"
      label: "{{ inputs.label }}"
outputs:
  n: "{{ show.n }}"
"""

CONFIRMED = """\
name: cli-confirmed
steps:
  - id: book
    tool: echo
    args: {x: booked}
    compensate: {tool: echo, args: {undo: "{{ output.x }}"}}
  - id: pay
    tool: echo
    args: {x: paid}
    confirm: "Pay now?"
"""

# Every kind of problem at once: unknown keys (top level and in a step), a cycle, an
# unknown dependency and an unknown tool.
BROKEN = """\
name: cli-broken
colour: red
steps:
  - id: a
    tool: echo
    depends_on: [b]
    retries: 3
  - id: b
    tool: echo
    depends_on: [a]
  - id: c
    tool: no_such_tool
    depends_on: [ghost]
"""

BROKEN_PROBLEMS = {  # path -> a fragment of its message
    "colour": "unknown key",
    "steps[0].retries": "unknown key",
    "steps": "dependency cycle",
    "steps[2].depends_on": "unknown step 'ghost'",
    "steps[2].tool": "unknown tool 'no_such_tool'",
}

MALFORMED = "name: x\nsteps: [\n  - id: a\n"

FILES = {"diamond.yaml": DIAMOND, "compensating.yaml": COMPENSATING,
         "failing.yaml": FAILING, "typed.yaml": TYPED, "confirmed.yaml": CONFIRMED,
         "broken.yaml": BROKEN, "malformed.yaml": MALFORMED}


# -- helpers -----------------------------------------------------------------------------

def describe(result: Result) -> str:
    """Everything about a CliRunner result, for assertion messages."""
    tb = ""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        tb = "".join(traceback.format_exception(*result.exc_info))
    return (f"exit {result.exit_code}\n--- stdout\n{result.stdout}\n--- stderr\n"
            f"{result.stderr}\n{tb}")


def assert_one_line_error(result: Result, code: int, *fragments: str) -> str:
    """Exit ``code``, exactly one ``error:`` line on stderr (an error of several problems
    follows it with one indented line each), no traceback; returns them as one line."""
    assert result.exit_code == code, describe(result)
    assert isinstance(result.exception, SystemExit), describe(result)
    assert "Traceback" not in result.output
    line = _error_line(result.stderr)
    for fragment in fragments:
        assert fragment in line, describe(result)
    return line


def _error_line(stderr: str) -> str:
    """stderr's one ``error:`` line, with the problem lines under it (if any) joined on."""
    head, *problems = stderr.strip().splitlines() or [""]
    assert head.startswith("error: "), stderr
    assert all(p.startswith("  ") and p.strip() for p in problems), stderr
    return " ".join([head, *(p.strip() for p in problems)])


class Cli:
    """Invoke ``saga`` in process with a store of its own."""

    def __init__(self, home: Path, files: dict[str, Path]) -> None:
        self.home = home
        self.files = files
        self.runner = CliRunner()
        self.env: dict[str, str | None] = {
            "SAGA_HOME": str(home), "SAGA_ACTOR": "tester", "SAGA_DATABASE_URL": None,
            "SAGA_DATABASE_SCHEMA": None, "SAGA_TOOLS": None, "SAGA_CONFIG": None}

    def __call__(self, *args: Any, env: Mapping[str, str | None] | None = None) -> Result:
        return self.runner.invoke(main, [str(a) for a in args], env={**self.env, **(env or {})})

    def json(self, *args: Any, code: int = 0, env: Mapping[str, str | None] | None = None) -> Any:
        """Invoke with ``--json``, check the exit code, and parse stdout as ONE JSON value."""
        result = self(*args, "--json", env=env)
        assert result.exit_code == code, describe(result)
        return json.loads(result.stdout)

    def run(self, name: str, *args: Any, code: int = 0) -> dict[str, Any]:
        """``saga run FILE --json``: the run summary."""
        return self.json("run", self.files[name], *args, code=code)

    def runs(self) -> list[dict[str, Any]]:
        """``saga list --json``."""
        return self.json("list")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "compositions"
    folder.mkdir()
    written = {}
    for name, text in FILES.items():
        (folder / name).write_text(text, encoding="utf-8")
        written[name] = folder / name
    return written


@pytest.fixture
def cli(tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Cli:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # no saga.toml / pyproject.toml of the project applies
    return Cli(tmp_path / ".saga", files)


def write_tools_module(folder: Path) -> tuple[str, str]:
    """A module of one tool, both uniquely named (the tool registry is process-wide)."""
    suffix = uuid.uuid4().hex[:10]
    module, tool_name = f"cli_tools_{suffix}", f"shout_{suffix}"
    (folder / f"{module}.py").write_text(
        "from saga import tool\n\n\n"
        f"@tool({tool_name!r})\n"
        "def shout(params, ctx):\n"
        '    """Shouts its text."""\n'
        '    return {"text": str(params.get("text", "")).upper()}\n', encoding="utf-8")
    importlib.invalidate_caches()
    return module, tool_name


def shout_composition(tool_name: str) -> str:
    return (f"name: cli-shout\nsteps:\n  - id: loud\n    tool: {tool_name}\n"
            "    args: {text: hello}\noutputs:\n  said: \"{{ loud.text }}\"\n")


def step_statuses(summary: dict[str, Any]) -> dict[str, str]:
    return {key: step["status"] for key, step in summary["steps"].items()}


def check_history(events: list[dict[str, Any]], outcome: str) -> None:
    """The shape every ``history --json`` must have."""
    assert [e["version"] for e in events] == list(range(1, len(events) + 1))
    assert events[0]["type"] == "RunStarted"
    assert events[-1]["type"] == outcome
    assert not any(e["type"] in RUN_OUTCOMES for e in events[:-1])
    stamps = [datetime.fromisoformat(e["timestamp"]) for e in events]
    assert stamps == sorted(stamps)
    for e in events:
        assert set(e) >= {"type", "version", "timestamp", "payload"}
        assert isinstance(e["payload"], dict)
        if e["type"].startswith(("Step", "Approval")):
            assert e["step_id"] == e["payload"]["step_id"], e
        if e["type"] in ("RunStarted", "CompensationStarted") or e["type"] in RUN_OUTCOMES:
            assert "step_id" not in e, e


# -- validate ----------------------------------------------------------------------------

def test_validate_prints_levels_and_critical_path(cli: Cli) -> None:
    result = cli("validate", cli.files["diamond.yaml"])
    assert result.exit_code == 0, describe(result)
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines[0].endswith("valid (4 steps)")
    assert "level 1: fetch" in lines
    assert "level 2: quick, slow" in lines
    assert "level 3: report" in lines
    # ``slow`` may take up to 5 s, so it (not ``quick``) is on the critical path
    assert "critical path: fetch -> slow -> report" in lines
    assert result.stderr == ""


def test_validate_json(cli: Cli) -> None:
    data = cli.json("validate", cli.files["diamond.yaml"])
    assert data["valid"] is True
    assert data["name"] == "cli-diamond"
    assert data["levels"] == [["fetch"], ["quick", "slow"], ["report"]]
    assert data["critical_path"] == ["fetch", "slow", "report"]
    assert data["steps"] == 4


def test_validate_lists_every_problem_one_per_line(cli: Cli) -> None:
    result = cli("validate", cli.files["broken.yaml"])
    assert result.exit_code == 2, describe(result)
    head, *lines = result.stderr.splitlines()
    assert head.startswith("error: ") and head.endswith("broken.yaml is invalid for 5 reasons:")
    assert len(lines) == len(BROKEN_PROBLEMS), describe(result)
    for path, message in BROKEN_PROBLEMS.items():
        assert any(line.startswith(f"  {path}: {message}") for line in lines), (path, lines)
    assert result.stdout == ""


def test_validate_json_lists_every_problem_as_an_object(cli: Cli) -> None:
    data = cli.json("validate", cli.files["broken.yaml"], code=2)
    assert data["valid"] is False
    problems = data["problems"]
    assert all(set(p) == {"path", "message"} for p in problems), problems
    found = {p["path"]: p["message"] for p in problems}
    for path, message in BROKEN_PROBLEMS.items():
        assert message in found.get(path, ""), (path, problems)
    assert len(problems) == len(BROKEN_PROBLEMS), problems


def test_validate_reports_an_unknown_tool_next_to_graph_problems(cli: Cli,
                                                                 tmp_path: Path) -> None:
    # the same composition without the unknown keys: model problems are not involved
    text = BROKEN.replace("colour: red\n", "").replace("    retries: 3\n", "")
    path = tmp_path / "graph_only.yaml"
    path.write_text(text, encoding="utf-8")
    data = cli.json("validate", path, code=2)
    paths = {p["path"] for p in data["problems"]}
    assert paths == {"steps", "steps[2].depends_on", "steps[2].tool"}, data


def test_invalid_definition_records_nothing(cli: Cli) -> None:
    result = cli("run", cli.files["broken.yaml"])
    assert_one_line_error(result, 2, "broken.yaml", "unknown key")
    assert cli.runs() == []


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_missing_composition_is_said_as_missing(cli: Cli, command: str) -> None:
    result = cli(command, "no-such-file.yaml")
    line = assert_one_line_error(result, 2, "no composition file or template 'no-such-file.yaml'",
                                 "known templates: ")
    assert "invalid for" not in line, line
    assert cli.runs() == []


# -- run -----------------------------------------------------------------------------------

def test_run_json_completed(cli: Cli) -> None:
    summary = cli.run("diamond.yaml")
    assert {"run_id", "status", "outputs", "steps"} <= set(summary)
    uuid.UUID(summary["run_id"])
    assert summary["status"] == "completed"
    assert summary["actor"] == "tester"
    assert summary["outputs"] == {"fetched": 1}
    assert step_statuses(summary) == {"fetch": "completed", "quick": "completed",
                                      "slow": "completed", "report": "completed"}
    assert summary["steps"]["slow"]["output"] == {"slept": 0.01}
    assert summary["steps"]["fetch"]["attempt"] == 1


@pytest.mark.parametrize(("name", "status", "steps"), [
    ("compensating.yaml", "compensated",
     {"reserve_early": "compensated", "reserve_late": "compensated", "charge": "failed"}),
    ("failing.yaml", "failed", {"prepare": "completed", "explode": "failed"}),
])
def test_run_json_exits_1_when_the_run_fails(cli: Cli, name: str, status: str,
                                             steps: dict[str, str]) -> None:
    summary = cli.run(name, code=1)
    assert summary["status"] == status
    assert step_statuses(summary) == steps
    failed = next(k for k, v in steps.items() if v == "failed")
    assert summary["failed_step"] == failed
    assert summary["steps"][failed]["error"]["message"] in ("card declined", "kaboom")
    assert [r["run_id"] for r in cli.runs()] == [summary["run_id"]]


def test_run_text_output(cli: Cli) -> None:
    result = cli("run", cli.files["failing.yaml"])
    assert result.exit_code == 1, describe(result)
    assert "failed" in result.stdout
    assert "kaboom" in result.stdout
    assert "Traceback" not in result.output


def test_run_actor_option_overrides_saga_actor(cli: Cli) -> None:
    summary = cli.run("diamond.yaml", "--actor", "carol")
    assert summary["actor"] == "carol"
    started = cli.json("history", summary["run_id"])[0]
    assert started["payload"]["context"]["actor"] == "carol"


# -- inputs --------------------------------------------------------------------------------

def test_input_values_are_typed_by_the_declared_type(cli: Cli) -> None:
    summary = cli.run("typed.yaml", "--input", "n=3", "-i", "ratio=2.5", "-i", "flag=yes",
                      "-i", 'tags=["a", "b"]', "-i", "label=007")
    assert summary["status"] == "completed", summary
    shown = summary["steps"]["show"]["output"]
    assert shown == {"n": 3, "ratio": 2.5, "flag": True, "tags": ["a", "b"], "label": "007"}
    assert type(shown["n"]) is int
    assert summary["outputs"] == {"n": 3}
    assert summary["inputs"]["label"] == "007"


@pytest.mark.parametrize(("suffix", "text"), [
    (".json", '{"n": 4, "tags": ["x"], "label": "from-file"}'),
    (".yaml", "n: 4\ntags: [x]\nlabel: from-file\n"),
])
def test_inputs_file(cli: Cli, tmp_path: Path, suffix: str, text: str) -> None:
    inputs = tmp_path / f"inputs{suffix}"
    inputs.write_text(text, encoding="utf-8")
    summary = cli.run("typed.yaml", "--inputs-file", inputs)
    assert summary["steps"]["show"]["output"] == {"n": 4, "ratio": 0.5, "flag": False,
                                                  "tags": ["x"], "label": "from-file"}
    # --input wins over the file
    summary = cli.run("typed.yaml", "--inputs-file", inputs, "-i", "n=9")
    assert summary["steps"]["show"]["output"]["n"] == 9
    assert summary["steps"]["show"]["output"]["label"] == "from-file"


@pytest.mark.parametrize(("args", "fragments"), [
    (["-i", "issue_key=abc"], ["inputs.issue_key", "pattern"]),
    (["-i", "issue_key=AAP-1", "-i", "branch_prefix=bogus"], ["inputs.branch_prefix",
                                                               "one of"]),
    ([], ["inputs.issue_key", "required"]),
    (["-i", "issue_key=AAP-1", "-i", "colour=red"], ["inputs.colour", "unknown input"]),
    (["-i", "issue_key"], ["--input", "KEY=VALUE"]),
], ids=["pattern", "enum", "missing-required", "unknown-input", "not-key-value"])
def test_invalid_inputs_exit_2_and_record_nothing(cli: Cli, args: list[str],
                                                  fragments: list[str]) -> None:
    result = cli("run", SEEDS / "002_start_work.yaml", "--tools", STANDINS, *args)
    assert_one_line_error(result, 2, "invalid inputs", *fragments)
    assert result.stdout == ""
    assert cli.runs() == []


@pytest.mark.parametrize(("args", "fragments"), [
    (["-i", "n=abc"], ["inputs.n", "expected integer"]),
    (["-i", "n=true"], ["inputs.n", "expected integer"]),
    (["--inputs-file", "{missing}"], ["--inputs-file"]),
    (["--inputs-file", "{list}"], ["--inputs-file", "mapping"]),
], ids=["not-an-integer", "boolean-for-integer", "missing-inputs-file", "not-a-mapping"])
def test_invalid_typed_inputs_exit_2_and_record_nothing(cli: Cli, tmp_path: Path,
                                                        args: list[str],
                                                        fragments: list[str]) -> None:
    (tmp_path / "list.yaml").write_text("- a\n- b\n", encoding="utf-8")
    paths = {"missing": tmp_path / "nope.json", "list": tmp_path / "list.yaml"}
    args = [a.format(**paths) for a in args]
    result = cli("run", cli.files["typed.yaml"], *args)
    assert_one_line_error(result, 2, *fragments)
    assert cli.runs() == []


# -- status, history, list -------------------------------------------------------------

def test_status_json_reads_the_recorded_run(cli: Cli) -> None:
    ran = cli.run("compensating.yaml", code=1)
    status = cli.json("status", ran["run_id"])
    for key in ("run_id", "name", "status", "version", "outputs", "error", "failed_step",
                "actor", "started_at", "finished_at"):
        assert status[key] == ran[key], key
    assert step_statuses(status) == step_statuses(ran)
    assert status["steps"]["reserve_late"]["output"] == {"x": "late"}


def test_status_text(cli: Cli) -> None:
    ran = cli.run("failing.yaml", code=1)
    result = cli("status", ran["run_id"])
    assert result.exit_code == 0, describe(result)
    assert ran["run_id"] in result.stdout
    for word in ("cli-failing", "failed", "prepare", "explode", "kaboom"):
        assert word in result.stdout, word


def test_history_json(cli: Cli) -> None:
    ran = cli.run("diamond.yaml")
    events = cli.json("history", ran["run_id"])
    check_history(events, "RunCompleted")
    assert len(events) == ran["version"]
    started = events[0]["payload"]
    assert started["definition"]["name"] == "cli-diamond"
    assert started["context"]["actor"] == "tester"
    assert started["inputs"] == {}
    completed = [e["step_id"] for e in events if e["type"] == "StepCompleted"]
    assert sorted(completed) == ["fetch", "quick", "report", "slow"]
    assert completed[0] == "fetch" and completed[-1] == "report"
    starts = {e["step_id"]: e["version"] for e in events if e["type"] == "StepStarted"}
    ends = {e["step_id"]: e["version"] for e in events if e["type"] == "StepCompleted"}
    assert all(starts[s] < ends[s] for s in ends)
    assert events[-1]["payload"]["outputs"] == {"fetched": 1}


def test_history_text(cli: Cli) -> None:
    ran = cli.run("failing.yaml", code=1)
    result = cli("history", ran["run_id"])
    assert result.exit_code == 0, describe(result)
    lines = result.stdout.splitlines()
    assert len(lines) == ran["version"]
    assert "RunStarted" in lines[0]
    assert "RunFailed" in lines[-1]
    assert any("StepFailed" in line and "kaboom" in line for line in lines)


def test_list_filters_by_status_newest_first(cli: Cli) -> None:
    done = cli.run("diamond.yaml")["run_id"]
    failed = cli.run("failing.yaml", code=1)["run_id"]
    compensated = cli.run("compensating.yaml", code=1)["run_id"]
    every = cli.runs()
    assert [r["run_id"] for r in every] == [compensated, failed, done]
    assert [r["status"] for r in every] == ["compensated", "failed", "completed"]
    assert [r["run_id"] for r in cli.json("list", "--status", "failed")] == [failed]
    assert [r["run_id"] for r in cli.json("list", "--status", "compensated")] == [compensated]
    assert [r["run_id"] for r in cli.json("list", "--limit", "2")] == [compensated, failed]
    result = cli("list")
    assert result.exit_code == 0, describe(result)
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["RUN", "STATUS", "DEFINITION", "ACTOR", "STARTED"]
    # generated ids by a prefix every command finds them by
    assert [line.split()[0] for line in rows] == [i[:8] for i in (compensated, failed, done)]


def test_list_of_an_empty_store(cli: Cli) -> None:
    assert cli.runs() == []
    result = cli("list")
    assert result.exit_code == 0, describe(result)
    assert result.stdout.strip() == "no runs"


def test_list_rejects_a_negative_limit(cli: Cli) -> None:
    oldest = cli.run("diamond.yaml")["run_id"]
    cli.run("diamond.yaml")
    result = cli("list", "--limit", "-1")
    # a negative limit is bad usage; today it is a Python slice that drops the oldest run
    assert result.exit_code == 2, f"{describe(result)}\n(the oldest run is {oldest})"
    assert "--limit" in result.stderr


# -- errors ----------------------------------------------------------------------------

@pytest.mark.parametrize("run_id", [UNKNOWN_RUN, "not-a-run-id", "../../etc/passwd"],
                         ids=["unknown", "malformed", "path-like"])
@pytest.mark.parametrize("command", [["status"], ["history"], ["resume"],
                                     ["approve", "{run}", "step"],
                                     ["reject", "{run}", "step"]],
                         ids=["status", "history", "resume", "approve", "reject"])
def test_unknown_run_exits_4(cli: Cli, command: list[str], run_id: str) -> None:
    args = [a.format(run=run_id) for a in command]
    if "{run}" not in command:
        args.append(run_id)
    result = cli(*args)
    assert_one_line_error(result, 4, repr(run_id))
    assert result.stdout == ""


@pytest.mark.parametrize("args", [
    ["run", "--nope", "x.yaml"],
    ["list", "--limit", "many"],
    ["frobnicate"],
    ["run"],
    ["approve", UNKNOWN_RUN],
    ["--tools", STANDINS, "tools"],
], ids=["unknown-flag", "bad-int", "unknown-command", "missing-argument",
        "missing-step", "option-on-the-group"])
def test_bad_usage_exits_2(cli: Cli, args: list[str]) -> None:
    result = cli(*args)
    assert result.exit_code == 2, describe(result)
    assert "Traceback" not in result.output
    assert "Usage:" in result.stderr


@pytest.mark.parametrize("command", ["validate", "run"])
def test_missing_file_exits_2_and_names_it(cli: Cli, tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no-such-composition.yaml"
    result = cli(command, missing)
    assert_one_line_error(result, 2, "no-such-composition.yaml")
    assert cli.runs() == []


@pytest.mark.parametrize(("args", "env", "code", "fragments"), [
    (["status", UNKNOWN_RUN], {}, 4, [UNKNOWN_RUN]),
    (["run", "{broken}"], {}, 2, ["broken.yaml", "colour"]),
    (["run", "{typed}", "-i", "n=abc"], {}, 2, ["inputs.n"]),
    (["validate", "{malformed}"], {}, 2, ["malformed.yaml", "line"]),
    (["run", "{malformed}"], {}, 2, ["malformed.yaml"]),
    (["tools", "--tools", "no.such.module"], {}, 2, ["no.such.module"]),
    (["list"], {"SAGA_DATABASE_URL": "mysql://x"}, 2, ["postgresql://"]),
    (["list"], {"SAGA_POOL_SIZE": "lots"}, 2, ["lots"]),
], ids=["unknown-run", "invalid-definition", "invalid-input", "malformed-yaml-validate",
        "malformed-yaml-run", "unknown-tools-module", "bad-database-url", "bad-setting"])
def test_errors_are_one_line_without_traceback(cli: Cli, args: list[str], env: dict[str, str],
                                               code: int, fragments: list[str]) -> None:
    args = [a.format(**{Path(k).stem: v for k, v in cli.files.items()}) for a in args]
    result = cli(*args, env=env)
    assert_one_line_error(result, code, *fragments)


def test_a_database_password_is_never_echoed(cli: Cli) -> None:
    result = cli("list", env={"SAGA_DATABASE_URL": "postgresql://admin:s3cret-pw@/db"})
    assert_one_line_error(result, 2)
    assert "s3cret-pw" not in result.output


def test_debug_lets_the_exception_through(cli: Cli) -> None:
    plain = cli("status", UNKNOWN_RUN)
    assert_one_line_error(plain, 4)

    result = cli("--debug", "status", UNKNOWN_RUN)
    assert isinstance(result.exception, RunNotFoundError), describe(result)
    assert result.exit_code != 0
    tb = "".join(traceback.format_exception(*result.exc_info))
    assert "Traceback" in tb and "get_run" in tb

    result = cli("--debug", "validate", cli.files["broken.yaml"])
    assert isinstance(result.exception, DefinitionError), describe(result)
    assert len(result.exception.problems) >= 4


# -- tools and configuration --------------------------------------------------------------

def test_tools_json_lists_the_builtins_with_their_source(cli: Cli) -> None:
    rows = cli.json("tools")
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) >= BUILTINS
    for name in BUILTINS:
        assert by_name[name]["source"] == "builtin"
        assert by_name[name]["description"]
        assert by_name[name]["compensation"] is False
    assert [r["name"] for r in rows] == sorted(r["name"] for r in rows)
    result = cli("tools")
    assert result.exit_code == 0, describe(result)
    assert {line.split()[0] for line in result.stdout.splitlines()} >= BUILTINS


def test_tools_option_imports_a_module(cli: Cli) -> None:
    rows = {r["name"]: r for r in cli.json("tools", "--tools", STANDINS)}
    assert rows["checkpoint_save"]["source"] == f"python:{STANDINS}"
    assert rows["checkpoint_save"]["compensation"] is True
    seed = SEEDS / "001_search_fold_store.json"
    assert cli("validate", seed, "--tools", STANDINS).exit_code == 0
    summary = cli.json("run", seed, "--tools", STANDINS, "-i", "query=billing")
    assert summary["status"] == "completed", summary
    assert set(summary["outputs"]) == {"search_results", "folded_content", "saved_checkpoint"}
    assert summary["outputs"]["search_results"]["count"] == 10


def test_tools_option_with_an_unknown_module_exits_2(cli: Cli) -> None:
    for args in (["tools", "--tools", "no.such.module"],
                 ["validate", cli.files["diamond.yaml"], "--tools", "no.such.module"],
                 ["run", cli.files["diamond.yaml"], "--tools", "no.such.module"]):
        result = cli(*args)
        assert_one_line_error(result, 2, "no.such.module")
    assert cli.runs() == []


def test_saga_tools_environment_variable(cli: Cli, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    modules = tmp_path / "modules"
    modules.mkdir()
    first, first_tool = write_tools_module(modules)
    second, second_tool = write_tools_module(modules)
    monkeypatch.syspath_prepend(str(modules))
    composition = tmp_path / "shout.yaml"
    composition.write_text(shout_composition(first_tool), encoding="utf-8")

    before = cli("validate", composition)  # nothing names the module yet
    assert_one_line_error(before, 2, f"unknown tool {first_tool!r}")

    env = {"SAGA_TOOLS": f"{first}, {second}"}
    rows = {r["name"]: r for r in cli.json("tools", env=env)}
    assert rows[first_tool]["source"] == f"python:{first}"
    assert rows[second_tool]["source"] == f"python:{second}"
    summary = cli.json("run", composition, env=env)
    assert summary["status"] == "completed"
    assert summary["outputs"] == {"said": "HELLO"}

    bad = cli("tools", env={"SAGA_TOOLS": "no.such.module"})
    assert_one_line_error(bad, 2, "no.such.module")


@pytest.mark.parametrize("toml", ['tools = ["{module}"]\n',
                                  '[tools]\nmodules = ["{module}"]\n'],
                         ids=["list", "table"])
def test_saga_toml_in_the_working_directory_names_tools(cli: Cli, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        toml: str) -> None:
    here = tmp_path / "project"
    here.mkdir()
    monkeypatch.chdir(here)
    module, tool_name = write_tools_module(here)
    (here / "shout.yaml").write_text(shout_composition(tool_name), encoding="utf-8")
    before = cli("validate", "shout.yaml")
    assert_one_line_error(before, 2, f"unknown tool {tool_name!r}")

    (here / "saga.toml").write_text(toml.format(module=module), encoding="utf-8")
    rows = {r["name"]: r for r in cli.json("tools")}
    assert rows[tool_name]["source"] == f"python:{module}"
    assert set(rows) >= BUILTINS
    summary = cli.json("run", "shout.yaml")
    assert summary["outputs"] == {"said": "HELLO"}


# -- approvals ---------------------------------------------------------------------------

def test_approve_then_resume_seed_002(cli: Cli) -> None:
    seed = SEEDS / "002_start_work.yaml"
    waiting = cli.json("run", seed, "--tools", STANDINS, "-i", "issue_key=AAP-12345")
    run_id = waiting["run_id"]
    assert waiting["status"] == "waiting"
    assert waiting["waiting_for"] == ["create_branch"]
    assert waiting["steps"]["create_branch"]["approval"]["status"] == "requested"
    assert "transition_issue" not in waiting["steps"]

    status = cli.json("status", run_id)
    assert status["status"] == "waiting"
    assert status["waiting_for"] == ["create_branch"]
    text = cli("status", run_id)
    assert f"saga approve {run_id} create_branch" in text.stdout

    # resuming before a decision keeps it waiting (and is not an error)
    still = cli.json("resume", run_id, "--tools", STANDINS)
    assert still["status"] == "waiting"

    # only a step that waits can be decided
    assert_one_line_error(cli("approve", run_id, "get_issue"), 2, "get_issue",
                          "not waiting")
    assert_one_line_error(cli("reject", run_id, "no_such_step"), 2, "no_such_step")

    approved = cli("approve", run_id, "create_branch", "--comment", "ok", "--actor", "alice")
    assert approved.exit_code == 0, describe(approved)
    assert f"saga resume {run_id}" in approved.stdout
    assert_one_line_error(cli("approve", run_id, "create_branch"), 2, "not waiting")

    done = cli.json("resume", run_id, "--tools", STANDINS)
    assert done["status"] == "completed", done
    assert done["outputs"]["branch"] == "feature/AAP-12345-add-billing-export"
    assert done["steps"]["create_branch"]["status"] == "completed"
    assert done["steps"]["transition_issue"]["status"] == "completed"

    events = cli.json("history", run_id)
    check_history(events, "RunCompleted")
    types = [e["type"] for e in events]
    granted = events[types.index("ApprovalGranted")]
    assert granted["step_id"] == "create_branch"
    assert granted["payload"]["actor"] == "alice"
    assert granted["payload"]["comment"] == "ok"
    branch_started = next(e["version"] for e in events
                          if e["type"] == "StepStarted" and e["step_id"] == "create_branch")
    assert types.index("ApprovalRequested") < types.index("ApprovalGranted") < branch_started

    # a finished run cannot be resumed or decided again
    assert_one_line_error(cli("resume", run_id), 2, "completed")
    assert_one_line_error(cli("reject", run_id, "create_branch"), 2, "not waiting")


def test_reject_then_resume_compensates(cli: Cli) -> None:
    waiting = cli.run("confirmed.yaml")
    run_id = waiting["run_id"]
    assert waiting["status"] == "waiting"
    assert waiting["waiting_for"] == ["pay"]

    rejected = cli("reject", run_id, "pay", "--comment", "too expensive")
    assert rejected.exit_code == 0, describe(rejected)
    ended = cli.json("resume", run_id, code=1)
    assert ended["status"] == "compensated"
    assert ended["steps"]["pay"]["status"] == "failed"
    assert ended["steps"]["pay"]["error"]["type"] == "ApprovalRejected"
    assert ended["steps"]["book"]["status"] == "compensated"

    events = cli.json("history", run_id)
    check_history(events, "RunCompensated")
    rejection = next(e for e in events if e["type"] == "ApprovalRejected")
    assert rejection["payload"]["actor"] == "tester"  # SAGA_ACTOR, no --actor given
    assert rejection["payload"]["comment"] == "too expensive"
    assert not any(e["type"] == "StepStarted" and e["step_id"] == "pay" for e in events)


# -- real processes ------------------------------------------------------------------------

def saga_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m saga.cli``."""
    found = shutil.which("saga", path=str(Path(sys.executable).parent)) or shutil.which("saga")
    return [found] if found else [sys.executable, "-m", "saga.cli"]


def process_env(home: Path, **extra: str | None) -> dict[str, str]:
    """A clean environment: no SAGA_* from outside, the repository importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(SAGA_HOME=str(home), SAGA_ACTOR="tester", PYTHONPATH=str(ROOT), NO_COLOR="1",
               COLUMNS="200")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def saga_process(*args: Any, env: dict[str, str], cwd: Path,
                 timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*saga_command(), *map(str, args)], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, check=False)


def process_json(*args: Any, env: dict[str, str], cwd: Path, code: int = 0) -> Any:
    done = saga_process(*args, "--json", env=env, cwd=cwd)
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


def assert_process_error(done: subprocess.CompletedProcess[str], code: int,
                         *fragments: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    line = _error_line(done.stderr)
    for fragment in fragments:
        assert fragment in line, line
    return line


@pytest.fixture
def proc(tmp_path: Path, files: dict[str, Path]) -> tuple[dict[str, str], Path]:
    """Environment and working directory for real ``saga`` processes."""
    work = tmp_path / "proc"
    work.mkdir()
    return process_env(tmp_path / ".saga"), work


def test_two_processes_see_each_others_runs(proc: tuple[dict[str, str], Path],
                                            files: dict[str, Path]) -> None:
    env, cwd = proc
    first = process_json("run", files["diamond.yaml"], env=env, cwd=cwd)
    assert first["status"] == "completed"

    second = process_json("run", files["failing.yaml"], env=env, cwd=cwd, code=1)
    assert second["status"] == "failed"

    status = process_json("status", first["run_id"], env=env, cwd=cwd)
    assert status["status"] == "completed"
    assert status["outputs"] == {"fetched": 1}
    assert step_statuses(status) == step_statuses(first)

    listed = process_json("list", env=env, cwd=cwd)
    assert [(r["run_id"], r["status"]) for r in listed] == [(second["run_id"], "failed"),
                                                            (first["run_id"], "completed")]
    assert (Path(env["SAGA_HOME"]) / "saga.db").is_file()


def test_compensation_history_in_reverse_completion_order(
        proc: tuple[dict[str, str], Path], files: dict[str, Path]) -> None:
    env, cwd = proc
    ran = process_json("run", files["compensating.yaml"], env=env, cwd=cwd, code=1)
    assert ran["status"] == "compensated"
    events = process_json("history", ran["run_id"], env=env, cwd=cwd)
    check_history(events, "RunCompensated")
    types = [e["type"] for e in events]

    completed = [e["step_id"] for e in events if e["type"] == "StepCompleted"]
    assert completed == ["reserve_early", "reserve_late"]
    started = events[types.index("CompensationStarted")]
    assert started["payload"]["steps"] == ["reserve_late", "reserve_early"]
    assert "card declined" in started["payload"]["reason"]

    undone = [e for e in events if e["type"] == "StepCompensated"]
    assert [e["step_id"] for e in undone] == ["reserve_late", "reserve_early"]
    assert [e["payload"]["output"] for e in undone] == [{"undo": "late"}, {"undo": "early"}]
    failed = next(e for e in events if e["type"] == "StepFailed")
    assert failed["step_id"] == "charge"
    assert failed["version"] < started["version"] < undone[0]["version"]
    assert types[-2 * len(undone) - 1:] == \
        ["StepCompensationStarted", "StepCompensated"] * len(undone) + ["RunCompensated"]
    assert events[-1]["payload"]["failed_step"] == "charge"


def test_unreachable_postgres_exits_3_quickly(proc: tuple[dict[str, str], Path]) -> None:
    env, cwd = proc
    env = {**env, "SAGA_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nope"}
    began = time.monotonic()
    done = saga_process("list", env=env, cwd=cwd, timeout=60)
    elapsed = time.monotonic() - began
    line = assert_process_error(done, 3, "127.0.0.1")
    assert "event store" in line
    assert elapsed < 30, elapsed
    assert done.stdout == ""


def test_unreachable_postgres_with_a_schema_and_password(
        proc: tuple[dict[str, str], Path]) -> None:
    env, cwd = proc
    env = {**env, "SAGA_DATABASE_URL": "postgresql://postgres:s3cret-pw@127.0.0.1:1/nope",
           "SAGA_DATABASE_SCHEMA": "cli_unreachable"}
    done = saga_process("status", UNKNOWN_RUN, env=env, cwd=cwd)
    line = assert_process_error(done, 3, "127.0.0.1")
    assert "s3cret-pw" not in line


def test_bad_database_url_scheme_exits_2(proc: tuple[dict[str, str], Path]) -> None:
    env, cwd = proc
    done = saga_process("list", env={**env, "SAGA_DATABASE_URL": "mysql://x"}, cwd=cwd)
    assert_process_error(done, 2, "postgresql://")
    assert not (Path(env["SAGA_HOME"]) / "saga.db").exists()


def test_debug_prints_a_traceback_in_a_process(proc: tuple[dict[str, str], Path]) -> None:
    env, cwd = proc
    assert_process_error(saga_process("status", UNKNOWN_RUN, env=env, cwd=cwd), 4,
                         UNKNOWN_RUN)
    done = saga_process("--debug", "status", UNKNOWN_RUN, env=env, cwd=cwd)
    assert done.returncode != 0
    assert "Traceback (most recent call last)" in done.stderr
    assert "RunNotFoundError" in done.stderr


def test_tools_are_found_only_when_named_in_a_fresh_process(
        proc: tuple[dict[str, str], Path]) -> None:
    env, cwd = proc
    seed = SEEDS / "001_search_fold_store.json"
    assert_process_error(saga_process("validate", seed, env=env, cwd=cwd), 2,
                         "unknown tool 'checkpoint_search'")
    done = saga_process("validate", seed, "--tools", STANDINS, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    summary = process_json("run", seed, "-i", "query=billing", cwd=cwd,
                           env={**env, "SAGA_TOOLS": STANDINS})
    assert summary["status"] == "completed"


def test_saga_toml_names_a_module_next_to_it(tmp_path: Path) -> None:
    """A user's project: saga.toml and tools.py side by side, saga run from there."""
    project = tmp_path / "project"
    project.mkdir()
    module, tool_name = write_tools_module(project)
    (project / "saga.toml").write_text(f'tools = ["{module}"]\n', encoding="utf-8")
    (project / "shout.yaml").write_text(shout_composition(tool_name), encoding="utf-8")
    env = process_env(tmp_path / ".saga", PYTHONPATH=None)
    rows = {r["name"]: r for r in process_json("tools", env=env, cwd=project)}
    assert rows[tool_name]["source"] == f"python:{module}"
    summary = process_json("run", "shout.yaml", env=env, cwd=project)
    assert summary["outputs"] == {"said": "HELLO"}


# -- PostgreSQL -------------------------------------------------------------------------------

@pytest.fixture
def pg_schema() -> Iterator[str]:
    schema = f"cli_{uuid.uuid4().hex[:12]}"
    yield schema
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def schema_exists(schema: str) -> bool:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM information_schema.schemata "
                           "WHERE schema_name = %s", (schema,)).fetchone()
    return bool(row and row[0])


def test_postgres_journey(tmp_path: Path, files: dict[str, Path], pg_schema: str) -> None:
    cwd = tmp_path / "pg"
    cwd.mkdir()
    home = tmp_path / ".saga"
    env = process_env(home, SAGA_DATABASE_URL=PG_URL, SAGA_DATABASE_SCHEMA=pg_schema)

    ran = process_json("run", files["compensating.yaml"], env=env, cwd=cwd, code=1)
    assert ran["status"] == "compensated"
    done = process_json("run", files["diamond.yaml"], env=env, cwd=cwd)
    assert done["status"] == "completed"
    assert schema_exists(pg_schema)

    status = process_json("status", ran["run_id"], env=env, cwd=cwd)
    assert status["status"] == "compensated"
    assert step_statuses(status) == step_statuses(ran)

    events = process_json("history", ran["run_id"], env=env, cwd=cwd)
    check_history(events, "RunCompensated")
    assert len(events) == ran["version"]
    assert [e["step_id"] for e in events if e["type"] == "StepCompensated"] == \
        ["reserve_late", "reserve_early"]

    listed = process_json("list", env=env, cwd=cwd)
    assert [r["run_id"] for r in listed] == [done["run_id"], ran["run_id"]]

    # the runs live in PostgreSQL, not in SAGA_HOME
    assert not (home / "saga.db").exists()
    sqlite_env = process_env(home)
    assert_process_error(saga_process("status", ran["run_id"], env=sqlite_env, cwd=cwd), 4)



def test_dry_run_never_prints_a_secret_input(tmp_path: Path) -> None:
    flow = tmp_path / "s.yaml"
    flow.write_text("name: s\ninputs:\n  - {name: token, type: string, secret: true}\n"
                    "steps:\n  - {id: a, tool: echo, parameters: {t: '{{ inputs.token }}'}}\n",
                    encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(flow), "--dry-run", "--json",
                                       "-i", "token=hunter2-s3cret"])
    assert result.exit_code == 0, result.output
    assert "hunter2-s3cret" not in result.output
    assert "token" in json.loads(result.output)["inputs"]


def test_off_a_terminal_run_prints_one_line_per_event(cli: Cli) -> None:
    result = cli("run", cli.files["diamond.yaml"])
    assert result.exit_code == 0, describe(result)
    lines = [line for line in result.stdout.splitlines() if " RunStarted" in line
             or " StepCompleted " in line or " RunCompleted" in line]
    assert lines[0].split()[2] == "RunStarted" and lines[-1].split()[2] == "RunCompleted"
    assert len({line.split()[1] for line in lines}) == 1  # every line names the run


def test_an_input_with_no_name_is_a_usage_error(cli: Cli) -> None:
    for bad in ("=", "=x", "noequals"):
        result = cli("run", cli.files["diamond.yaml"], "--input", bad)
        assert result.exit_code == 2, describe(result)


def test_a_run_id_may_be_given_by_a_unique_prefix(cli: Cli) -> None:
    run_id = cli.run("diamond.yaml")["run_id"]
    assert cli.json("status", run_id[:8])["run_id"] == run_id
    assert cli("status", "zzzzzzzz").exit_code == 4
