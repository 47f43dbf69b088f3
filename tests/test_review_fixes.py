"""Regression tests for defects a code review proved (each failed before its fix)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.tools import Registry
from tests.standins import standins


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    standins.CALLS.clear()


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
        except Exception as e:  # the driver loses the race and backs off
            outcome["a"] = type(e).__name__

    thread = threading.Thread(target=drive)
    thread.start()
    time.sleep(0.3)  # "two" is running in the driver
    final = other.cancel(run_id, actor="op", reason="stop")
    thread.join()
    assert outcome["a"] == "ConcurrentWriteError"
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
    monkeypatch.setenv("ACTION_SECRET", "hunter2-TOPSECRET")
    bad = saga.run(saga.load({"name": "s", "steps": [
        {"id": "w", "tool": "file", "args": {"action": "{{ secret.ACTION_SECRET }}",
                                              "path": str(tmp_path / "f")}}]}))
    assert bad.steps["w"]["error"]["type"] == "InvalidParameters"
    assert "hunter2" not in json.dumps(saga.history(bad.run_id))
    cached = {"name": "c", "steps": [{"id": "who", "tool": "effect", "cache": 300,
                                      "args": {"value": "{{ secret.WHO }}"}}]}
    monkeypatch.setenv("WHO", "alice")
    first = saga.run(saga.load(cached))
    monkeypatch.setenv("WHO", "bob")
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
