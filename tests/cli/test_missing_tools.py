"""A process started without a run's ``--tools`` module changes no run (DESIGN.md promise
7): ``saga resume``, ``retry``, ``compensate`` and ``saga worker`` each leave the run as
it was, say which tools are missing and how to supply them, and a process with the
module then goes on. Every command runs in a process of its own, on SQLite and on
PostgreSQL."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from saga.api import Saga
from saga.config import Settings

TOOLS = '''
import os
from saga import tool

def _note(what):
    with open(os.environ["OPS_CALLS"], "a") as f:
        f.write(what + "\\n")

@tool("ops.greet")
def greet(params, ctx):
    _note("greet")
    return {"hi": params.get("name")}

@tool("ops.undo")
def undo(params, ctx):
    _note("undo")
    return {"undone": params.get("what")}
'''

GATED = """
name: gated-greeting
steps:
  - id: gate
    tool: noop
    confirm: "go?"
  - id: greet
    tool: ops.greet
    args: {name: ada}
"""


class Cli:
    """``python -m saga.cli`` in a new process on one store, in a directory holding the
    ``ops`` module of tools (``--tools opstools`` imports it)."""

    def __init__(self, settings: Settings, where: Path) -> None:
        self.where = where
        (where / "opstools.py").write_text(TOOLS)
        self.calls = where / "calls.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        env |= {"SAGA_LEASE_SECONDS": "2", "OPS_CALLS": str(self.calls)}
        if settings.is_postgres:
            env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                    "SAGA_DATABASE_SCHEMA": settings.schema or ""}
        else:
            env["SAGA_HOME"] = str(settings.home)
        self.env = env

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=self.where,
                              env=self.env, capture_output=True, text=True, timeout=120)

    def history(self, run_id: str) -> list[dict[str, Any]]:
        done = self("history", run_id, "--json")
        assert done.returncode == 0, done.stderr
        events: list[dict[str, Any]] = json.loads(done.stdout)
        return events

    def start(self, text: str, *, tools: str = "opstools") -> str:
        """Write a composition, run it with ``--tools TOOLS`` (exit 0 or 1), its run id."""
        flow = self.where / "flow.yaml"
        flow.write_text(text)
        ran = self("run", str(flow), "--tools", tools, "--json")
        assert ran.returncode in (0, 1), ran.stderr
        run_id: str = json.loads(ran.stdout)["run_id"]
        return run_id

    def called(self) -> list[str]:
        return self.calls.read_text().split() if self.calls.exists() else []


def refused(done: subprocess.CompletedProcess[str], run_id: str, *tools: str) -> None:
    """One clear line on stderr, exit 2: the missing tools, and how to give them."""
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: run {run_id} needs tool"), lines
    for name in tools:
        assert repr(name) in lines[0]
    assert "--tools opstools" in lines[0] and "saga.toml" in lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_resume_without_the_tools_module_leaves_a_waiting_run_as_it_was(
        settings: Settings, tmp_path: Path) -> None:
    cli = Cli(settings, tmp_path)
    flow = tmp_path / "gated.yaml"
    flow.write_text(GATED)
    ran = cli("run", str(flow), "--tools", "opstools", "--json")
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    approved = cli("approve", run_id, "gate")
    assert approved.returncode == 0, approved.stderr
    # The hint names the module the run was started with.
    assert f"saga resume {run_id} --tools opstools" in approved.stdout
    before = cli.history(run_id)

    refused(cli("resume", run_id), run_id, "ops.greet")
    refused(cli("resume", run_id), run_id, "ops.greet")  # and again: still nothing changed
    assert cli.history(run_id) == before
    status = json.loads(cli("status", run_id, "--json").stdout)
    assert status["status"] == "running" and "greet" not in status["steps"]
    assert cli.called() == []

    resumed = cli("resume", run_id, "--tools", "opstools", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert cli.called() == ["greet"]
    assert cli("replay", run_id, "--verify").returncode == 0


def test_retry_and_compensate_without_the_module_record_nothing(settings: Settings,
                                                                 tmp_path: Path) -> None:
    cli = Cli(settings, tmp_path)
    flow = tmp_path / "flaky.yaml"
    flow.write_text("""
name: flaky-greeting
error_handling: {rollback_on_failure: false}
steps:
  - id: greet
    tool: ops.greet
    args: {name: ada}
    compensate: {tool: ops.undo, args: {what: "{{ output.hi }}"}}
  - id: shaky
    tool: fail
    args: {message: "not yet", times: 1}
