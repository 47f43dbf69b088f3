"""Revisions given to a run while a worker drives it, as an operator gives them: a real
``saga worker`` process, and ``saga label`` / ``saga migrate`` each in a process of its
own while a step's call is in flight (SQLite and PostgreSQL).

A label or a migration is a command like a pause: the worker takes it in (when it looks,
every ``SAGA_WATCH_SECONDS``, or when its own append conflicts with it) and goes on,
never giving the run up. No step is called twice, nothing is recorded interrupted or
taken over, the label is in force, and the run goes on with the migrated definition:
the step the migration added runs, once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from saga import Saga
from saga.config import Settings
from tests.executor.test_incoming import (
    ROOT,
    TOOLS,
    WATCHES,
    began,
    calls,
    cli,
    env_for,
    submit,
    types,
    wait_for,
    worker,  # noqa: F401  (the fixture)
)


def flow(gates: Path, *, migrated: bool = False, tool: str = "act") -> dict[str, object]:
    """Two steps whose calls each block on a gate file; the migrated version adds a third
    after them, calling ``tool`` (safe: every recorded decision comes out the same)."""
    steps: list[dict[str, object]] = [
        {"id": "first", "tool": "linger", "args": {"gate": str(gates / "first"),
                                                   "seconds": 60}},
        {"id": "second", "tool": "linger", "depends_on": ["first"],
         "args": {"gate": str(gates / "second"), "seconds": 60}}]
    if migrated:
        steps.append({"id": "third", "tool": tool, "args": {"task": "t"},
                      "depends_on": ["second"]})
    return {"name": "revised", "version": "2" if migrated else "1", "steps": steps}


@pytest.mark.parametrize("watch", WATCHES)
def test_a_label_and_a_migration_in_flight_are_taken_in_without_calling_again(
        saga: Saga, settings: Settings, tmp_path: Path, worker: Callable[[str], None],  # noqa: F811
        watch: str) -> None:
    log, gates = tmp_path / "calls.jsonl", tmp_path / "gates"
    gates.mkdir()
    submit(settings, tmp_path, flow(gates), "REVISE-1")
    worker(WATCHES[watch])

    wait_for("the first step runs", lambda: began(log, "first"))
    labelled = cli(settings, log, "label", "REVISE-1", "team=payments", "--actor", "ops")
    assert labelled.returncode == 0, labelled.stderr
    (gates / "first").touch()

    wait_for("the second step runs", lambda: began(log, "second"))
    (tmp_path / "v2.json").write_text(json.dumps(flow(gates, migrated=True)), "utf-8")
    migrated = cli(settings, log, "migrate", "REVISE-1", "--to", str(tmp_path / "v2.json"),
                   "--actor", "ops", *TOOLS)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "migrated" in migrated.stdout
    (gates / "second").touch()

    wait_for("the run ends", lambda: saga.get("REVISE-1").is_finished, seconds=30)
    run = saga.get("REVISE-1")
    assert run.status == "completed", run.error
    assert (began(log, "first"), began(log, "second")) == (1, 1)  # never called again
    assert [c["step"] for c in calls(log) if c["tool"] == "act"] == ["third"]
    assert types(saga, "REVISE-1") == [
        "RunStarted", "StepStarted", "RunLabelled", "StepCompleted", "StepStarted",
        "DefinitionMigrated", "StepCompleted", "StepStarted", "StepCompleted",
        "RunCompleted"]  # no StepFailed (Interrupted), no RunTakenOver
    listed = cli(settings, log, "list", "--label", "team=payments")
    assert listed.returncode == 0, listed.stderr
    assert "REVISE-1" in listed.stdout
    verified = cli(settings, log, "replay", "REVISE-1", "--verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_migration_naming_a_tool_the_worker_lacks_leaves_the_run_to_one_that_has_it(
        saga: Saga, settings: Settings, tmp_path: Path, worker: Callable[[str], None],  # noqa: F811
        ) -> None:
    """The worker driving the run lets the call in flight finish, records it, starts
    nothing of the new plan and lets the run go; a worker with the tool goes on (no
    takeover: nothing was left in flight)."""
    log, gates = tmp_path / "calls.jsonl", tmp_path / "gates"
    gates.mkdir()
    (gates / "first").touch()
    submit(settings, tmp_path, flow(gates), "REVISE-2")
    worker(WATCHES["watched"])
    wait_for("the second step runs", lambda: began(log, "second"))
    (tmp_path / "v2.json").write_text(
        json.dumps(flow(gates, migrated=True, tool="debugger")), "utf-8")
    more = ("--tools", "tests.standins.graph_standins")
    migrated = cli(settings, log, "migrate", "REVISE-2", "--to", str(tmp_path / "v2.json"),
                   "--actor", "ops", *TOOLS, *more)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    (gates / "second").touch()
    run_uuid = str(saga.get("REVISE-2").id)
    wait_for("the second step is recorded and the worker lets the run go",
             lambda: saga.get("REVISE-2").step("second")["status"] == "completed"
             and saga.leases.holder(run_uuid) is None, seconds=30)
    assert "third" not in saga.get("REVISE-2").steps

    other = subprocess.Popen(
        [sys.executable, "-m", "saga.cli", "worker", *TOOLS, *more, "--poll", "0.05",
         "--id", "w2"], cwd=ROOT, env=env_for(settings, log, "0.1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("the run completes", lambda: saga.get("REVISE-2").is_finished, seconds=30)
    finally:
        other.send_signal(signal.SIGTERM)
        _, err = other.communicate(timeout=60)
    assert other.returncode == 0, err
    run = saga.get("REVISE-2")
    assert run.status == "completed", run.error
    assert run.step("third")["worker"] == "w2"
    assert began(log, "second") == 1
    assert [c["step"] for c in calls(log) if c["tool"] == "debugger"] == ["third"]
    assert types(saga, "REVISE-2") == [
        "RunStarted", "StepStarted", "StepCompleted", "StepStarted", "DefinitionMigrated",
        "StepCompleted", "StepStarted", "StepCompleted", "RunCompleted"]
