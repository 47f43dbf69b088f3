"""The seeds to the letter: fields and expressions the seeds write, each tested so that the
test fails when the field is ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.errors import DefinitionError, ToolError
from saga.tools import Registry, Tool, ToolContext, load_registry
from tests.standins.standins import CALLS

SEEDS = Path(__file__).resolve().parents[1] / "seeds"
FLAKY: dict[str, int] = {}


def flaky_create_branch(params: dict[str, Any], ctx: ToolContext) -> str:
    """Fails its first call with a network error, as a branch created off the VPN does."""
    FLAKY["calls"] = FLAKY.get("calls", 0) + 1
    if FLAKY["calls"] == 1:
        raise ToolError("fatal: unable to access origin: no route to host")
    return f"created {params['branch']}"


def metered(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Reports the tokens it used, as an LLM-backed skill would."""
    ctx.report_usage(tokens=params.get("tokens", 0))
    return {"done": True}


@pytest.fixture
def registry() -> Registry:
    FLAKY.clear()
    CALLS.clear()
    tools = load_registry(["tests.standins.standins"])
    tools.add(Tool("git_create_branch", flaky_create_branch, source="test"))
    tools.add(Tool("metered", metered, source="test"))
    return tools


def steps(*items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"name": "t", "steps": list(items), **extra}


def test_seed_002_auto_heal_pattern_runs_as_written(saga: Saga) -> None:
    run = saga.run(SEEDS / "002_start_work.yaml", {"issue_key": "AAP-1"})
    assert run.pending_approvals == ["create_branch"]
    saga.approve(run.run_id, "create_branch", actor="ann")
    run = saga.resume(run.run_id)
    assert run.status == "completed", run.error
    assert run.steps["create_branch"]["status"] == "failed"  # no route to host
    assert run.steps["detect_failure"]["output"] == {"needs_vpn": True, "needs_auth": False}
    assert run.steps["fix_vpn"]["status"] == "completed"
    assert run.steps["fix_auth"]["status"] == "skipped"
    assert run.steps["retry_create_branch"]["status"] == "completed"
    assert FLAKY["calls"] == 2
    assert [c["tool"] for c in CALLS].count("vpn_connect") == 1


def test_declared_inputs_by_bare_name_unless_a_step_shadows_them(saga: Saga) -> None:
    plan = saga.load({"name": "t", "inputs": [{"name": "namespace", "default": "ns1"},
                                              {"name": "region", "default": "eu"}],
                      "steps": [{"id": "region", "tool": "echo", "args": {"r": "us"}},
                                {"id": "show", "tool": "echo",
                                 "args": {"ns": "{{ namespace }}", "r": "{{ region.r }}"}}]})
    run = saga.run(plan)
    assert run.steps["show"]["output"] == {"ns": "ns1", "r": "us"}


def test_compute_imports_from_the_allowlist(saga: Saga) -> None:
    block = ("import json\nimport math\nimport re\nfrom datetime import datetime\n\n"
             "items = [1, 2]\n"
             "result = {\n"
             "  'timestamp': datetime.now().isoformat(),\n"
             "  'summary': f'Processed {len(items)} items',\n"
             "  'data': json.dumps(items),\n"
             "  'root': math.sqrt(16),\n"
             "  'digits': re.findall(r'\\d', 'a1b2'),\n"
             "}\n")
    run = saga.run(saga.load(steps({"id": "c", "compute": block})))
    output = run.steps["c"]["output"]
    assert output["summary"] == "Processed 2 items" and output["data"] == "[1, 2]"
    assert output["root"] == 4.0 and output["digits"] == ["1", "2"]
    assert output["timestamp"][:2] == "20"
    with pytest.raises(DefinitionError, match="import of 'os' is not allowed"):
        saga.load(steps({"id": "c", "compute": "import os\nresult = 1"}))
    with pytest.raises(DefinitionError, match="import"):  # conditions stay pure
        saga.load(steps({"id": "c", "tool": "echo", "when": "__import__('os')"}))


def test_seed_001_names_and_references(saga: Saga, tmp_path: Path) -> None:
    file = tmp_path / "nameless.yaml"
    file.write_text("steps:\n"
                    "  - {id: search, tool: echo, args: {content: found}, "
                    "output_key: search_results}\n"
                    "  - {id: fold, tool: echo, depends_on: [search], args: "
                    "{a: '{{ search.search_results.content }}', b: '{{ search_results.content }}',"
                    " who: '{{ context.user_id }}', run: '{{ context.execution_id }}'}}\n",
                    encoding="utf-8")
    run = saga.run(file, actor="ann")
    assert run.name == "nameless"
    assert run.steps["fold"]["output"] == {"a": "found", "b": "found", "who": "ann",
                                           "run": run.run_id}


def test_validation_refuses_what_would_fail_at_run_time(saga: Saga, tmp_path: Path) -> None:
    cases = {
        "{{ context.nosuch }}": "unknown context field 'nosuch'",
        "{{ namespace(a=1) }}": "unknown name 'namespace'",
    }
    for template, message in cases.items():
        with pytest.raises(DefinitionError, match=message):
            saga.load(steps({"id": "a", "tool": "echo", "args": {"x": template}}))
    with pytest.raises(DefinitionError, match="unknown parameter 'secs'"):
        saga.load(steps({"id": "a", "tool": "sleep", "args": {"secs": 1}}))
    file = tmp_path / "bool.yaml"
    file.write_text("name: t\nsteps:\n  - id: no\n    tool: echo\n", encoding="utf-8")
    with pytest.raises(DefinitionError, match='write it in quotes'):
        saga.load(file)


MANIFEST = {"name": "layers", "steps": [
    {"id": "quality", "tool": "echo", "layer": "guarantee", "dependencies": [],
     "blocks-on-failure": True, "eco-mode-skip": False},
    {"id": "insight", "tool": "metered", "layer": "enhancement", "dependencies": ["quality"],
     "args": {"tokens": 2000}, "eco-mode-skip": False},
    {"id": "extra", "tool": "echo", "layer": "execution", "dependencies": ["quality"],
     "eco-mode-skip": True},
    {"id": "flaky", "tool": "fail", "layer": "execution", "dependencies": ["quality"],
     "blocks-on-failure": False, "args": {"message": "boom", "retryable": False}},
    {"id": "reflect", "tool": "echo", "layer": "execution",
     "dependencies": ["insight", "extra", "flaky"], "args": {"_usage": {"tokens": 500}}}]}


def test_seed_003_manifest_keys(saga: Saga) -> None:
    plan = saga.load(MANIFEST)
    assert plan.levels() == [["quality"], ["insight", "extra", "flaky"], ["reflect"]]
    run = saga.run(plan)
    assert run.status == "completed", run.error  # flaky does not block
    assert run.steps["flaky"]["status"] == "failed"
    layers = run.outputs["_layers"]
    assert layers["enhancement"]["tokens"] == 2000  # ctx.report_usage
    assert layers["execution"]["tokens"] == 500  # a `_usage` field in the output
    eco = saga.run(plan, options={"mode": "eco"})
    assert eco.steps["insight"]["status"] == "completed"  # eco-mode-skip: false
    assert eco.steps["extra"]["status"] == "skipped"  # eco-mode-skip: true
    blocking = saga.load({**MANIFEST, "steps": [
        *MANIFEST["steps"][:3], {**MANIFEST["steps"][3], "blocks-on-failure": True},
        MANIFEST["steps"][4]]})
    assert saga.run(blocking).status in ("failed", "compensated")