""")
    ran = cli("run", str(flow), "--tools", "opstools", "--json")
    assert ran.returncode == 1, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    failed = cli.history(run_id)

    refused(cli("retry", run_id), run_id, "ops.greet", "ops.undo")
    assert cli.history(run_id) == failed  # no RunRetried either
    retried = cli("retry", run_id, "--tools", "opstools", "--json")
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout)["status"] == "completed"

    completed = cli.history(run_id)
    refused(cli("compensate", run_id), run_id, "ops.undo")
    assert cli.history(run_id) == completed  # no CompensationStarted
    undone = cli("compensate", run_id, "--tools", "opstools", "--json")
    assert undone.returncode == 0, undone.stderr
    assert json.loads(undone.stdout)["status"] == "compensated"
    assert cli.called() == ["greet", "undo"]
    assert cli("replay", run_id, "--verify").returncode == 0


def test_a_worker_without_the_module_leaves_the_run_to_one_with_it(settings: Settings,
                                                                    tmp_path: Path) -> None:
    cli = Cli(settings, tmp_path)
    flow = tmp_path / "greeting.yaml"
    flow.write_text("name: greeting\nsteps:\n  - {id: first, tool: echo, args: {a: 1}}\n"
                    "  - {id: greet, tool: ops.greet, args: {name: ada}}\n")
    submitted = cli("submit", str(flow), "--tools", "opstools", "--json")
    assert submitted.returncode == 0, submitted.stderr
    run_id = json.loads(submitted.stdout)["run_id"]
    before = cli.history(run_id)

    bare = cli("worker", "--until-idle", "--poll", "0.05", "--id", "bare")
    assert bare.returncode == 0, bare.stderr
    said = [line for line in bare.stderr.splitlines() if run_id in line]
    assert len(said) == 1, bare.stderr
    assert "'ops.greet'" in said[0] and "--tools opstools" in said[0]
    assert cli.history(run_id) == before  # not even its first step
    assert cli.called() == []

    # The run was given up at once: a worker with the module takes it without waiting
    # for a lease to expire.
    able = cli("worker", "--until-idle", "--poll", "0.05", "--id", "able",
               "--tools", "opstools")
    assert able.returncode == 0, able.stderr
    history = cli.history(run_id)
    assert history[-1]["type"] == "RunCompleted"
    assert {e["payload"]["worker"] for e in history if e["type"] == "StepStarted"} == {"able"}
    assert cli.called() == ["greet"]


def test_a_worker_says_once_that_it_leaves_a_run(sqlite_settings: Settings, tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    cli = Cli(sqlite_settings, tmp_path)
    flow = tmp_path / "greeting.yaml"
    flow.write_text("name: greeting\nsteps:\n  - {id: greet, tool: ops.greet}\n")
    run_id = cli("submit", str(flow), "--tools", "opstools").stdout.strip()
    monkeypatch.setattr("saga.worker.LACKING_RECHECK", 0.05)  # looked at again soon
    with Saga(sqlite_settings) as s, caplog.at_level(logging.WARNING, "saga.worker"):
        version = s.get(run_id).version
        worker = s.worker_loop(worker_id="bare", poll_interval=0.02)
        deadline = time.monotonic() + 30
        worker.run(stop=lambda: worker.driven >= 3 or time.monotonic() > deadline)
        assert worker.driven >= 3  # it tried the run three times ...
        said = [r for r in caplog.records if run_id in r.getMessage()]
        assert len(said) == 1  # ... and said so once
        assert s.get(run_id).version == version


def test_a_nested_composition_needs_its_tools_too(settings: Settings, tmp_path: Path) -> None:
    """A child run's tools are its parent's: resuming either without the module changes
    neither, whether the child run waits already or its step has yet to start it."""
    cli = Cli(settings, tmp_path)
    (tmp_path / "child.yaml").write_text(GATED.replace("gated-greeting", "child"))
    (tmp_path / "later.yaml").write_text(
        "name: later\nsteps:\n  - {id: greet, tool: ops.greet, args: {name: bo}}\n")
    (tmp_path / "parent.yaml").write_text("""
name: parent
steps:
  - {id: first, tool: echo, args: {a: 1}}
  - {id: sub, use: child.yaml}
  - {id: hold, tool: noop, confirm: "more?"}
  - {id: more, use: later.yaml}
