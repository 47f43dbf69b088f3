"""Rollback by the tools' own compensations (seed 001: "rollback actions are
tool-specific"): nothing accepted that does nothing, nothing undone silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from saga import Saga
from saga.cli import main

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
