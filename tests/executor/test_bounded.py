"""No step runs without bound: an answer the log cannot hold as it is, an error no call
path expected, and a tool that kills its worker each end in a recorded outcome."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from saga import Saga
from saga.config import Settings
from tests.executor.test_recovery import LEASE, ROOT, recover, store_env
from tests.standins import standins


def test_an_answer_with_a_lone_surrogate_is_recorded_once(saga: Saga) -> None:
    standins.CALLS.clear()
    run = saga.run(saga.load({"name": "s", "steps": [
        {"id": "s", "tool": "surrogate", "retry": {"max_attempts": 3, "delay": 0.01}}]}))
    assert run.status == "completed"
    assert run.outputs == {"s": {"text": "a\ufffdb", "\ufffdkey": 1}}
    assert [c["tool"] for c in standins.CALLS].count("surrogate") == 1
    assert [e["type"] for e in saga.history(run.run_id)].count("StepStarted") == 1


def test_an_unexpected_error_in_a_call_is_a_recorded_failure(saga: Saga,
                                                            monkeypatch: object) -> None:
    async def broken(self: object, action: object) -> None:
        raise RuntimeError("the call path itself broke")

    from saga.executor import drive
    monkeypatch.setattr(drive.Drive, "_call_step", broken)  # type: ignore[attr-defined]
    run = saga.run(saga.load({"name": "u", "steps": [{"id": "a", "tool": "noop"}]}))
    assert run.status == "failed"
    failed = [e for e in saga.history(run.run_id) if e["type"] == "StepFailed"]
    assert [(e["payload"]["error_type"], e["payload"]["attempt"]) for e in failed] == [
        ("RuntimeError", 1)]


def test_a_tool_that_kills_its_worker_stops_after_max_attempts(settings: Settings,
                                                               saga: Saga,
                                                               tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    run = saga.submit(saga.load({"name": "k", "steps": [
        {"id": "k", "tool": "suicide", "retry": {"max_attempts": 2, "delay": 0.01}}]}))
    env = store_env(settings) | {"SAGA_TEST_CALL_LOG": str(log)}
    for _ in range(6):  # more worker lives than the step has attempts
        subprocess.run([sys.executable, "-m", "saga.cli", "worker", "--until-idle", "--tools",
                        "tests.standins.standins", "--poll", "0.05", "--lease", str(LEASE)],
                       cwd=ROOT, env=env, capture_output=True, timeout=60, check=False)
        time.sleep(LEASE)  # the dead worker's lease expires
        if saga.get(run.run_id).is_finished:
            break
    recover(saga)
    final = saga.get(run.run_id)
    assert final.status == "failed"
    # The first death is not blamed on the run (it was not yet a suspect, driven alone);
    # each later one, at once after the call started, is: two end the step.
    assert final.steps["k"]["blamed"] == 2
    assert final.steps["k"]["interrupted"] == final.steps["k"]["attempt"] >= 3
    assert final.error is not None and final.error["type"] == "Interrupted"
    assert len(log.read_text(encoding="utf-8").splitlines()) == final.steps["k"]["attempt"]


def test_a_poison_run_is_quarantined_and_the_others_complete(settings: Settings, saga: Saga,
                                                              tmp_path: Path) -> None:
    """A run whose tool kills every worker that drives it (with attempts to spare) is
    quarantined after three deaths blamed on it; the runs beside it all complete."""
    log = tmp_path / "calls.jsonl"
    poison = saga.submit(saga.load({"name": "poison", "steps": [
        {"id": "k", "tool": "suicide", "retry": {"max_attempts": 10, "delay": 0.01}}]}))
    normal = [saga.submit(saga.load({"name": "fine", "steps": [
        {"id": "a", "tool": "noop"}]})) for _ in range(5)]
    env = store_env(settings) | {"SAGA_TEST_CALL_LOG": str(log)}
    for _ in range(7):
        subprocess.run([sys.executable, "-m", "saga.cli", "worker", "--until-idle", "--tools",
                        "tests.standins.standins", "--poll", "0.05", "--lease", str(LEASE)],
                       cwd=ROOT, env=env, capture_output=True, timeout=60, check=False)
        time.sleep(LEASE)
        if saga.get(poison.run_id).is_finished:
            break
    recover(saga)
    quarantined = saga.get(poison.run_id)
    assert quarantined.status == "failed"
    assert quarantined.error is not None and quarantined.error["type"] == "Quarantined"
    assert quarantined.steps["k"]["blamed"] == 3  # the third blamed death quarantined it
    assert quarantined.takeovers >= 4  # the first (not yet a suspect) is not blamed
    assert len(log.read_text(encoding="utf-8").splitlines()) == quarantined.takeovers
    assert all(saga.get(r.run_id).status == "completed" for r in normal)
    assert [r["run_id"] for r in saga.list_runs(status="failed")] == [poison.run_id]


def test_a_poison_run_among_a_hundred_on_two_workers(sqlite_settings: Settings,
                                                     tmp_path: Path) -> None:
    """Two worker processes (restarted when one dies) drain 100 runs beside one whose tool
    kills every worker that drives it: the 100 complete, the poison run is quarantined
    after its third blamed death and what it had done is undone."""
    settings = sqlite_settings
    with Saga(settings, tools=["tests.standins.standins"]) as saga:
        poison = saga.submit(saga.load({"name": "poison", "steps": [
            {"id": "made", "tool": "echo", "args": {"x": 1},
             "compensate": {"tool": "echo", "args": {"undo": 1}}},
            {"id": "k", "tool": "suicide", "retry": {"max_attempts": 10, "delay": 0.01}}]}))
        plan = saga.load({"name": "fine", "steps": [{"id": "a", "tool": "echo"},
                                                    {"id": "b", "tool": "noop"}]})
        normal = [saga.submit(plan).run_id for _ in range(100)]
    env = store_env(settings) | {"SAGA_TEST_CALL_LOG": str(tmp_path / "calls.jsonl")}
    command = [sys.executable, "-m", "saga.cli", "worker", "--tools", "tests.standins.standins",
               "--poll", "0.05", "--lease", str(LEASE), "--concurrency", "8"]
    slots: list[subprocess.Popen[bytes] | None] = [None, None]
    started = deaths = 0
    deadline = time.monotonic() + 150
    with Saga(settings) as saga:
        try:
            while time.monotonic() < deadline:
                for i, proc in enumerate(slots):
                    if proc is None or proc.poll() is not None:
                        deaths += proc is not None
                        slots[i] = subprocess.Popen(command, cwd=ROOT, env=env,
                                                    stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)
                        started += 1
                if saga.get(poison.run_id).is_finished and all(
                        saga.get(r).is_finished for r in normal):
                    break
                time.sleep(0.2)
        finally:
            for proc in slots:
                if proc is not None:
                    proc.terminate()
                    proc.wait(30)
        done = [saga.get(r).status for r in normal]
        assert done == ["completed"] * 100
        quarantined = saga.get(poison.run_id)
        # failed with Quarantined, and its completed step undone: so it ends compensated
        assert quarantined.status == "compensated", quarantined.status
        assert quarantined.error is not None and quarantined.error["type"] == "Quarantined"
        assert quarantined.steps["k"]["blamed"] == 3
        assert quarantined.steps["made"]["status"] == "compensated"
        listed = saga.list_runs(status="compensated")
        assert [r["run_id"] for r in listed] == [poison.run_id]
        assert deaths >= 3  # each takeover followed a worker the poison run killed


def test_the_quarantine_threshold_is_configured_and_recorded(sqlite_settings: Settings,
                                                              tmp_path: Path) -> None:
    from dataclasses import replace

    settings = replace(sqlite_settings, quarantine_after=2)
    with Saga(settings, tools=["tests.standins.standins"]) as saga:
        poison = saga.submit(saga.load({"name": "poison", "steps": [
            {"id": "k", "tool": "suicide", "retry": {"max_attempts": 10, "delay": 0.01}}]}))
        assert poison.options["quarantine_after"] == 2  # a worker with other settings agrees
        env = store_env(settings) | {"SAGA_TEST_CALL_LOG": str(tmp_path / "calls.jsonl")}
        for _ in range(6):
            subprocess.run([sys.executable, "-m", "saga.cli", "worker", "--until-idle",
                            "--tools", "tests.standins.standins", "--poll", "0.05", "--lease",
                            str(LEASE)], cwd=ROOT, env=env, capture_output=True, timeout=60,
                           check=False)
            time.sleep(LEASE)
            if saga.get(poison.run_id).is_finished:
                break
        recover(saga)
        quarantined = saga.get(poison.run_id)
        assert quarantined.error is not None and quarantined.error["type"] == "Quarantined"
        assert quarantined.steps["k"]["blamed"] == 2