""")
    ran = cli("run", "parent.yaml", "--tools", "opstools", "--json")
    assert ran.returncode == 0, ran.stderr
    parent = json.loads(ran.stdout)["run_id"]
    listed = json.loads(cli("list", "--json").stdout)
    child = next(r["run_id"] for r in listed if r["definition"] == "child")
    approved = cli("approve", child, "gate")
    assert approved.returncode == 0, approved.stderr
    assert f"saga resume {child} --tools opstools" in approved.stdout  # its parent's module
    before = (cli.history(parent), cli.history(child))
    for run_id in (child, parent):
        done = cli("resume", run_id)
        assert done.returncode == 2 and "'ops.greet'" in done.stderr, done.stderr
        assert "--tools opstools" in done.stderr and "Traceback" not in done.stderr
    assert (cli.history(parent), cli.history(child)) == before
    assert cli.called() == []

    deadline = time.monotonic() + 60
    while json.loads(cli("status", parent, "--json").stdout)["status"] != "waiting" \
            or cli.called() != ["greet"]:
        assert time.monotonic() < deadline
        resumed = cli("resume", parent, "--tools", "opstools")
        assert resumed.returncode == 0, resumed.stderr
    assert cli("approve", parent, "hold").returncode == 0
    # `more` has no child run yet: its composition's tools are looked at before it starts.
    before = cli.history(parent)
    done = cli("resume", parent)
    assert done.returncode == 2 and "'ops.greet'" in done.stderr, done.stderr
    assert cli.history(parent) == before
    finished = cli("resume", parent, "--tools", "opstools", "--json")
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout)["status"] == "completed"
    assert cli.called() == ["greet", "greet"]


def test_a_fleet_with_a_worker_lacking_the_module_still_finishes_the_run(
        settings: Settings, tmp_path: Path) -> None:
    """Both workers run at once: the one without the module says once that it leaves the
    run and records nothing; the one with it drives the run to its end."""
    cli = Cli(settings, tmp_path)
    flow = tmp_path / "greeting.yaml"
    flow.write_text("name: greeting\nsteps:\n  - {id: greet, tool: ops.greet}\n"
                    "  - {id: after, tool: echo, args: {b: 2}}\n")
    run_id = cli("submit", str(flow), "--tools", "opstools").stdout.strip()
    said = tmp_path / "bare.err"
    with said.open("w") as err:
        bare = subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--poll", "0.05",
                                 "--id", "bare"], cwd=tmp_path, env=cli.env,
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    try:
        deadline = time.monotonic() + 60
        while run_id not in said.read_text():  # it tried the run, and let it go
            assert bare.poll() is None and time.monotonic() < deadline, said.read_text()
            time.sleep(0.05)
        able = cli("worker", "--until-idle", "--poll", "0.05", "--id", "able",
                   "--tools", "opstools")
        assert able.returncode == 0, able.stderr
    finally:
        bare.terminate()
        bare.wait(timeout=60)
    history = cli.history(run_id)
    assert history[-1]["type"] == "RunCompleted"
    assert {e["payload"]["worker"] for e in history if e["type"] == "StepStarted"} == {"able"}
    assert cli.called() == ["greet"]
    assert len([line for line in said.read_text().splitlines() if run_id in line]) == 1


def test_a_cancel_needs_only_the_tools_that_undo(settings: Settings, tmp_path: Path) -> None:
    """Cancelling a waiting run calls only compensations: without the module of a step
    that never ran it goes through; without the module of a compensation it is refused."""
    cli = Cli(settings, tmp_path)
    flow = tmp_path / "undo.yaml"
    flow.write_text("""
name: undoable
steps:
  - id: made
    tool: echo
    args: {thing: 1}
    compensate: {tool: echo, args: {removed: "{{ output.thing }}"}}
  - id: gate
    tool: noop
    confirm: "go?"
  - id: greet
    tool: ops.greet
    args: {name: ada}
""")
    ran = cli("run", str(flow), "--tools", "opstools", "--json")
    run_id = json.loads(ran.stdout)["run_id"]
    cancelled = cli("cancel", run_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    assert status_of(cli, run_id)["steps"]["made"]["status"] == "compensated"

    greeted = tmp_path / "greeted.yaml"
    greeted.write_text("""
name: greeted
steps:
  - id: greet
    tool: ops.greet
    args: {name: ada}
    compensate: {tool: ops.undo, args: {what: "{{ output.hi }}"}}
  - id: gate
    tool: noop
    confirm: "go?"
""")
    ran = cli("run", str(greeted), "--tools", "opstools", "--json")
    run_id = json.loads(ran.stdout)["run_id"]
    before = cli.history(run_id)
    refused(cli("cancel", run_id), run_id, "ops.undo")
    assert cli.history(run_id) == before
    cancelled = cli("cancel", run_id, "--tools", "opstools", "--json")
    assert json.loads(cancelled.stdout)["status"] == "cancelled", cancelled.stderr
    assert cli.called() == ["greet", "undo"]


def status_of(cli: Cli, run_id: str) -> dict[str, Any]:
    done = cli("status", run_id, "--json")
    result: dict[str, Any] = json.loads(done.stdout)
    return result
