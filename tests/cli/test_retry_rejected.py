"""``saga retry`` on a run failed by a rejected approval asks the person again: a redrive
never overrides a rejection (the conformance simulator's PostgreSQL salt 11435 found the
step run with no approval after a retry). Every command runs in a process of its own, on
SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

from saga.config import Settings
from tests.cli.test_missing_tools import Cli

GATED = """
name: rejected-then-retried
error_handling: {rollback_on_failure: false}
steps:
  - id: first
    tool: ops.greet
    args: {name: first}
  - id: gate
    tool: ops.greet
    args: {name: gated}
    confirm: "deploy?"
"""


def test_retry_of_a_rejected_step_asks_again_and_runs_only_once_approved(
        settings: Settings, tmp_path: Path) -> None:
    cli = Cli(settings, tmp_path)
    cli.env["SAGA_SNAPSHOT_INTERVAL"] = "4"  # each new process reads the run past snapshots
    run_id = cli.start(GATED)
    rejected = cli("reject", run_id, "gate")
    assert rejected.returncode == 0, rejected.stderr
    cli("resume", run_id, "--tools", "opstools")  # drives it: it fails (exit 1)
    assert json.loads(cli("status", run_id, "--json").stdout)["status"] == "failed"

    retried = cli("retry", run_id, "--tools", "opstools", "--json")
    assert retried.returncode == 0, retried.stderr
    status = json.loads(cli("status", run_id, "--json").stdout)
    assert status["status"] == "waiting", status
    assert status["steps"]["gate"]["status"] != "completed"
    assert cli.called() == ["greet"]  # the first step only: the gate did not run
    requests = [e for e in cli.history(run_id) if e["type"] == "ApprovalRequested"]
    assert len(requests) == 2

    approved = cli("approve", run_id, "gate")
    assert approved.returncode == 0, approved.stderr
    resumed = cli("resume", run_id, "--tools", "opstools")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(cli("status", run_id, "--json").stdout)["status"] == "completed"
    assert cli.called() == ["greet", "greet"]
    assert cli("replay", run_id, "--verify").returncode == 0
    assert cli("audit", "verify", run_id).returncode == 0
