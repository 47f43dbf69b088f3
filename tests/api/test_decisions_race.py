"""A decision stands when a worker appends to the run between its read and its append.

``saga approve`` (reject, and the HTTP and MCP paths that share ``Saga.approve``) reads the
run, checks the approval is pending, and appends the decision. A ``saga worker`` driving a
parallel branch of the same run may record that branch's step in between: the version
fence then refuses the decision's append. Before, the command gave up (exit 5) and the
operator's decision was lost (found by the conformance simulator). Now it reads the run
again and appends the decision once more while the approval is still the one it read.

The race is forced, not hoped for: the first read of the deciding process opens the gate
a real worker's slow branch waits on, and waits until the worker has recorded that step.
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
from saga.domain import Run
from saga.errors import RunStateError
from tests.conftest import store_env

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("--tools", "tests.standins.standins")

#: The race in a ``saga`` CLI process of its own: its first read of the run opens the
#: gate (RACE_GATE) and returns only once the worker has completed RACE_STEP, so the
#: decision it then appends is refused by the version fence.
CLI_RACING = """
import os, sys, time
from saga.api import Saga
read = Saga.get
first = [True]

def get(self, run_id, version=None):
    run = read(self, run_id, version)
    if first.pop() if first else False:
        open(os.environ["RACE_GATE"], "w").close()
        deadline = time.monotonic() + 30
        while read(self, run_id).steps.get(os.environ["RACE_STEP"], {}).get(
                "status") != "completed":
            assert time.monotonic() < deadline, "the worker did not record the step"
            time.sleep(0.02)
    return run

Saga.get = get
sys.argv[0] = "saga"
from saga.cli import run
run()
"""


def env_for(settings: Settings, tmp_path: Path, **extra: str) -> dict[str, str]:
    return store_env(settings, SAGA_TEST_CALL_LOG=str(tmp_path / "calls.jsonl"),
                     SAGA_WATCH_SECONDS="0.1", SAGA_LEASE_SECONDS="2", SAGA_ACTOR="ops",
                     **extra)


@pytest.fixture
def worker(settings: Settings, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A real ``saga worker`` process; stopped (SIGTERM) after the test, cleanly."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "saga.cli", "worker", *TOOLS, "--poll", "0.05", "--id", "w1"],
        cwd=ROOT, env=env_for(settings, tmp_path), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    yield proc
    for n in (1, 2, 3):  # a failed test's branches end now, not at their 30 s bound
        (tmp_path / f"gate{n}").touch()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err


def wait_for(what: str, condition: Callable[[], Any], seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def racing(saga: Saga, monkeypatch: pytest.MonkeyPatch, gate: Path, step: str) -> None:
    """Make this Saga's next read of a run open ``gate`` and return only once the worker
    has recorded ``step`` (the run as read is then stale: its append conflicts)."""
    read = saga.get
    first = [True]

    def get(run_id: str, version: int | None = None) -> Run:
        run = read(run_id, version)
        if first and first.pop():
            gate.touch()
            wait_for(f"the worker records {step}",
                     lambda: read(run_id).steps.get(step, {}).get("status") == "completed")
            assert run.steps[step]["status"] != "completed"  # the read is stale
        return run
    monkeypatch.setattr(saga, "get", get)


def test_a_decision_is_recorded_once_when_a_worker_appends_between_read_and_append(
        saga: Saga, settings: Settings, tmp_path: Path, worker: subprocess.Popen[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(n: int) -> dict[str, Any]:
        return {"id": f"slow{n}", "tool": "linger",
                "args": {"gate": str(tmp_path / f"gate{n}"), "seconds": 30}}
    run_id = saga.submit(saga.load({"name": "decided-in-a-race", "steps": [
        slow(1), slow(2), slow(3),
        {"id": "ok1", "tool": "act", "confirm": "first?"},
        {"id": "ok2", "tool": "act", "confirm": "second?"},
        {"id": "go", "signal": "go"},
        {"id": "last", "tool": "act",
         "depends_on": ["slow1", "slow2", "slow3", "ok1", "ok2", "go"]}]})).run_id
    wait_for("both approvals are asked for and the signal waited for",
             lambda: sorted(saga.get(run_id).pending_approvals) == ["ok1", "ok2"]
             and saga.get(run_id).steps.get("go", {}).get("wait") is not None)

    # In this process (the path HTTP and MCP share): the worker records slow1 between
    # approve's read and its append.
    with monkeypatch.context() as patched:
        racing(saga, patched, tmp_path / "gate1", "slow1")
        approved = saga.approve(run_id, "ok1", actor="alice", comment="fine")
    assert approved.approvals["ok1"]["status"] == "granted"

    # A signal raced the same way is recorded once too.
    with monkeypatch.context() as patched:
        racing(saga, patched, tmp_path / "gate3", "slow3")
        saga.signal(run_id, "go", {"n": 1}, actor="alice")

    # A new ``saga approve`` process, raced by slow2: exit 0, the decision recorded.
    wait_for("ok1 is carried out", lambda: saga.get(run_id).steps.get(
        "ok1", {}).get("status") == "completed")
    done = subprocess.run(
        [sys.executable, "-c", CLI_RACING, "approve", run_id, "ok2", "--actor", "bob"],
        cwd=ROOT, env=env_for(settings, tmp_path, RACE_GATE=str(tmp_path / "gate2"),
                              RACE_STEP="slow2"),
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"ok2 approved on run {run_id}" in done.stdout

    # The worker goes on: every step done, each decision and the signal recorded once.
    wait_for("the run completes", lambda: saga.get(run_id).status == "completed")
    run = saga.get(run_id)
    assert {k: s["status"] for k, s in run.steps.items()} == dict.fromkeys(
        ["slow1", "slow2", "slow3", "ok1", "ok2", "go", "last"], "completed")
    events = saga.history(run_id)
    granted = [(e["step_id"], e["payload"]["actor"]) for e in events
               if e["type"] == "ApprovalGranted"]
    assert sorted(granted) == [("ok1", "alice"), ("ok2", "bob")]
    assert [e["type"] for e in events].count("SignalReceived") == 1
    assert run.steps["go"]["output"] == {"n": 1}
    assert saga.verify(run_id) is None
    log = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert sorted(c["step"] for c in log if c["tool"] == "act") == ["last", "ok1", "ok2"]


def test_a_decision_taken_meanwhile_by_someone_else_is_not_overridden(
        lite: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = lite.run(lite.load({"name": "decided-twice", "steps": [
        {"id": "ok", "tool": "act", "confirm": "go?"}]})).run_id
    read = lite.get
    first = [True]

    def get(run_id: str, version: int | None = None) -> Run:
        run = read(run_id, version)
        if first and first.pop():  # alice approves between bob's read and his append
            monkeypatch.setattr(lite, "get", read)
            lite.approve(run_id, "ok", actor="alice")
            monkeypatch.setattr(lite, "get", get)
        return run
    monkeypatch.setattr(lite, "get", get)
    with pytest.raises(RunStateError, match=r"not waiting for approval \(it was decided"):
        lite.reject(run_id, "ok", actor="bob")
    decisions = [(e["type"], e["payload"]["actor"]) for e in lite.history(run_id)
                 if e["type"].startswith("Approval") and e["type"] != "ApprovalRequested"]
    assert decisions == [("ApprovalGranted", "alice")]
