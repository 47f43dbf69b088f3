"""Rollback by the tools' own compensations (seed 001: "rollback actions are
tool-specific"): nothing accepted that does nothing, nothing undone silently."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from saga import Saga
from saga.cli import main
from saga.report import build_report

SEED = Path(__file__).resolve().parents[1] / "seeds" / "001_search_fold_store.json"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file tool acts under the working directory (its default root): the temp one."""
    monkeypatch.chdir(tmp_path)


def seed_with_a_file_and_a_failure(tmp_path: Path) -> dict:
    data = json.loads(SEED.read_text(encoding="utf-8"))
    data["steps"] += [
        {"id": "export", "tool": "file", "depends_on": ["store"],
         "parameters": {"action": "write", "path": str(tmp_path / "export.txt"),
                        "content": "{{ folded_content.summary }}"}},
        {"id": "publish", "tool": "fail", "depends_on": ["export"],
         "parameters": {"message": "the publisher is down", "retryable": False}}]
    return data


def test_seed_001_rolls_back_with_the_tools_own_compensations(saga: Saga,
                                                              tmp_path: Path) -> None:
    data = seed_with_a_file_and_a_failure(tmp_path)
    assert not any("compensate" in step for step in data["steps"])  # as a user writes it
    plan = saga.load(data)
    assert plan.rollback_plan()["export"] == "tool file's own compensation"
    assert plan.rollback_plan()["publish"] is None
    run = saga.run(plan, {"query": "sagas"})
    assert run.status == "compensated"
    assert not (tmp_path / "export.txt").exists()
    undone = [e["step_id"] for e in saga.history(run.run_id) if e["type"] == "StepCompensated"]
    assert undone == ["export", "store"]


def test_compensate_false_opts_out(saga: Saga, tmp_path: Path) -> None:
    data = seed_with_a_file_and_a_failure(tmp_path)
    data["steps"][3]["compensate"] = False
    run = saga.run(saga.load(data), {"query": "sagas"})
    assert (tmp_path / "export.txt").exists()
    undone = [e["step_id"] for e in saga.history(run.run_id) if e["type"] == "StepCompensated"]
    assert undone == ["store"]


def test_validate_shows_the_rollback_plan(tmp_path: Path, monkeypatch: object) -> None:
    path = tmp_path / "seed.json"
    path.write_text(json.dumps(seed_with_a_file_and_a_failure(tmp_path)), encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(path), "--tools",
                                       "tests.standins.standins"],
                                env={"SAGA_HOME": str(tmp_path / ".saga")})
    assert result.exit_code == 0, result.output
    assert "export: undone by tool file's own compensation" in result.output
    assert "publish: not undone" in result.output


def test_a_failed_compensation_is_plain_in_status(tmp_path: Path) -> None:
    flow = tmp_path / "f.yaml"
    flow.write_text("name: f\nsteps:\n"
                    "  - {id: a, tool: noop, compensate: {tool: fail, args: {message: nope}}}\n"
                    "  - {id: b, tool: fail, args: {retryable: false}}\n", encoding="utf-8")
    env = {"SAGA_HOME": str(tmp_path / ".saga")}
    ran = CliRunner().invoke(main, ["run", str(flow), "--json"], env=env)
    run_id = json.loads(ran.output)["run_id"]
    status = CliRunner().invoke(main, ["status", run_id], env=env)
    assert "compensation failed" in status.output
    assert "a" in status.output and "nope" in status.output


# -- issue 38: how the parameters are written changes nothing about the undo -------------

def written(path: Path, form: str) -> dict | str:
    """A file write's parameters, as a mapping or as one whole-value template."""
    if form == "literal":
        return {"action": "write", "path": str(path), "content": "made"}
    return "{{ {'action': 'write', 'path': " + json.dumps(str(path)) + ", 'content': 'made'} }}"


def write_then_fail(path: Path, form: str, rollback: bool = True) -> dict:
    return {"name": f"write-{form}", "error_handling": {"rollback_on_failure": rollback},
            "steps": [
                {"id": "w", "tool": "file", "parameters": written(path, form), "depends_on": []},
                {"id": "boom", "tool": "fail", "depends_on": ["w"],
                 "parameters": {"message": "down", "retryable": False}}]}


