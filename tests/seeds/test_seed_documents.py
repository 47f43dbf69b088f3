"""The seeds' remaining documents load as written: seed 003's SKILL.md manifests (alone and
as a template folder), seed 001's template documents (CLI, HTTP API), and seed 004's
subgraph mappings and ``run-graph`` command. The fixtures beside this file are the
seeds' own text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from saga.api import Saga
from saga.composition import load
from saga.composition.definition import load_file
from saga.composition.library import list_templates, read_template
from saga.config import Settings
from saga.errors import DefinitionError
from saga.tools import load_registry

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SKILLS = HERE / "003_skills"
TEMPLATES = HERE / "001_templates"
TOOLS = ["--tools", "tests.standins.standins", "--tools", "tests.standins.seed_skills"]


def cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A new ``saga`` process on the test's store."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")} | env
    if settings.is_postgres:
        environ |= {"SAGA_DATABASE_URL": settings.database_url or "",
                    "SAGA_DATABASE_SCHEMA": settings.schema or ""}
    else:
        environ["SAGA_HOME"] = str(settings.home)
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def skills_saga(settings: Settings) -> Saga:
    s = Saga(settings, registry=load_registry(["tests.standins.standins",
                                               "tests.standins.seed_skills"]))
    yield s
    s.close()


# -- seed 003 ---------------------------------------------------------------------------------


def test_a_skill_manifest_loads_as_written() -> None:
    """The front matter is the composition; the seed's keys hold for its step; the body is
    its long description (before: "not valid YAML/JSON: but found another document")."""
    data = load_file(SKILLS / "insight-collector" / "SKILL.md")
    assert data["name"] == "insight-collector"
    assert data["steps"] == [{"id": "insight-collector", "tool": "insight-collector",
                              "layer": "enhancement", "blocks-on-failure": False,
                              "eco-mode-skip": True}]
    assert data["metadata"]["skill"]["dependencies"] == ["context-manager"]
    assert data["metadata"]["long_description"].startswith("### 2. Enhancement Layer")
    plan = load(SKILLS / "reflect" / "SKILL.md")
    step = plan.definition.steps[0]
    assert (step.layer, step.on_error, step.eco_skip) == ("execution", "fail", False)
    assert plan.definition.description == "Ralph Loop continuous improvement reflection"



def test_a_skill_manifest_needs_its_front_matter(tmp_path: Path) -> None:
    (tmp_path / "SKILL.md").write_text("# no front matter\n", encoding="utf-8")
    with pytest.raises(DefinitionError, match="front matter between two '---' lines"):
        load_file(tmp_path / "SKILL.md")


def test_skill_manifests_run_with_their_layers(skills_saga: Saga) -> None:
    """Each manifest runs as a one-step composition: a failing enhancement degrades
    instead of failing, eco mode skips it, and the body is kept in the recorded
    definition."""
    gate = skills_saga.run(SKILLS / "quality-gate" / "SKILL.md")
    assert gate.status == "completed" and gate.outputs["quality-gate"] == {"passed": True}
    assert gate.definition["metadata"]["long_description"].startswith("### 1. Guarantee")
    insight = skills_saga.run(SKILLS / "insight-collector" / "SKILL.md")
    assert insight.status == "completed"
    eco = skills_saga.run(SKILLS / "insight-collector" / "SKILL.md", options={"mode": "eco"})
    assert eco.steps["insight-collector"]["status"] == "skipped"


def test_a_folder_of_skills_is_a_template_folder(settings: Settings, tmp_path: Path) -> None:
    """SAGA_TEMPLATES naming a folder of skill folders: listed, shown with the markdown
    body, run by name; a new process reads what another recorded."""
    env = {"SAGA_TEMPLATES": str(SKILLS)}
    listed = cli(settings, "templates", "list", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    names = {t["name"]: t for t in json.loads(listed.stdout)}
    assert {"quality-gate", "insight-collector", "reflect"} <= set(names)
    assert names["reflect"]["error"] is None
    shown = cli(settings, "templates", "show", "insight-collector", **env)
    assert shown.returncode == 0, shown.stderr
    assert "Capture learnings from workflow execution" in shown.stdout
    assert "Failures degrade gracefully (don't block)" in shown.stdout
    ran = cli(settings, "templates", "run", "quality-gate", "--id", "QG-1", "--json", *TOOLS,
              **env)
    assert ran.returncode == 0, ran.stderr
    status = cli(settings, "status", "QG-1", "--json", **env)
    assert json.loads(status.stdout)["status"] == "completed"


# -- seed 001 ---------------------------------------------------------------------------------


def _runnable(tmp_path: Path) -> Path:
    """The seed's template document with a min_version this saga meets (the seed's own
    1.0.0 is newer than saga 0.x: see the min_version test)."""
    doc = json.loads((TEMPLATES / "search_fold_store_template.json").read_text())
    doc["validation"]["min_version"] = "0.0.1"
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "search_fold_store_template.json").write_text(json.dumps(doc))
    return folder


def test_template_documents_are_listed_by_their_real_names(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setenv("SAGA_TEMPLATES", str(TEMPLATES))
    info = next(t for t in list_templates() if t.path.parent == TEMPLATES)
    assert (info.name, info.title) == ("search-fold-store-v1", "Search, Fold, and Store")
    assert info.category == "context-management"
    assert info.tags == ("search", "folding", "storage")
    assert info.required_tools == ("checkpoint_search", "context_fold", "checkpoint_save")
    assert info.error is None and info.definition_name == "search-fold-store-workflow"
    assert read_template(info.path).description == "Complete workflow for context optimization"


def test_a_template_newer_than_saga_is_refused_in_one_line(settings: Settings) -> None:
    """The seed's min_version 1.0.0 is newer than this saga: one clear line, exit 2."""
    ran = cli(settings, "run", str(TEMPLATES / "search_fold_store_template.json"),
              "-i", "query=x", *TOOLS)
    assert ran.returncode == 2
    assert "validation.min_version: needs saga 1.0.0 or newer; this is saga" in ran.stderr
    assert len(ran.stderr.strip().splitlines()) <= 2, ran.stderr


