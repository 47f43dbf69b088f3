"""Worker churn: real `saga worker` processes SIGKILLed again and again while their runs
go on. A death is blamed on a run only when the run's own attempt likely caused it; an
attempt a death cut short counts as done for undo."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from saga import Saga
from saga.config import Settings
from saga.domain import step_key
from tests.executor.test_recovery import LEASE, ROOT, store_env

TOOLS = "tests.standins.churn_tools"


def worker(settings: Settings, log: Path, *options: str) -> subprocess.Popen[bytes]:
    """A `saga worker` process on the settings' store, its tools logging to ``log``."""
    env = store_env(settings) | {"SAGA_TEST_CHURN_LOG": str(log)}
    return subprocess.Popen(
        [sys.executable, "-m", "saga.cli", "worker", "--tools", TOOLS, "--poll", "0.05",
         "--lease", str(LEASE), *options], cwd=ROOT, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def entries(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] \
        if log.exists() else []


def wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def work(step_id: str, seconds: float) -> dict[str, Any]:
    return {"id": step_id, "tool": "work", "args": {"seconds": seconds},
            "compensate": {"tool": "unwork"}}


def interrupted_attempts(saga: Saga, run_id: str) -> Counter[str]:
    """How many attempts of each step execution the log records as cut short by a
    worker's death, by step key."""
    return Counter(step_key(e["step_id"], e["payload"]["iteration"])
                   for e in saga.history(run_id) if e["type"] == "StepFailed"
                   and e["payload"]["error_type"] in ("Interrupted", "Quarantined"))


def test_worker_churn_fails_no_healthy_run_and_a_poison_run_is_still_quarantined(
        settings: Settings, tmp_path: Path) -> None:
    """Three workers, one SIGKILLed every 0.4-1.0 s (and restarted) for up to 15 s,
    drive 20 runs of long-ish steps: every healthy run completes (none is failed or quarantined
    for deaths it did not cause), each run that compensates undoes every step whose
    tool acted, and a run whose tool ends its worker's process is quarantined and
    undone all the same."""
    log = tmp_path / "calls.jsonl"
    settings = replace(settings, lease_seconds=LEASE)
    with Saga(settings, tools=[TOOLS]) as saga:
        healthy = saga.load({"name": "healthy", "steps": [
            work("a", 0.8), work("b", 0.8), work("c", 0.8)]})
        refusing = saga.load({"name": "refusing", "steps": [
            work("a", 0.8), work("b", 0.8), {"id": "c", "tool": "refuse"}]})
        poisoned = saga.load({"name": "poisoned", "steps": [
            work("a", 0.1), {"id": "k", "tool": "poison", "retry": {"max_attempts": 10},
                             "compensate": {"tool": "unwork"}}]})
        ok = [saga.submit(healthy).run_id for _ in range(16)]
        undo = [saga.submit(refusing).run_id for _ in range(3)]
        poison = saga.submit(poisoned).run_id
        runs = [*ok, *undo, poison]
        rng = random.Random(38)
        slots = [worker(settings, log, "--concurrency", "2") for _ in range(3)]
        kills = 0
        start = time.monotonic()
        next_kill = start + rng.uniform(0.4, 1.0)
        try:
            while not all(saga.get(r).is_finished for r in runs):
                now = time.monotonic()
                assert now < start + 90, "the runs did not finish"
                for i, proc in enumerate(slots):
                    if proc.poll() is not None:  # killed, or the poison run's doing
                        slots[i] = worker(settings, log, "--concurrency", "2")
                if now >= next_kill and now < start + 15:
                    victim = rng.choice(slots)
                    victim.send_signal(signal.SIGKILL)
                    victim.wait(30)
                    kills += 1
                    next_kill = now + rng.uniform(0.4, 1.0)
                time.sleep(0.1)
        finally:
            stop(slots)
        final = {r: saga.get(r) for r in runs}
        assert kills >= 5
        # The churn did cut attempts short (else this test shows nothing).
        assert sum(final[r].takeovers for r in [*ok, *undo]) >= 3
        assert {r: final[r].status for r in ok} == {r: "completed" for r in ok}
        assert {r: final[r].status for r in undo} == {r: "compensated" for r in undo}
        assert all((final[r].error or {}).get("type") != "Quarantined" for r in runs
                   if r != poison)
        quarantined = final[poison]
        assert quarantined.status == "compensated", quarantined.error
        assert quarantined.error is not None and quarantined.error["type"] == "Quarantined"
        calls = entries(log)
        for run_id in [*undo, poison]:
            acted = {c["step"] for c in calls if c.get("run") == run_id and c["kind"] == "call"}
            undone = {c["step"] for c in calls if c.get("run") == run_id and c["kind"] == "undo"}
            assert acted <= undone, (run_id, acted - undone)
            assert {k for k, s in final[run_id].steps.items()
                    if s["step_id"] in acted and s["status"] != "compensated"} == set()
        assert "k" in {c["step"] for c in calls if c["run"] == poison and c["kind"] == "undo"}
        for run_id in runs:
            assert saga.verify(run_id) is None
