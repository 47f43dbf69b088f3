"""One writer per run across processes: ``saga resume`` beside a live worker.

A run named by its caller (``--id ORDER-42``) is stored under a UUID derived from the name,
and a worker knows it by that UUID. Every process must claim the run's lease under that one
key: ``saga resume ORDER-42`` once claimed a lease of its own under the name, beside the
worker's, and the two live processes each recorded the other's attempt as interrupted and
called a tool that cannot be undone once more than its retries allow (issue 38).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from saga import Saga
from saga.config import Settings
from tests.conformance.harness import ROOT, store_env

TOOLS = ["--tools", "tests.conformance.tools"]
RUN = "BESIDE-1"


def _calls(ledger: Path) -> list[dict[str, object]]:
    if not ledger.exists():
        return []
    lines = [json.loads(line) for line in ledger.read_text().splitlines() if line]
    return [c for c in lines if c.get("kind") != "end"]  # a call's start, not its end


def test_resume_leaves_a_run_to_its_live_worker(settings: Settings, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    flow = tmp_path / "flow.json"
    # fails twice, then succeeds: three calls, each long enough for resume to land in one
    flow.write_text(json.dumps({"name": "beside", "steps": [{
        "id": "s0", "tool": "sim_plain",
        "parameters": {"value": "s0", "fail_times": 2, "seconds": 0.5},
        "retry": {"backoff": "fixed", "delay": 0.05}}]}))
    env = store_env(settings) | {"SAGA_LEASE_SECONDS": "1", "SAGA_ACTOR": "tester",
                                 "SIM_LEDGER": str(ledger), "PYTHONPATH": str(ROOT)}

    def cli(*args: str) -> list[str]:
        return [sys.executable, "-m", "saga.cli", *args, *TOOLS]

    submitted = subprocess.run(cli("submit", str(flow), "--id", RUN), cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    worker = subprocess.Popen(cli("worker", "--poll", "0.05", "--lease", "1"), cwd=tmp_path,
                              env=env, stderr=subprocess.PIPE, text=True)
    saga = Saga(settings)
    try:
        deadline = time.monotonic() + 30
        while not _calls(ledger):  # the worker's first attempt is in flight
            assert time.monotonic() < deadline, "the worker never called the tool"
            time.sleep(0.02)
        resumed = subprocess.run(cli("resume", RUN), cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=60)
        while not saga.get(RUN).is_finished:
            assert time.monotonic() < deadline, "the run never ended"
            time.sleep(0.05)
        run = saga.get(RUN)
        history = [(type(e).__name__, getattr(e, "error_type", None)) for e in saga.events(RUN)]
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=30)
        saga.close()
    assert run.status == "completed", (run.status, resumed.stdout, resumed.stderr, err)
    # one driver at a time: nobody's live attempt was recorded interrupted or taken over
    assert ("RunTakenOver", None) not in history, history
    assert not any(kind == "Interrupted" for _, kind in history), history
    assert [c["attempt"] for c in _calls(ledger)] == [1, 2, 3], (resumed.stderr, history)
