"""The graph form (seed 004) undoes a task node by its role's own compensation, as the
step-list form undoes a step (issue 38, conformance case ``graph_undo``): ``saga validate``
says so, and a rollback, in this process or in a new worker process, calls it with the
rendered parameters recorded in ``StepStarted``. The role is ``write_file``
(tests/standins/file_roles.py): the real ``file`` tool behind a task's text."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from saga import Saga
from saga.cli import main
from saga.composition import compile_any
from saga.config import Settings
from saga.tools import Registry, load_registry
from tests.executor.test_recovery import store_env

ROOT = Path(__file__).resolve().parents[2]
ROLES = "tests.standins.file_roles"


def _task(node_id: str, template: str, **extra: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "task",
            "task_config": {"role": "write_file", "task_template": template, **extra}}


# a and b say nothing about undo (their role's own), d asks for it (``compensate: true``),
# kept opts out, and the last node fails: its path is outside the file root.
GRAPH = {
    "id": "files", "name": "graph-files", "entry_point": "a", "exit_points": ["bad"],
    "config": {"fail_fast": True},
    "nodes": [_task("a", "a.txt: hello {input}"), _task("b", "b.txt: new"),
              _task("d", "d.txt: asked", compensate=True),
              _task("kept", "kept.txt: stays", compensate=False),
              _task("bad", "../outside.txt: refused")],
    "edges": [{"id": f"e{i}", "source": s, "target": t} for i, (s, t) in
              enumerate([("a", "b"), ("b", "d"), ("d", "kept"), ("kept", "bad")])],
}


@pytest.fixture
def registry() -> Registry:
    return load_registry([ROLES])


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file root (the working directory, the ``file`` tool's default), with the
    graph's file and a ``b.txt`` that node b overwrites."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "b.txt").write_text("old")
    (work / "graph.yaml").write_text(yaml.safe_dump(GRAPH))
    return work


def check_undone(saga: Saga, run_id: str, work: Path) -> None:
    """The run is compensated; a, b and d are undone in reverse, each with the parameters
    its StepStarted recorded; kept is not, and says so."""
    status = saga.status(run_id)
    assert status["status"] == "compensated", status
    assert not (work / "a.txt").exists() and not (work / "d.txt").exists()
    assert (work / "b.txt").read_text() == "old"
    assert (work / "kept.txt").read_text() == "stays"
    started = {e["step_id"]: e["payload"]["parameters"] for e in saga.history(run_id)
               if e["type"] == "StepStarted"}
    assert started["a"] == {"task": "a.txt: hello world"}  # rendered, not the template
    undos = [json.loads(line) for line in (work / "undo_calls.jsonl").read_text().splitlines()]
    assert [(u["step"], u["params"]) for u in undos] == [
        (s, started[s]) for s in ("d", "b", "a")]
    compensated = [e["step_id"] for e in saga.history(run_id)
                   if e["type"] == "StepCompensated"]
    assert compensated == ["d", "b", "a"]


def test_validate_names_the_roles_own_undo(workdir: Path) -> None:
    result = CliRunner().invoke(main, ["validate", "graph.yaml", "--tools", ROLES, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["rollback"] == {
        "a": "tool write_file's own compensation", "b": "tool write_file's own compensation",
        "d": "tool write_file's own compensation", "kept": None,
        "bad": "tool write_file's own compensation"}


def test_a_failing_node_undoes_the_files_written_before_it(saga: Saga, workdir: Path) -> None:
    run = saga.run("graph.yaml", {"input": "world"})
    check_undone(saga, run.run_id, workdir)


def test_a_new_worker_process_undoes_them(saga: Saga, settings: Settings,
                                          workdir: Path) -> None:
    run_id = saga.submit("graph.yaml", {"input": "world"}).run_id
    worker = subprocess.run(
        [sys.executable, "-m", "saga.cli", "worker", "--until-idle", "--poll", "0.05",
         "--tools", ROLES], cwd=workdir, env=store_env(settings) | {"PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr
    check_undone(saga, run_id, workdir)


def test_the_record_keeps_compensate_false(registry: Registry) -> None:
    """A run's recorded graph, compiled again with the tools, still leaves ``kept`` alone
    (``compensate: false`` equals the default, so a plain dump would drop it)."""
    record = compile_any(GRAPH, tools=registry.tools()).record()
    assert record["nodes"][3]["task_config"]["compensate"] is False
    again = compile_any(record, tools=registry.tools()).rollback_plan()
    assert again["kept"] is None and again["a"] == "tool write_file's own compensation"
