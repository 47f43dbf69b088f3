"""The worker journey as a user types it: submit, worker, retry, compensate, cancel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def saga(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_HOME": str(cwd / ".saga"), "SAGA_ACTOR": "ops", "SAGA_LEASE_SECONDS": "2"}
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_submit_then_worker_until_idle(tmp_path: Path) -> None:
    template = str(ROOT / "saga" / "templates" / "quickstart.yaml")
    assert saga(["db", "init"], tmp_path).returncode == 0
    ids = [json.loads(saga(["submit", template, "--json"], tmp_path).stdout)["run_id"]
           for _ in range(3)]
    assert {json.loads(saga(["status", i, "--json"], tmp_path).stdout)["status"]
            for i in ids} == {"running"}
    worker = saga(["worker", "--until-idle", "--poll", "0.05", "--id", "w1"], tmp_path)
    assert worker.returncode == 0, worker.stderr
    assert "stopped after 3 drives" in worker.stderr
    for run_id in ids:
        status = json.loads(saga(["status", run_id, "--json"], tmp_path).stdout)
        assert status["status"] == "completed"
        history = json.loads(saga(["history", run_id, "--json"], tmp_path).stdout)
        assert {e["payload"]["worker"] for e in history if e["type"] == "StepStarted"} == {"w1"}
        assert saga(["replay", run_id, "--verify"], tmp_path).returncode == 0


def test_retry_compensate_and_cancel(tmp_path: Path) -> None:
    flaky = tmp_path / "flaky.yaml"
    flaky.write_text("""
name: flaky
error_handling: {rollback_on_failure: false}
steps:
  - id: made
    tool: echo
    args: {thing: 1}
    compensate: {tool: echo, args: {removed: "{{ output.thing }}"}}
  - id: shaky
    tool: fail
    args: {message: "not yet", times: 1}
""")
    ran = saga(["run", str(flaky), "--json"], tmp_path)
    assert ran.returncode == 1
    run_id = json.loads(ran.stdout)["run_id"]
    retried = saga(["retry", run_id, "--json"], tmp_path)
    assert retried.returncode == 0, retried.stderr
    result = json.loads(retried.stdout)
    assert result["status"] == "completed"
    assert result["steps"]["shaky"]["attempt"] == 2
    history = json.loads(saga(["history", run_id, "--json"], tmp_path).stdout)
    retry_event = next(e for e in history if e["type"] == "RunRetried")
    assert retry_event["payload"] == {"actor": "ops", "steps": ["shaky"], "reopened": [],
                                      "reason": None, "asked_again": []}
    made = [e for e in history if e["type"] == "StepStarted" and e["step_id"] == "made"]
    assert len(made) == 1  # completed work was kept
    assert saga(["replay", run_id, "--verify"], tmp_path).returncode == 0

    undone = saga(["compensate", run_id, "--reason", "roll back the release", "--json"],
                  tmp_path)
    assert undone.returncode == 0, undone.stderr
    assert json.loads(undone.stdout)["status"] == "compensated"
    again = saga(["compensate", run_id], tmp_path)
    assert again.returncode == 2 and "cannot compensate" in again.stderr

    waiting = tmp_path / "waiting.yaml"
    waiting.write_text("""
name: waiting
steps:
  - id: made
    tool: echo
    args: {thing: 2}
    compensate: {tool: echo, args: {removed: "{{ output.thing }}"}}
  - id: gated
    tool: noop
    confirm: "Really?"
""")
    ran = saga(["run", str(waiting), "--json"], tmp_path)
    assert json.loads(ran.stdout)["status"] == "waiting"
    run_id = json.loads(ran.stdout)["run_id"]
    cancelled = saga(["cancel", run_id, "--reason", "changed my mind", "--json"], tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["status"] == "cancelled"
    history = json.loads(saga(["history", run_id, "--json"], tmp_path).stdout)
    assert [e["type"] for e in history][-4:] == ["CompensationStarted",
                                                 "StepCompensationStarted",
                                                 "StepCompensated", "RunCancelled"]
    assert history[-1]["payload"]["actor"] == "ops"
    assert saga(["replay", run_id, "--verify"], tmp_path).returncode == 0


def test_run_shows_live_progress_on_a_terminal(tmp_path: Path) -> None:
    import shlex
    import shutil

    script = shutil.which("script")
    assert script, "util-linux 'script' provides the pseudo-terminal for this test"
    slow = tmp_path / "slow.yaml"
    slow.write_text("name: slow\nsteps:\n  - {id: a, tool: sleep, args: {seconds: 1.5}}\n"
                    "  - {id: b, tool: sleep, args: {seconds: 0.4}}\n")
    command = shlex.join([sys.executable, "-m", "saga.cli", "run", str(slow)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_HOME": str(tmp_path / ".saga"), "TERM": "xterm"}
    out = subprocess.run([script, "-qec", command, "/dev/null"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout
    frames = out.stdout.replace("\r", "\n")
    assert "slow — running" in frames  # the live table, redrawn while steps run
    # ... at every refresh, not only at commits: the elapsed time moves during step a
    elapsed = set(re.findall(r"slow — running — (\d+\.\d)s", frames))
    assert len(elapsed) >= 5, sorted(elapsed)
    assert re.search(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏] running", frames)
    assert re.search(r"run \S+ \(slow\): \S*completed", frames)  # then the summary


def test_a_run_keeps_the_definition_it_was_submitted_with(tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text("name: pinned\nsteps:\n  - {id: a, tool: echo, args: {version: 1}}\n")
    run_id = json.loads(saga(["submit", str(flow), "--json"], tmp_path).stdout)["run_id"]
    flow.write_text("name: pinned\nsteps:\n  - {id: a, tool: echo, args: {version: 2}}\n"
                    "  - {id: b, tool: fail, args: {message: edited}}\n")
    assert saga(["worker", "--until-idle", "--poll", "0.05"], tmp_path).returncode == 0
    status = json.loads(saga(["status", run_id, "--json"], tmp_path).stdout)
    assert status["status"] == "completed"
    assert status["steps"] == {"a": status["steps"]["a"]}
    assert status["steps"]["a"]["output"] == {"version": 1}
