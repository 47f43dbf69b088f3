"""How a sleep or signal wait ends, as a new process reads it: a wait its run stops
having (the run timed out or was cancelled) ends failed with the run, never ``running``
for ever; a durable sleep reports its own length, not how long until a worker came
back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from saga import Saga
from saga.config import Settings
from saga.domain.vocabulary import ms_between

ROOT = Path(__file__).resolve().parents[2]


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m saga.cli`` in a new process on the test's store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["SAGA_LEASE_SECONDS"] = "2"
    if settings.is_postgres:
        env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                "SAGA_DATABASE_SCHEMA": settings.schema or ""}
    else:
        env["SAGA_HOME"] = str(settings.home)
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def status(settings: Settings, run_id: str) -> dict[str, Any]:
    done = cli(settings, "status", run_id, "--json")
    assert done.returncode in (0, 1), done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def history(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    done = cli(settings, "history", run_id, "--json")
    assert done.returncode == 0, done.stderr
    events: list[dict[str, Any]] = json.loads(done.stdout)
    return events


def worker(settings: Settings, name: str) -> None:
    done = cli(settings, "worker", "--until-idle", "--poll", "0.05", "--id", name)
    assert done.returncode == 0, done.stderr


def wait_until(moment: datetime) -> None:
    """Until the wall clock passes a recorded moment (with a deadline)."""
    deadline = time.monotonic() + 60
    while datetime.now(UTC) <= moment:
        assert time.monotonic() < deadline, f"{moment} never came"
        time.sleep(0.05)


def test_a_signal_wait_ends_with_its_run_when_the_run_times_out(settings: Settings) -> None:
    flow = {"name": "signal-deadline", "timeout": "1s", "steps": [
        {"id": "prep", "tool": "echo", "parameters": {"x": 1}},
        {"id": "approve", "signal": "go"},
        {"id": "after", "tool": "echo", "parameters": {"y": 2}}]}
    with Saga(settings) as s:
        run = s.run(s.load(flow))  # the deadline is near: waited out here, then it ends
    shown = status(settings, run.run_id)  # read by a new process
    assert shown["status"] == "failed"
    wait = shown["steps"]["approve"]
    assert wait["status"] == "failed", wait
    assert wait["error"]["type"] == "RunTimeout"
    failed = [e for e in history(settings, run.run_id) if e["type"] == "StepFailed"]
    assert [(e["payload"]["step_id"], e["payload"]["retryable"]) for e in failed] == [
        ("approve", False)]
    assert cli(settings, "replay", run.run_id, "--verify").returncode == 0


def test_a_released_signal_wait_times_out_in_the_worker_that_finds_it(
        settings: Settings) -> None:
    """The run's deadline passes while no process holds it (the wait is longer than a
    worker holds a run); a new worker process finds it past its deadline."""
    flow = {"name": "signal-deadline-later", "timeout": "4s", "steps": [
        {"id": "made", "tool": "echo", "parameters": {"x": 1},
         "compensate": {"tool": "echo", "parameters": {"undo": "{{ output.x }}"}}},
        {"id": "approve", "signal": "go"}]}
    with Saga(settings) as s:
        run = s.submit(s.load(flow))
    worker(settings, "first")  # starts the wait, and lets the run go (well before 4 s)
    assert status(settings, run.run_id)["steps"]["approve"]["status"] == "running"
    started = history(settings, run.run_id)[0]["timestamp"]
    wait_until(datetime.fromisoformat(started) + timedelta(seconds=4))
    deadline = time.monotonic() + 60
    while status(settings, run.run_id)["status"] not in ("compensated", "failed"):
        assert time.monotonic() < deadline
        worker(settings, "second")
    shown = status(settings, run.run_id)
    assert shown["status"] == "compensated"
    assert shown["steps"]["made"]["status"] == "compensated"
    assert (shown["steps"]["approve"]["status"],
            shown["steps"]["approve"]["error"]["type"]) == ("failed", "RunTimeout")
    assert cli(settings, "replay", run.run_id, "--verify").returncode == 0


def test_a_cancelled_run_ends_the_signal_wait(settings: Settings) -> None:
    flow = {"name": "signal-cancel", "steps": [
        {"id": "prep", "tool": "echo", "parameters": {"x": 1}},
        {"id": "approve", "signal": "go"}]}
    with Saga(settings) as s:
        run = s.run(s.load(flow))
        assert s.get(run.run_id).steps["approve"]["status"] == "running"
    cancelled = cli(settings, "cancel", run.run_id, "--reason", "not needed", "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    shown = status(settings, run.run_id)
    assert shown["status"] == "cancelled"
    assert (shown["steps"]["approve"]["status"],
            shown["steps"]["approve"]["error"]["type"]) == ("failed", "RunCancelled")
    assert cli(settings, "replay", run.run_id, "--verify").returncode == 0


def test_a_durable_sleep_reports_its_own_length(settings: Settings) -> None:
    """One worker process starts a 2 s sleep and lets the run go; another comes back well
    after it was due. The step's duration is the sleep's (from its start to its due
    time, both recorded); its completion keeps the time it was recorded."""
    flow = {"name": "nap", "steps": [{"id": "nap", "sleep": 2},
                                     {"id": "after", "tool": "echo", "parameters": {}}]}
    with Saga(settings) as s:
        run = s.submit(s.load(flow))
    worker(settings, "first")
    events = history(settings, run.run_id)
    waiting = next(e for e in events if e["type"] == "StepWaiting")
    due = datetime.fromisoformat(waiting["payload"]["until"])
    wait_until(due + timedelta(seconds=1))  # nobody drives the run meanwhile
    worker(settings, "second")

    events = history(settings, run.run_id)
    started = next(e for e in events if e["type"] == "StepStarted"
                   and e["payload"]["step_id"] == "nap")
    completed = next(e for e in events if e["type"] == "StepCompleted"
                     and e["payload"]["step_id"] == "nap")
    own = ms_between(started["timestamp"], waiting["payload"]["until"])
    assert completed["payload"]["duration_ms"] == own
    assert datetime.fromisoformat(completed["timestamp"]) > due + timedelta(seconds=1)
    shown = status(settings, run.run_id)
    assert shown["status"] == "completed"
    assert shown["steps"]["nap"]["duration_ms"] == own
    listed = cli(settings, "projection", "rebuild")
    assert listed.returncode == 0, listed.stderr
    with Saga(settings) as s:  # the read model says the same
        rows = {r["step_id"]: r for r in s.projection.steps(run.run_id)}
        assert rows["nap"]["duration_ms"] == own