def test_required_tools_are_checked_at_load(settings: Settings, tmp_path: Path) -> None:
    template = _runnable(tmp_path) / "search_fold_store_template.json"
    without = cli(settings, "validate", str(template))  # the built-ins: no checkpoint_*
    assert without.returncode == 2
    assert "validation.required_tools: needs the tool(s) checkpoint_search, context_fold, " \
           "checkpoint_save" in without.stderr
    assert cli(settings, "validate", str(template), *TOOLS).returncode == 0


def test_template_documents_run_from_the_cli_and_the_api(settings: Settings, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _runnable(tmp_path)
    ran = cli(settings, "templates", "run", "search-fold-store-v1", "-i", "query=invoices",
              "--json", *TOOLS, SAGA_TEMPLATES=str(folder))
    assert ran.returncode == 0, ran.stderr
    run = json.loads(ran.stdout)
    assert run["status"] == "completed" and run["definition"] == "search-fold-store-workflow"

    from fastapi.testclient import TestClient

    from saga.server.app import create_app

    monkeypatch.setenv("SAGA_TEMPLATES", str(folder))
    app = create_app(settings, tools=("tests.standins.standins",), worker=False)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        answer = client.post("/api/v1/compositions/execute",
                             json={"template_id": "search-fold-store-v1",
                                   "input": {"query": "invoices"}})
        assert answer.status_code == 200, answer.text
        assert answer.json()["success"] is True
        listed = client.get("/api/v1/compositions/templates").json()
        mine = next(t for t in listed if t["id"] == "search-fold-store-v1")
        assert mine["name"] == "Search, Fold, and Store"
        full = client.get("/api/v1/compositions/templates/search-fold-store-v1").json()
        assert full["composition"]["name"] == "search-fold-store-workflow"


# -- seed 004 ---------------------------------------------------------------------------------

CHILD = """\
name: summarise
inputs:
  - name: topic
    type: string
    required: true
steps:
  - id: write
    tool: echo
    args: {summary: "about {{ inputs.topic }}"}
outputs:
  summary: "{{ steps.write.summary }}"
"""


def _parent(child: Path, input_mapping: str, output_mapping: str = "summary: summary") -> str:
    return f"""\
id: research
name: Research with a nested summary
entry_point: summarise_it
exit_points: [report]
nodes:
  - id: summarise_it
    type: subgraph
    subgraph_config:
      workflow_name: {child}
      input_mapping: {{{input_mapping}}}
      output_mapping: {{{output_mapping}}}
  - id: report
    type: task
    task_config:
      role: echo
      task_template: "{{summary}}"
edges:
  - {{id: e1, source: summarise_it, target: report}}
"""


@pytest.mark.parametrize(("mapping", "out"), [("topic: task", "summary: summary"),
                                             ("topic: inputs.task", "summary: outputs.summary")])
def test_subgraph_mappings_take_bare_names(saga: Saga, tmp_path: Path, mapping: str,
                                           out: str) -> None:
    """Before: ``topic: task`` failed the node at run time ("nothing at 'task'")."""
    child = tmp_path / "summarise.yaml"
    child.write_text(CHILD)
    parent = tmp_path / "research.yaml"
    parent.write_text(_parent(child, mapping, out))
    run = saga.run(saga.load(parent), {"task": "tides"})
    assert run.status == "completed", run.error
    assert run.steps["summarise_it"]["output"]["outputs"] == {"summary": "about tides"}
    assert run.outputs["report"] == {"task": "about tides"}


@pytest.mark.parametrize(("mapping", "out", "path", "says"), [
    ("colour: task", "summary: summary", "input_mapping.colour", "has no input 'colour'"),
    ("colour: task", "summary: summary", "input_mapping", "requires topic, not mapped"),
    ("topic: task", "gist: outputs.gist", "output_mapping.gist", "has no output 'gist'"),
])
def test_an_unknown_mapping_is_refused_at_validate(settings: Settings, tmp_path: Path,
                                                   mapping: str, out: str, path: str,
                                                   says: str) -> None:
    """Before: accepted by validate, failing only when the node ran."""
    child = tmp_path / "summarise.yaml"
    child.write_text(CHILD)
    parent = tmp_path / "research.yaml"
    parent.write_text(_parent(child, mapping, out))
    checked = cli(settings, "validate", str(parent))
    assert checked.returncode == 2, checked.stdout
    assert f"nodes[0].subgraph_config.{path}: " in checked.stderr
    assert says in checked.stderr


def test_run_graph_is_seed_004s_spelling(settings: Settings) -> None:
    workflow = str(HERE / "004_debug_loop.yaml")
    tools = ["--tools", "tests.standins.standins", "--tools", "tests.standins.graph_standins"]
    checked = cli(settings, "run-graph", workflow, "--workflow-id", "DEBUG-1",
                  "--validate-only", *tools)
    assert checked.returncode == 0, checked.stderr
    assert "nothing was run" in checked.stdout
    ran = cli(settings, "run-graph", workflow, "--workflow-id", "DEBUG-1", "-i",
              "input=login fails", "--json", *tools)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"
    status = cli(settings, "status", "DEBUG-1", "--json")
    assert json.loads(status.stdout)["status"] == "completed"
