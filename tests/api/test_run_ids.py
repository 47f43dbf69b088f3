"""Run ids chosen by the caller (idempotent start) and labels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from saga import Saga
from saga.cli import main
from saga.errors import InputError, RunIdConflictError
from tests.standins import standins

FLOW = {"name": "order", "inputs": [{"name": "amount", "type": "integer"}], "steps": [
    {"id": "charge", "tool": "effect", "parameters": {"value": "{{ inputs.amount }}"}}]}


def effects() -> int:
    return [c["tool"] for c in standins.CALLS].count("effect")


def test_the_same_id_twice_runs_once_and_is_found_by_its_name(saga: Saga) -> None:
    standins.CALLS.clear()
    first = saga.run(saga.load(FLOW), {"amount": 42}, run_id="ORDER-42")
    again = saga.run(saga.load(FLOW), {"amount": 42}, run_id="ORDER-42")
    assert (first.status, first.run_id) == ("completed", "ORDER-42")
    assert (again.run_id, again.version) == ("ORDER-42", first.version)
    assert effects() == 1
    assert saga.status("ORDER-42")["run_id"] == "ORDER-42"
    assert saga.history("ORDER-42")[0]["type"] == "RunStarted"
    assert saga.submit(saga.load(FLOW), {"amount": 42}, run_id="ORDER-42").version == \
        first.version


@pytest.mark.parametrize(("inputs", "flow", "says"), [
    ({"amount": 7}, FLOW, "other inputs"),
    ({"amount": 42}, dict(FLOW, name="other"), "another definition"),
])
def test_another_start_under_an_id_is_refused_and_appends_nothing(
        saga: Saga, inputs: dict[str, Any], flow: dict[str, Any], says: str) -> None:
    saga.submit(saga.load(FLOW), {"amount": 42}, run_id="ORDER-7")
    before = len(saga.history("ORDER-7"))
    with pytest.raises(RunIdConflictError, match=says) as caught:
        saga.submit(saga.load(flow), inputs, run_id="ORDER-7")
    assert caught.value.exit_code == 6
    assert len(saga.history("ORDER-7")) == before
    assert [r for _, r in saga.app.run_ids()] == [str(saga.get("ORDER-7").id)]


@pytest.mark.parametrize("bad", ["", " x", "a" * 201, "has space", "nul\x00", "ends\n"])
def test_a_malformed_id_is_an_input_error(saga: Saga, bad: str) -> None:
    with pytest.raises(InputError):
        saga.submit(saga.load(FLOW), {"amount": 1}, run_id=bad)


def test_labels_are_recorded_and_filter_the_list(saga: Saga) -> None:
    a = saga.run(saga.load(FLOW), {"amount": 1}, labels={"team": "payments", "env": "prod"})
    saga.run(saga.load(FLOW), {"amount": 2}, labels={"team": "search"})
    assert a.context["labels"] == {"team": "payments", "env": "prod"}
    assert [r["run_id"] for r in saga.list_runs(labels={"team": "payments"})] == [a.run_id]
    assert saga.list_runs(labels={"team": "payments", "env": "dev"}) == []
    assert len(saga.list_runs(definition="order")) == 2
    assert saga.list_runs(definition="nope") == []


def test_cli_run_id_workflow_id_and_conflict_exit_code(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    flow = tmp_path / "order.json"
    flow.write_text(json.dumps(FLOW), encoding="utf-8")
    env = {"SAGA_HOME": str(tmp_path / ".saga"), "SAGA_TOOLS": "tests.standins.standins"}
    runner = CliRunner()

    def saga(*args: str) -> Any:
        return runner.invoke(main, list(args), env=env)

    first = saga("run", str(flow), "--id", "ORDER-9", "-i", "amount=3", "--label", "k=v",
                 "--json")
    assert first.exit_code == 0, first.output
    same = saga("submit", str(flow), "--workflow-id", "ORDER-9", "-i", "amount=3", "--json")
    assert same.exit_code == 0, same.output
    assert json.loads(same.output)["run_id"] == "ORDER-9"
    assert json.loads(same.output)["status"] == "completed"
    clash = saga("run", str(flow), "--id", "ORDER-9", "-i", "amount=4")
    assert clash.exit_code == 6 and clash.output.startswith("error: run ORDER-9 already")
    listed = saga("list", "--label", "k=v", "--json")
    assert [r["run_id"] for r in json.loads(listed.output)] == ["ORDER-9"]
    assert saga("status", "ORDER-9").exit_code == 0
    assert saga("run", str(flow), "--validate-only", "-i", "amount=3").exit_code == 0


def test_bulk_retry_and_cancel_by_filters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    flaky = tmp_path / "pay.json"
    flaky.write_text(json.dumps({"name": "payments", "steps": [
        {"id": "charge", "tool": "fail", "parameters": {"times": 1, "retryable": False}},
        {"id": "notify", "tool": "noop"}]}), encoding="utf-8")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"name": "payments", "steps": [
        {"id": "lookup", "tool": "fail", "parameters": {"retryable": False}}]}),
        encoding="utf-8")
    waits = tmp_path / "waits.json"
    waits.write_text(json.dumps({"name": "waiter", "steps": [{"id": "w", "signal": "x"}]}),
                     encoding="utf-8")
    env = {"SAGA_HOME": str(tmp_path / ".saga"), "SAGA_ACTOR": "ops"}
    runner = CliRunner()

    def saga(*args: str) -> Any:
        return runner.invoke(main, list(args), env=env)

    failed = [json.loads(saga("run", str(flaky), "--json").output)["run_id"] for _ in range(3)]
    saga("run", str(other), "--json")
    waiting = json.loads(saga("run", str(waits), "--json").output)["run_id"]
    preview = saga("retry", "--definition", "payments", "--failed-step", "charge",
                   "--dry-run", "--json")
    assert preview.exit_code == 0, preview.output
    assert sorted(json.loads(preview.output)["matched"]) == sorted(failed)
    assert json.loads(preview.output)["changed"] == []
    done = saga("retry", "--definition", "payments", "--failed-step", "charge",
                "--reason", "PSP outage over", "--json")
    assert sorted(json.loads(done.output)["changed"]) == sorted(failed)
    assert saga("worker", "--until-idle", "--poll", "0.05").exit_code == 0
    statuses = {r["run_id"]: r["status"] for r in json.loads(saga("list", "--json").output)}
    assert all(statuses[r] == "completed" for r in failed)
    history = json.loads(saga("history", failed[0], "--json").output)
    retried = [e for e in history if e["type"] == "RunRetried"]
    assert [(e["payload"]["reason"], e["payload"]["actor"]) for e in retried] == [
        ("PSP outage over", "ops")]
    cancelled = saga("cancel", "--definition", "waiter", "--json")
    assert json.loads(cancelled.output)["changed"] == [waiting]
    assert saga("retry").exit_code == 2
