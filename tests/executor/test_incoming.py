"""Commands given to a run while a worker drives it, as an operator gives them: a real
``saga worker`` process, and ``saga pause`` / ``saga unpause`` / ``saga cancel`` each in a
process of its own, counting the tools' calls (SQLite and PostgreSQL).

Pausing lets the attempt in flight finish and records it; nothing new starts until the
run is unpaused, and no step is called twice. Cancelling cuts the call in flight short
(``RunCancelled``, with the actor's reason) and undoes the run, without waiting for the
call. The worker takes a command in as it comes (it looks every ``SAGA_WATCH_SECONDS``),
or, should it miss one, when its own append conflicts with it (it then never looks).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.executor import incoming
from tests.conftest import store_env

ROOT = Path(__file__).resolve().parents[2]
#: The worker looks for commands this often, or (600) never while a call runs: it then
#: learns of one only when its append conflicts with it.
WATCHES = {"watched": "0.1", "on_conflict": "600"}
TOOLS = ("--tools", "tests.standins.standins")


def env_for(settings: Settings, calls: Path, watch: str = "1") -> dict[str, str]:
    # A snapshot every 4 events: each process reads the runs past snapshots.
    return store_env(settings, SAGA_TEST_CALL_LOG=str(calls), SAGA_WATCH_SECONDS=watch,
                     SAGA_SNAPSHOT_INTERVAL="4")


def cli(settings: Settings, calls: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT,
                          env=env_for(settings, calls), capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def worker(settings: Settings, tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """Start a ``saga worker`` process (looking for commands as ``watch`` says); stopped
    (SIGTERM) after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(watch: str) -> None:
        started.append(subprocess.Popen(
            [sys.executable, "-m", "saga.cli", "worker", *TOOLS, "--poll", "0.05", "--id",
             "w1"], cwd=ROOT,
            env=env_for(settings, tmp_path / "calls.jsonl", watch),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    yield start
    for proc in started:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err


def calls(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for(what: str, condition: Callable[[], Any], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def submit(settings: Settings, tmp_path: Path, flow: dict[str, Any], run_id: str) -> None:
    (tmp_path / "flow.json").write_text(json.dumps(flow), encoding="utf-8")
    done = cli(settings, tmp_path / "calls.jsonl", "submit", str(tmp_path / "flow.json"),
               "--id", run_id, *TOOLS)
    assert done.returncode == 0, done.stderr


def began(log: Path, step: str) -> int:
    return sum(1 for c in calls(log) if c["step"] == step and c.get("phase") == "began")


def types(saga: Saga, run_id: str) -> list[str]:
    return [e["type"] for e in saga.history(run_id)]


@pytest.mark.parametrize("watch", WATCHES)
def test_pause_lets_the_attempt_in_flight_finish_and_unpause_goes_on(
        saga: Saga, settings: Settings, tmp_path: Path, worker: Callable[[str], None],
        watch: str) -> None:
    log = tmp_path / "calls.jsonl"
    submit(settings, tmp_path, {"name": "paused", "steps": [
        {"id": "slow", "tool": "linger", "args": {"gate": str(tmp_path / "gate")}},
        {"id": "after", "tool": "act", "depends_on": ["slow"]}]}, "PAUSE-1")
    worker(WATCHES[watch])
    wait_for("the step runs", lambda: began(log, "slow"))
    paused = cli(settings, log, "pause", "PAUSE-1", "--actor", "ops")
    assert paused.returncode == 0, paused.stderr
    if watch == "watched":  # the watcher takes the pause in while the call is in flight
        time.sleep(0.5)
    (tmp_path / "gate").touch()
    run_uuid = str(saga.get("PAUSE-1").id)
    # The attempt in flight finishes and is recorded; the drive ends, giving its lease up.
    wait_for("the attempt is recorded and the worker lets the run go",
             lambda: saga.get("PAUSE-1").step("slow")["status"] == "completed"
             and saga.leases.holder(run_uuid) is None)
    run = saga.get("PAUSE-1")
    assert run.status == "paused"
    assert "after" not in run.steps  # nothing new started
    assert [c["tool"] for c in calls(log)] == ["linger", "linger"]  # began, returned
    shown = cli(settings, log, "status", "PAUSE-1")
    assert shown.returncode == 0, shown.stderr
    assert "paused" in shown.stdout.splitlines()[0]
    assert "saga unpause PAUSE-1" in shown.stdout

    unpaused = cli(settings, log, "unpause", "PAUSE-1", "--actor", "ops")
    assert unpaused.returncode == 0, unpaused.stderr
    wait_for("the run completes", lambda: saga.get("PAUSE-1").status == "completed")
    assert began(log, "slow") == 1  # never called twice
    assert [c["step"] for c in calls(log) if c["tool"] == "act"] == ["after"]
    assert types(saga, "PAUSE-1") == [
        "RunStarted", "StepStarted", "RunPaused", "StepCompleted", "RunUnpaused",
        "StepStarted", "StepCompleted", "RunCompleted"]
    verified = cli(settings, log, "replay", "PAUSE-1", "--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def cancel_flow(tool: str, seconds: float) -> dict[str, Any]:
    return {"name": "cancelled", "steps": [
        {"id": "first", "tool": "act", "compensate": {"tool": "undo", "args": {"what": "first"}}},
        {"id": "slow", "tool": tool, "args": {"seconds": seconds}, "depends_on": ["first"],
         "compensate": {"tool": "undo", "args": {"what": "slow"}}}]}


def undone(log: Path) -> list[str]:
    return [c["params"]["what"] for c in calls(log) if c["tool"] == "undo"]


def test_cancel_cuts_the_call_in_flight_short(saga: Saga, settings: Settings,
                                              tmp_path: Path,
                                              worker: Callable[[str], None]) -> None:
    log = tmp_path / "calls.jsonl"
    submit(settings, tmp_path, cancel_flow("linger_async", 20), "CANCEL-1")
    worker(WATCHES["watched"])
    wait_for("the step runs", lambda: began(log, "slow"))
    started = time.monotonic()
    done = cli(settings, log, "cancel", "CANCEL-1", "--reason", "duplicate order",
               "--actor", "ops", *TOOLS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - started < 10  # not the 20 s of the call
    run = saga.get("CANCEL-1")
    assert run.status == "cancelled"
    assert run.step("slow")["error"] == {
        "type": "RunCancelled", "message": "the run was cancelled: duplicate order (by ops)"}
    assert began(log, "slow") == 1
    assert not [c for c in calls(log) if c.get("phase") == "returned"]  # it was stopped
    # The cancel names the attempt in flight first: it may have acted.
    assert saga.history("CANCEL-1")[4]["payload"]["steps"] == ["slow", "first"]
    assert undone(log) == ["slow", "first"]
    assert types(saga, "CANCEL-1") == [
        "RunStarted", "StepStarted", "StepCompleted", "StepStarted", "CompensationStarted",
        "StepFailed", "StepCompensationStarted", "StepCompensated",
        "StepCompensationStarted", "StepCompensated", "RunCancelled"]


def test_cancel_of_a_call_in_a_thread_undoes_it_once_it_returns(
        saga: Saga, settings: Settings, tmp_path: Path,
        worker: Callable[[str], None]) -> None:
    """A tool running in a thread cannot be stopped: its attempt is recorded cancelled
    at once, but its undo (the first) waits until it has returned: else its effect could
    land after its undo."""
    log = tmp_path / "calls.jsonl"
    submit(settings, tmp_path, cancel_flow("linger", 3), "CANCEL-2")
    worker(WATCHES["watched"])
    wait_for("the step runs", lambda: began(log, "slow"))
    done = cli(settings, log, "cancel", "CANCEL-2", "--actor", "ops", *TOOLS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert saga.get("CANCEL-2").step("slow")["error"]["type"] == "RunCancelled"
    order = [(c["tool"], c.get("phase") or c["params"].get("what")) for c in calls(log)]
    assert order == [("act", None), ("linger", "began"), ("linger", "returned"),
                     ("undo", "slow"), ("undo", "first")]
    assert began(log, "slow") == 1


def test_a_cancel_taken_in_on_conflict_undoes_the_step_that_completed_meanwhile(
        saga: Saga, settings: Settings, tmp_path: Path,
        worker: Callable[[str], None]) -> None:
    """A worker that learns of the cancel only when its append conflicts records the
    attempt it finished all the same, and undoes it first, as the cancel said."""
    log = tmp_path / "calls.jsonl"
    submit(settings, tmp_path, cancel_flow("linger", 1.5), "CANCEL-3")
    worker(WATCHES["on_conflict"])
    wait_for("the step runs", lambda: began(log, "slow"))
    done = cli(settings, log, "cancel", "CANCEL-3", "--actor", "ops", *TOOLS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert types(saga, "CANCEL-3") == [
        "RunStarted", "StepStarted", "StepCompleted", "StepStarted", "CompensationStarted",
        "StepCompleted", "StepCompensationStarted", "StepCompensated",
        "StepCompensationStarted", "StepCompensated", "RunCancelled"]
    assert began(log, "slow") == 1
    assert undone(log) == ["slow", "first"]


def test_a_drive_leaves_no_watcher_behind(saga: Saga) -> None:
    """The watcher of a loop goes with its last drive: a long-lived process driving
    many runs (the service) keeps no loop alive through it."""
    plan = saga.load({"name": "short", "steps": [{"id": "a", "tool": "noop"},
                                                 {"id": "b", "tool": "block"}]})
    assert saga.run(plan).status == "completed"
    assert incoming._WATCHERS == {}