@pytest.mark.parametrize("form", ["literal", "template"])
def test_a_whole_template_write_is_undone_like_its_literal_twin(saga: Saga, tmp_path: Path,
                                                                 form: str) -> None:
    target = tmp_path / f"{form}.txt"
    plan = saga.load(write_then_fail(target, form))
    assert plan.rollback_plan()["w"].startswith("tool file's own compensation")
    run = saga.run(plan)
    assert run.status == "compensated", run.error
    assert not target.exists()  # the outcome: the file is gone
    undone = [e for e in saga.history(run.run_id) if e["type"] == "StepCompensated"]
    assert [e["step_id"] for e in undone] == ["w"]
    started = next(e for e in saga.history(run.run_id)
                   if e["type"] == "StepStarted" and e["step_id"] == "w")
    assert started["payload"]["parameters"]["path"] == str(target)  # the rendered ones
    assert saga.status(run.run_id)["not_undone"] == []


def test_validate_says_how_a_whole_template_step_is_undone(tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(write_then_fail(tmp_path / "x.txt", "template")),
                    encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(path)],
                                env={"SAGA_HOME": str(tmp_path / ".saga")})
    assert result.exit_code == 0, result.output
    assert "w: undone by tool file's own compensation, with the parameters the step " \
           "renders" in result.output
    assert "w: not undone" not in result.output


