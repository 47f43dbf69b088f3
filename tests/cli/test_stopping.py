"""Stopping a worker, or a ``saga run``, as an operator does: with signals.

SIGTERM (or Ctrl-C) to ``saga worker``: the step in flight finishes and is recorded,
nothing new starts, the lease is given up, and the next worker goes on from there with
no step called twice. A second signal stops at once: the cut-short call's thread still
runs, and the run's lease stays held until it returns. ``saga run`` interrupted by
Ctrl-C holds its run's lease the same way."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from saga.domain import run_uuid
from saga.store.leases import lease_key

ROOT = Path(__file__).resolve().parents[2]

FLOW = """name: slow
steps:
  - {id: slow, tool: block, args: {seconds: %s}}
  - {id: after, tool: noop, depends_on: [slow]}
"""


def env_for(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    return env | {"SAGA_HOME": str(cwd / ".saga"), "SAGA_LEASE_SECONDS": "1",
                  "SAGA_TEST_CALL_LOG": str(cwd / "calls.jsonl"),
                  "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])}


def saga(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=cwd,
                          env=env_for(cwd), capture_output=True, text=True, timeout=120)


def _sigint_default() -> None:
    # As in a terminal: a test run started in the background has SIGINT ignored, and
    # saga (as Python) leaves an ignored SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "saga.cli", *args], cwd=cwd,
                            env=env_for(cwd), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)


def calls(cwd: Path) -> list[dict[str, Any]]:
    log = cwd / "calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def lease(cwd: Path, run_id: str) -> tuple[str, float] | None:
    with sqlite3.connect(cwd / ".saga" / "saga.db") as db:
        row = db.execute("SELECT worker, expires_at FROM saga_leases WHERE run_id = ?",
                         (lease_key(run_id),)).fetchone()  # a named run's: by its UUID
    return None if row is None else (row[0], row[1])


def until_released(held: list[tuple[str, float] | None]) -> list[tuple[str, float]]:
    """The lease as sampled while the process ran, up to its release: the process gives
    the lease up just before it exits, so the last samples may find it gone, but once
    gone it must stay gone."""
    kept = [h for h in held if h is not None]
    assert held[:len(kept)] == kept, f"the lease was not held throughout: {held}"
    return kept


def status(cwd: Path, run_id: str) -> dict[str, Any]:
    done = saga(["status", run_id, "--json"], cwd)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def step_status(cwd: Path, run_id: str) -> str | None:
    """The step's status; None before the run is recorded (``saga run`` still starting)."""
    done = saga(["status", run_id, "--json"], cwd)
    if done.returncode == 4:
        return None
    assert done.returncode == 0, done.stderr
    result: str | None = json.loads(done.stdout)["steps"].get("slow", {}).get("status")
    return result


def wait_until_step_runs(cwd: Path, run_id: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while step_status(cwd, run_id) != "running":
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.1)


def submit(cwd: Path, seconds: float) -> str:
    (cwd / "slow.yaml").write_text(FLOW % seconds, encoding="utf-8")
    done = saga(["submit", "slow.yaml", "--json", "--tools", "tests.standins.standins"], cwd)
    assert done.returncode == 0, done.stderr
    run_id: str = json.loads(done.stdout)["run_id"]
    return run_id


WORKER = ["worker", "--tools", "tests.standins.standins", "--poll", "0.05", "--id"]


def test_sigterm_lets_the_step_in_flight_finish(tmp_path: Path) -> None:
    run_id = submit(tmp_path, 1.5)
    worker = start([*WORKER, "w1"], tmp_path)
    wait_until_step_runs(tmp_path, run_id, worker)
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    after = status(tmp_path, run_id)
    assert after["steps"]["slow"]["status"] == "completed"
    assert after["steps"].get("after", {}).get("status") in (None, "pending")
    assert lease(tmp_path, run_id) is None
    finish = saga([*WORKER, "w2", "--until-idle"], tmp_path)
    assert finish.returncode == 0, finish.stderr
    assert status(tmp_path, run_id)["status"] == "completed"
    assert [c["step"] for c in calls(tmp_path)] == ["slow"]  # called once, by w1
    assert saga(["replay", run_id, "--verify"], tmp_path).returncode == 0


def test_a_second_signal_stops_at_once_but_keeps_the_lease_while_the_call_runs(
        tmp_path: Path) -> None:
    run_id = submit(tmp_path, 5)
    worker = start([*WORKER, "w1"], tmp_path)
    wait_until_step_runs(tmp_path, run_id, worker)
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    worker.send_signal(signal.SIGINT)
    held: list[tuple[str, float] | None] = []
    while worker.poll() is None:
        held.append(lease(tmp_path, run_id))
        time.sleep(0.1)
    assert worker.returncode == 0, worker.communicate()
    assert calls(tmp_path), "the worker exited before its call returned"
    # Until the call returned (well past the 1 s lease), w1 held the lease, renewed.
    kept = until_released(held)
    assert len(kept) > 10 and all(h[0].startswith("w1") for h in kept)
    assert kept[-1][1] > kept[0][1] + 1
    assert lease(tmp_path, run_id) is None
    assert status(tmp_path, run_id)["steps"]["slow"]["status"] == "running"  # cut short


def test_ctrl_c_on_saga_run_keeps_the_lease_until_the_call_returns(tmp_path: Path) -> None:
    (tmp_path / "slow.yaml").write_text(FLOW % 5, encoding="utf-8")
    run = start(["run", "slow.yaml", "--tools", "tests.standins.standins", "--id", "R-1"],
                tmp_path)
    wait_until_step_runs(tmp_path, "R-1", run)
    run.send_signal(signal.SIGINT)
    held: list[tuple[str, float] | None] = []
    key = str(run_uuid("R-1"))  # a run's lease is keyed by its UUID, as workers claim it
    while run.poll() is None:
        held.append(lease(tmp_path, key))
        time.sleep(0.1)
    assert calls(tmp_path), "saga run exited before its call returned"
    kept = until_released(held)
    assert len(kept) > 10
    assert kept[-1][1] > kept[0][1] + 1
    assert lease(tmp_path, key) is None
