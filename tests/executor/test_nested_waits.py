"""A child run that waits makes its parent wait; nothing outlives its parent (issue 38).

Each journey crosses processes: a worker process drains, a new process approves,
signals or cancels, another worker process finishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from saga import Saga
from saga.config import Settings
from tests.standins import standins

ROOT = Path(__file__).resolve().parents[2]


def env_of(settings: Settings, calls: Path) -> dict[str, str]:
    """A CLI process's environment: this test's store, its tools, its call log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_TOOLS": "tests.standins.standins", "SAGA_TEST_CALL_LOG": str(calls),
            "SAGA_ACTOR": "ops", "SAGA_LEASE_SECONDS": "1"}
    if settings.is_postgres:
        env["SAGA_DATABASE_URL"] = settings.database_url or ""
        env["SAGA_DATABASE_SCHEMA"] = settings.schema or ""
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env


def cli(settings: Settings, calls: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT,
                          env=env_of(settings, calls), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode in (0, 1), proc.stderr
    return proc


def drain(settings: Settings, calls: Path) -> None:
    """A worker process that drives what it can and stops when nothing is runnable."""
    proc = cli(settings, calls, "worker", "--until-idle", "--poll", "0.05")
    assert proc.returncode == 0, proc.stderr


def child_file(tmp_path: Path, waits: dict[str, Any]) -> Path:
    """A child composition: an effect that can be undone, then a step that waits."""
    path = tmp_path / "child.yaml"
    path.write_text(yaml.safe_dump({
        "name": "waiting-child",
        "steps": [{"id": "made", "tool": "effect", "args": {"value": "c"},
                   "compensate": {"tool": "undo", "args": {"what": "child"}}},
                  {"id": "wait", **waits}],
        "outputs": {"made": "{{ made.value }}", "waited": "{{ wait }}"}}))
    return path


def parent_of(child: Path) -> dict[str, Any]:
    return {"name": "waiting-parent", "steps": [
        {"id": "first", "tool": "effect", "args": {"value": "p"},
         "compensate": {"tool": "undo", "args": {"what": "parent"}}},
        {"id": "nested", "use": str(child)},
        {"id": "last", "tool": "effect", "args": {"value": "{{ nested.outputs.made }}"}}],
        "outputs": {"child": "{{ nested.outputs }}"}}


def undone(calls: Path) -> list[str]:
    """The compensations called, in order, from every process's call log."""
    if not calls.exists():
        return []
    return [c["params"]["what"] for c in map(json.loads, calls.read_text().splitlines())
            if c["tool"] == "undo"]


def until(check: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def waiting_child(saga: Saga, parent: str) -> str:
    """The parent waits for its child, which waits; the child's id."""
    status = saga.status(parent)
    assert status["status"] == "waiting", status
    (waited,) = status["waiting_for_children"]
    assert waited["step"] == "nested"
    child = saga.get(waited["run_id"])
    assert child.status == "waiting"
    assert child.context["parent"]["run_id"] == parent
    return child.run_id


def finished_with_child(saga: Saga, parent: str, child: str) -> dict[str, Any]:
    run = saga.get(parent)
    assert run.status == "completed", (run.status, run.error)
    assert saga.get(child).status == "completed"
    assert run.outputs["child"]["made"] == "c"
    assert run.steps["last"]["output"]["value"] == "c"  # the parent continued after it
    assert saga.verify(parent) is None and saga.verify(child) is None
    outputs: dict[str, Any] = run.outputs["child"]
    return outputs


def test_a_child_waiting_for_approval_is_approved_by_a_new_process(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    child_path = child_file(tmp_path, {"tool": "effect", "args": {"value": "w"},
                                       "confirm": "carry on?"})
    assert saga.load(parent_of(child_path))  # validation accepts a child that waits
    parent = saga.submit(saga.load(parent_of(child_path))).run_id
    drain(settings, calls)
    child = waiting_child(saga, parent)
    assert saga.status(parent)["waiting_for_children"][0]["waiting_for"] == [
        {"step": "wait", "approval": "carry on?"}]
    shown = cli(settings, calls, "status", parent).stdout
    assert f"waits for child run {child}" in " ".join(shown.split())
    approved = cli(settings, calls, "approve", child, "wait")
    assert approved.returncode == 0, approved.stderr
    drain(settings, calls)
    assert finished_with_child(saga, parent, child)["waited"] == {"step": "wait", "value": "w"}
    assert undone(calls) == []


def test_an_approval_sent_to_the_parent_goes_to_its_waiting_child(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    child_path = child_file(tmp_path, {"tool": "effect", "args": {"value": "w"},
                                       "confirm": True})
    parent = saga.submit(saga.load(parent_of(child_path))).run_id
    drain(settings, calls)
    child = waiting_child(saga, parent)
    assert cli(settings, calls, "approve", parent, "wait").returncode == 0
    assert saga.get(child).approvals["wait"]["status"] == "granted"
    drain(settings, calls)
    finished_with_child(saga, parent, child)


def test_a_child_waiting_for_a_signal_gets_it_through_its_parent(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    parent = saga.submit(saga.load(parent_of(child_file(tmp_path, {"signal": "go"})))).run_id
    drain(settings, calls)
    child = waiting_child(saga, parent)
    assert saga.status(parent)["waiting_for_children"][0]["waiting_for"] == [
        {"step": "wait", "signal": "go", "until": None}]
    sent = cli(settings, calls, "signal", parent, "go", "--data", '{"n": 7}')
    assert sent.returncode == 0, sent.stderr
    assert saga.get(child).unconsumed_signals("go") == [{"n": 7}]
    drain(settings, calls)
    assert finished_with_child(saga, parent, child)["waited"] == {"n": 7}


def test_a_sleeping_child_wakes_its_parent_when_its_time_comes(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    # Longer than a worker holds a wait in process: the child's drive ends, waiting.
    parent = saga.submit(saga.load(parent_of(child_file(tmp_path, {"sleep": "2s"})))).run_id
    drain(settings, calls)
    child = waiting_child(saga, parent)
    nap = saga.get(child).steps["wait"]["wait"]["until"]
    assert saga.get(parent).steps["nested"]["wait"] == {"until": nap, "signal": None,
                                                         "child": child}

    def done() -> bool:
        drain(settings, calls)
        return saga.get(parent).is_finished
    until(done)
    assert finished_with_child(saga, parent, child)["waited"] == {"slept_until": nap}


def test_cancelling_a_parent_cancels_its_waiting_child_first(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    parent = saga.submit(saga.load(parent_of(child_file(tmp_path, {"signal": "go"})))).run_id
    drain(settings, calls)
    child = waiting_child(saga, parent)
    cancelled = cli(settings, calls, "cancel", parent)
    assert cancelled.returncode == 0, cancelled.stderr
    assert saga.get(parent).status == "cancelled"
    assert saga.get(parent).steps["nested"]["error"]["type"] == "RunCancelled"
    ended = saga.get(child)
    assert ended.status == "cancelled"
    assert ended.steps["made"]["status"] == "compensated"
    assert undone(calls) == ["child", "parent"]  # each once, the child's first
    assert saga.verify(parent) is None and saga.verify(child) is None
    drain(settings, calls)  # nothing left to drive: no run moves again
    assert undone(calls) == ["child", "parent"]


def test_a_run_started_here_waits_for_its_child_and_resumes_in_a_new_process(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    child_path = child_file(tmp_path, {"tool": "effect", "args": {"value": "w"},
                                       "confirm": True})
    run = saga.run(saga.load(parent_of(child_path)))  # in process, no worker
    assert run.status == "waiting"
    child = waiting_child(saga, run.run_id)
    saga.approve(child, "wait")
    resumed = cli(settings, calls, "resume", child)  # a child moves with its parent
    assert resumed.returncode == 0, resumed.stderr
    finished_with_child(saga, run.run_id, child)


@pytest.mark.parametrize("ending", ["quarantined", "interrupted"])
def test_a_parent_that_fails_while_its_child_runs_does_not_leave_it_running(
        sqlite_settings: Settings, registry: Any, tmp_path: Path, ending: str) -> None:
    """Workers are SIGKILLed while the child's slow step runs, until the parent fails
    (quarantined, or its ``use:`` step interrupted with ``on_interrupt: fail``): the
    child is cancelled and undone with it, not left running."""
    settings = replace(sqlite_settings, quarantine_after=1) if ending == "quarantined" \
        else sqlite_settings
    calls = tmp_path / "calls.log"
    definition = parent_of(child_file(tmp_path, {"tool": "sleep", "args": {"seconds": 4}}))
    if ending == "interrupted":
        definition["steps"][1]["on_interrupt"] = "fail"
    with Saga(settings, registry=registry) as saga:
        parent = saga.submit(saga.load(definition)).run_id

        def slow_starts() -> int:
            child = saga.status(parent).get("children")
            if not child:
                return 0
            return sum(1 for e in saga.history(child[0]["run_id"])
                       if e["type"] == "StepStarted" and e["step_id"] == "wait")
        for kill in range(12):
            if saga.get(parent).is_finished:
                break
            worker = subprocess.Popen(
                [sys.executable, "-m", "saga.cli", "worker", "--poll", "0.05", "--lease",
                 "1"], cwd=ROOT, env=env_of(settings, calls), stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            try:
                until(lambda k=kill: slow_starts() > k or saga.get(parent).is_finished)
            finally:
                worker.send_signal(signal.SIGKILL)
                worker.wait()

        def done() -> bool:  # once the dead worker's lease has lapsed
            drain(settings, calls)
            return saga.get(parent).is_finished
        until(done)
        run = saga.get(parent)
        assert run.status in ("failed", "compensated"), run.status
        assert run.steps["nested"]["error"]["type"] == ending.capitalize()
        child = saga.get(run.steps["nested"]["parameters"]["run"])
        assert child.status == "cancelled", child.status
        assert child.steps["made"]["status"] == "compensated"
        assert undone(calls).count("child") == 1
        assert saga.verify(parent) is None and saga.verify(child.run_id) is None


@pytest.mark.parametrize("waits", [{"signal": "go"}, {"sleep": "1h"}])
def test_a_parent_that_times_out_does_not_leave_its_waiting_child_waiting(
        lite: Saga, tmp_path: Path, waits: dict[str, Any]) -> None:
    """The parent's deadline passes while its child waits: the parent is undone, and its
    child is cancelled and undone with it."""
    definition = dict(parent_of(child_file(tmp_path, waits)), timeout="1s")
    run = lite.run(lite.load(definition))  # the deadline is waited out here
    assert run.status == "compensated", run.status
    assert "deadline" in run.error["message"]
    assert run.steps["nested"]["error"]["type"] == "RunTimeout"  # not left running
    child = lite.get(run.steps["nested"]["parameters"]["run"])
    assert child.status == "cancelled"
    assert child.steps["made"]["status"] == "compensated"
    assert [c["params"]["what"] for c in standins.CALLS if c["tool"] == "undo"
            and c["key"].split(":")[0] in (run.run_id, child.run_id)] == ["child", "parent"]


def test_a_running_worker_drives_a_parent_on_when_its_child_is_approved(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    """A worker that keeps running (it read the parent as waiting for a person) takes
    the parent up again when another process approves the child."""
    calls = tmp_path / "calls.log"
    child_path = child_file(tmp_path, {"tool": "effect", "args": {"value": "w"},
                                       "confirm": True})
    parent = saga.submit(saga.load(parent_of(child_path))).run_id
    worker = subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--poll", "0.05"],
                              cwd=ROOT, env=env_of(settings, calls),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: saga.get(parent).status == "waiting")
        child = waiting_child(saga, parent)
        assert cli(settings, calls, "approve", child, "wait").returncode == 0
        until(lambda: saga.get(parent).is_finished)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    finished_with_child(saga, parent, child)