def test_whether_a_rendered_call_can_be_undone_is_up_to_its_rendered_parameters(
        saga: Saga, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The shell tool undoes only a call whose parameters give undo_argv.
    monkeypatch.setenv("SAGA_SHELL_ALLOW", "touch,rm")
    made, kept = tmp_path / "made", tmp_path / "kept"
    data = {"name": "shells", "steps": [
        {"id": "undoable", "tool": "shell", "parameters": "{{ {'argv': ['touch', "
         + json.dumps(str(made)) + "], 'undo_argv': ['rm', " + json.dumps(str(made)) + "]} }}"},
        {"id": "final", "tool": "shell",
         "parameters": "{{ {'argv': ['touch', " + json.dumps(str(kept)) + "]} }}"},
        {"id": "boom", "tool": "fail", "parameters": {"message": "down", "retryable": False}}]}
    run = saga.run(saga.load(data))
    assert not made.exists() and kept.exists()
    assert run.status == "failed" and run.error["compensation_failed"] == ["final"]
    assert run.steps["final"]["compensation_error"]["type"] == "NoCompensation"
    assert run.steps["undoable"]["status"] == "compensated"
    assert saga.status(run.run_id)["not_undone"] == ["final"]


def test_status_names_exactly_the_steps_a_rollback_left(saga: Saga, tmp_path: Path) -> None:
    data = write_then_fail(tmp_path / "kept.txt", "template")
    data["steps"].insert(0, {"id": "told", "tool": "echo", "parameters": {"x": 1},
                             "depends_on": []})
    data["steps"].insert(1, {"id": "sum", "compute": "1 + 1", "depends_on": []})
    run = saga.run(saga.load(data))
    assert run.status == "compensated"
    assert saga.status(run.run_id)["not_undone"] == ["told"]  # echo has no undo
    shown = CliRunner().invoke(main, ["status", run.run_id], env=_store_env(saga, tmp_path))
    assert "not undone: told" in shown.output, shown.output
    row = next(r for r in build_report(saga).runs if r["run_id"] == run.run_id)
    assert row["compensated_steps"] == ["w"] and row["not_undone_steps"] == ["told"]


def _store_env(saga: Saga, cwd: Path) -> dict[str, str]:
    """The environment of another process on the same store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    settings = saga.settings
    if settings.is_postgres:
        env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                "SAGA_DATABASE_SCHEMA": settings.schema or ""}
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env | {"SAGA_ACTOR": "ops", "SAGA_LEASE_SECONDS": "2"}


def test_a_new_process_undoes_a_whole_template_write_another_made(saga: Saga,
                                                                  tmp_path: Path) -> None:
    target = tmp_path / "other.txt"
    run = saga.run(saga.load(write_then_fail(target, "template", rollback=False)))
    assert run.status == "failed" and target.read_text() == "made"
    undone = subprocess.run([sys.executable, "-m", "saga.cli", "compensate", run.run_id,
                             "--json"], cwd=tmp_path, env=_store_env(saga, tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert undone.returncode == 0, undone.stderr
    assert json.loads(undone.stdout)["status"] == "compensated"
    assert not target.exists()
    assert saga.status(run.run_id)["not_undone"] == []


# -- issue 38: an enhancement step that says it blocks does ---------------------------------

@pytest.mark.parametrize("blocks", [{"blocks-on-failure": True}, {"on_error": "fail"}])
def test_an_enhancement_step_that_blocks_fails_the_run(saga: Saga, tmp_path: Path,
                                                        blocks: dict) -> None:
    target = tmp_path / "guarded.txt"
    data = {"name": "layers", "steps": [
        {"id": "w", "tool": "file", "layer": "guarantee", "dependencies": [],
         "parameters": written(target, "literal")},
        {"id": "insight", "tool": "fail", "layer": "enhancement", "dependencies": ["w"],
         "parameters": {"message": "no insight", "retryable": False}, **blocks},
        {"id": "after", "tool": "echo", "layer": "execution", "dependencies": ["insight"]}]}
    plan = saga.load(data)
    assert plan.record()["steps"][1]["on_error"] == "fail"  # recorded, not dropped
    run = saga.run(plan)
    assert run.status == "compensated" and run.failed_step == "insight", run.error
    assert not target.exists()
    assert "after" not in run.steps  # nothing after it ran
    soft = saga.run(saga.load({**data, "steps": [
        data["steps"][0], {k: v for k, v in data["steps"][1].items() if k not in blocks},
        data["steps"][2]]}))
    assert soft.status == "completed" and soft.outputs["_layers"]["degraded"] is True
    assert target.exists()


def test_a_worker_process_blocks_on_a_seed_003_enhancement_step(saga: Saga,
                                                                 tmp_path: Path) -> None:
    """Seed 003's manifest keys, submitted here and driven by a worker in a new process:
    what that process reads is the recorded definition, which must still say it blocks."""
    target = tmp_path / "manifest.txt"
    manifest = {"name": "manifest", "steps": [
        {"id": "context-manager", "tool": "file", "layer": "guarantee", "dependencies": [],
         "blocks-on-failure": True, "eco-mode-skip": False,
         "parameters": written(target, "template")},
        {"id": "insight-collector", "tool": "fail", "layer": "enhancement",
         "dependencies": ["context-manager"], "blocks-on-failure": True,
         "eco-mode-skip": False, "parameters": {"message": "no insight", "retryable": False}},
        {"id": "execute", "tool": "echo", "layer": "execution",
         "dependencies": ["insight-collector"]}]}
    run_id = saga.submit(saga.load(manifest)).run_id
    worker = subprocess.run([sys.executable, "-m", "saga.cli", "worker", "--until-idle",
                             "--poll", "0.05"], cwd=tmp_path, env=_store_env(saga, tmp_path),
                            capture_output=True, text=True, timeout=120)
    assert worker.returncode == 0, worker.stderr
    run = saga.get(run_id)
    assert run.status == "compensated" and run.failed_step == "insight-collector", \
        worker.stderr
    assert not target.exists()
    assert "execute" not in run.steps


def test_compensate_false_on_a_nested_composition_survives_recording(saga: Saga,
                                                                     tmp_path: Path) -> None:
    target = tmp_path / "child.txt"
    child = tmp_path / "child.json"
    child.write_text(json.dumps({"name": "child", "steps": [
        {"id": "w", "tool": "file", "parameters": written(target, "literal")}]}),
        encoding="utf-8")
    plan = saga.load({"name": "parent", "steps": [
        {"id": "nested", "use": str(child), "compensate": False},
        {"id": "boom", "tool": "fail", "parameters": {"message": "down", "retryable": False}}]})
    assert plan.record()["steps"][0]["compensate"] is False  # not dropped as a default
    run = saga.run(plan)
    assert target.read_text() == "made"  # the child was left alone, as asked
    assert saga.status(run.run_id)["not_undone"] == ["nested"]
