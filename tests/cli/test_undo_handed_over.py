"""``saga cancel`` (compensate, retry) given while a live worker holds the run: the
command is recorded, and the worker takes it in and carries it out, so the command
succeeded even when that takes longer than the command waits for the run's lease.

A real ``saga worker`` process (leases of one second, as the conformance simulator
runs it) and ``saga cancel`` in a process of its own, twice: while a step's call is in
flight (a call in a thread, which cannot be stopped: the worker waits for it before
undoing), and while the worker is already running the slow undo. The simulator's
SQLite long mode saw ``saga cancel`` exit 1 there (the run was still ``compensating``).
Then ``saga retry`` and ``saga compensate`` while another holder keeps the lease.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from saga import Saga
from saga.config import Settings
from saga.store.leases import lease_key
from tests.executor.test_incoming import ROOT, TOOLS, began, calls, env_for, submit, wait_for

LEASE = "1"


def command(settings: Settings, log: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A CLI command in a new process, waiting at most one short lease for the run."""
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT,
                          env={**env_for(settings, log, "0.1"), "SAGA_LEASE_SECONDS": LEASE},
                          capture_output=True, text=True, timeout=120)


def flow(gates: Path, slow_tool: str) -> dict[str, Any]:
    """A quick step whose undo waits for a gate file, then a slow step (60 s, or until
    its gate exists)."""
    return {"name": "undone", "steps": [
        {"id": "first", "tool": "act",
         "compensate": {"tool": "linger", "args": {"gate": str(gates / "undo")}}},
        {"id": "slow", "tool": slow_tool, "depends_on": ["first"],
         "args": {"gate": str(gates / "slow"), "seconds": 60},
         "compensate": {"tool": "undo", "args": {"what": "slow"}}}]}


def opened(gates: dict[str, Path]) -> None:
    for gate in ("slow", "undo"):
        for rid in gates:
            (gates[rid] / gate).touch()


def handed_over(done: subprocess.CompletedProcess[str], status: str) -> None:
    """The command succeeded: exit 0, the run as it is now, and who carries it out."""
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["status"] == status
    assert "saga watch" in done.stderr and "w1" in done.stderr, done.stderr


def test_a_cancel_the_holding_worker_carries_out_exits_0(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    gates = {rid: tmp_path / rid for rid in ("IN-FLIGHT", "UNDOING")}
    for rid, tool in (("IN-FLIGHT", "linger"), ("UNDOING", "linger_async")):
        gates[rid].mkdir()
        submit(settings, tmp_path, flow(gates[rid], tool), rid)
    worker = subprocess.Popen(
        [sys.executable, "-m", "saga.cli", "worker", *TOOLS, "--poll", "0.05", "--id", "w1",
         "--lease", LEASE], cwd=ROOT, env=env_for(settings, log, "0.1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("both slow calls run", lambda: began(log, "slow") == 2, seconds=30)
        # The call in a thread goes on after the cancel: the worker waits for it.
        done = command(settings, log, "cancel", "IN-FLIGHT", "--json", *TOOLS)
        handed_over(done, "compensating")
        assert saga.get("IN-FLIGHT").step("slow")["status"] == "failed"  # cut short
        # The async call is cut short at once; the worker is then in the slow undo.
        done = command(settings, log, "cancel", "UNDOING", "--reason", "dup", *TOOLS)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "compensating" in done.stdout
        assert "the worker holding the run (w1" in done.stderr, done.stderr
        assert "saga watch UNDOING" in done.stderr
        assert [c["step"] for c in calls(log) if c["tool"] == "linger"
                and c.get("phase") == "began"][-1] == "first"  # its undo runs

        opened(gates)
        wait_for("both runs end", lambda: all(saga.get(r).is_finished for r in gates),
                 seconds=30)
        assert {saga.get(r).status for r in gates} == {"cancelled"}
    finally:
        opened(gates)  # else a worker stopped waits for its calls
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err


def test_a_retry_or_compensation_a_live_holder_takes_in_exits_0(
        saga: Saga, settings: Settings, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    (tmp_path / "failing.json").write_text(json.dumps({"name": "failing", "steps": [
        {"id": "a", "tool": "act", "args": {"fail_times": 1},
         "compensate": {"tool": "undo", "args": {"what": "a"}}}]}), "utf-8")
    failed = command(settings, log, "run", str(tmp_path / "failing.json"), "--id", "REDO",
                     *TOOLS)
    assert failed.returncode == 1 and saga.get("REDO").status == "failed"
    held = lease_key(str(saga.get("REDO").id))
    for verb, status in (("retry", "running"), ("compensate", "compensating")):
        assert saga.leases.claim(held, "w1", 30)  # a live worker took the run
        done = command(settings, log, verb, "REDO", "--json", *TOOLS)
        handed_over(done, status)
        assert len(calls(log)) == 1  # nothing was called by the command's process
        saga.leases.release(held, "w1")
        if verb == "retry":  # the holder carries the retry out (here: this process)
            assert saga.resume("REDO").status == "completed"
    assert saga.resume("REDO").status == "compensated"
