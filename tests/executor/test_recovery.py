"""Crash safety: real worker processes SIGKILLed at every event boundary, then recovered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.domain import TERMINAL, step_key
from saga.tools import Registry
from tests.standins import standins

ROOT = Path(__file__).resolve().parents[2]
CRASH_WORKER = ROOT / "tests" / "standins" / "crash_worker.py"
LEASE = 1.0


def effect(step_id: str, value: int, *, fail: bool = False,
           depends_on: list[str] | None = None) -> dict[str, Any]:
    step: dict[str, Any] = {
        "id": step_id, "tool": "effect", "args": {"value": value, "fail": fail},
        "compensate": {"tool": "undo", "args": {"what": "{{ output.step }}"}}}
    if depends_on is not None:
        step["depends_on"] = depends_on
    return step


SCENARIOS = {
    "sequential_success": {"name": "seq-ok", "steps": [effect(f"s{i}", i) for i in range(4)]},
    "sequential_compensate": {"name": "seq-undo", "steps": [
        effect("s0", 0), effect("s1", 1), effect("s2", 2), effect("s3", 3, fail=True)]},
    "parallel_compensate": {"name": "par-undo", "steps": [
        effect("a", 1, depends_on=[]), effect("b", 2, depends_on=[]),
        effect("c", 3, depends_on=[]), effect("join", 4, fail=True, depends_on=["a", "b", "c"])]},
    "parallel_success": {"name": "par-ok", "steps": [
        effect("a", 1, depends_on=[]), effect("b", 2, depends_on=[]),
        effect("join", 3, depends_on=["a", "b"])]},
    "loop_compensate": {"name": "loop-undo", "steps": [
        {"id": "each", "tool": "effect", "loop": [1, 2, 3], "loop_concurrency": 1,
         "args": {"value": "{{ item }}"},
         "compensate": {"tool": "undo", "args": {"what": "{{ item }}"}}},
        effect("last", 9, fail=True)]},
    "nested_compensate": {"name": "nested-undo", "outputs": {"made": "{{ n.outputs.made }}"},
                          "steps": [
        effect("a", 1),
        {"id": "n", "use": str(ROOT / "tests" / "compositions" / "child.yaml"),
         "args": {"who": "x"}},
        effect("b", 2, fail=True)]},
    "repeat_compensate": {"name": "repeat-undo", "steps": [
        {"id": "poll", "tool": "effect", "args": {"value": "{{ iteration }}"},
         "until": "output.value >= 3", "max_iterations": 5,
         "compensate": {"tool": "undo", "args": {"what": "{{ output.value }}"}}},
        effect("last", 9, fail=True)]},
    "layers_degraded": {"name": "layers", "steps": [
        dict(effect("guard", 0, depends_on=[]), layer="guarantee"),
        dict(effect("extra", 1, fail=True, depends_on=["guard"]), layer="enhancement"),
        dict(effect("work", 2, depends_on=["extra"]), layer="execution")]},
    "heal_success": {"name": "heal-ok", "outputs": {"healed": "{{ h.step }}"}, "steps": [
        effect("a", 1),
        {"id": "h", "tool": "act", "args": {"fail_times": 1},
         "heal": [{"when": "true", "do": [{"tool": "effect", "args": {"value": "fix"}}]}]},
        effect("b", 2)]},
    "nested_success": {"name": "nested-ok", "outputs": {"made": "{{ n.outputs.made }}"},
                       "steps": [
        effect("a", 1),
        {"id": "n", "use": str(ROOT / "tests" / "compositions" / "child.yaml"),
         "args": {"who": "x"}},
        effect("b", 2)]},
}


def store_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["SAGA_LEASE_SECONDS"] = str(LEASE)
    if settings.is_postgres:
        env["SAGA_DATABASE_URL"] = settings.database_url or ""
        env["SAGA_DATABASE_SCHEMA"] = settings.schema or ""
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env


def crash_worker(settings: Settings, crash_after: int, call_log: Path) -> int:
    env = store_env(settings) | {"SAGA_TEST_CALL_LOG": str(call_log)}
    proc = subprocess.run([sys.executable, str(CRASH_WORKER), str(crash_after), "--poll",
                           "0.05", "--lease", str(LEASE)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode


def recover(saga: Saga) -> None:
    """What a restarted worker does: wait for the dead worker's lease, then drain."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for _, run_id in saga.app.run_ids():
            held = saga.leases.holder(run_id)
            if held and held[1] > time.time():
                break
        else:
            break
        time.sleep(0.05)
    saga.worker_loop(lease_seconds=LEASE, poll_interval=0.05).run(until_idle=True)


def outcome(saga: Saga, run_id: str) -> dict[str, Any]:
    run = saga.get(run_id)
    outputs = run.outputs
    if isinstance(outputs, dict):  # a child's run id and layer timings differ per run
        outputs = {k: v for k, v in outputs.items() if k not in ("n", "_layers")}
    return {"status": run.status, "outputs": outputs,
            "steps": {k: s["status"] for k, s in run.steps.items()}}


def check_history(saga: Saga, run_id: str) -> None:
    events = saga.history(run_id)
    assert [e["version"] for e in events] == list(range(1, len(events) + 1))
    def key(e: dict[str, Any]) -> str:
        return step_key(e["step_id"], e["payload"]["iteration"])

    completed = Counter(key(e) for e in events if e["type"] == "StepCompleted")
    assert all(n == 1 for n in completed.values()), completed
    compensated = [key(e) for e in events if e["type"] == "StepCompensated"]
    assert len(compensated) == len(set(compensated))
    order = [key(e) for e in events if e["type"] == "StepCompleted"]
    assert compensated == [s for s in reversed(order) if s in compensated]
    starts = [e for e in events if e["type"] == "CompensationStarted"]
    if starts:
        assert compensated == starts[0]["payload"]["steps"]
    assert saga.verify(run_id) is None


def baseline(tmp_path: Path, registry: Registry, definition: dict[str, Any]) -> dict[str, Any]:
    with Saga(Settings(home=tmp_path / "baseline", actor="tester"), registry=registry) as s:
        run = s.run(s.load(definition))
        return outcome(s, run.run_id)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_sigkill_at_every_event_boundary_recovers_to_the_same_outcome(
        scenario: str, sqlite_settings: Settings, registry: Registry, tmp_path: Path) -> None:
    definition = SCENARIOS[scenario]
    expected = baseline(tmp_path, registry, definition)
    boundary = 1
    while True:
        settings = replace(sqlite_settings, home=tmp_path / f"crash{boundary}",
                           lease_seconds=LEASE)
        log = tmp_path / f"calls{boundary}.log"
        with Saga(settings, registry=registry) as saga:
            run = saga.submit(saga.load(definition))
            code = crash_worker(settings, boundary, log)
            if code == 0:
                # Parallel completions can share a commit, so this run needed fewer
                # commits than an earlier one: every boundary it had was covered.
                assert boundary > 2
                assert outcome(saga, run.run_id) == expected
                break
            assert code == -9, f"worker exited {code} at boundary {boundary}"
            last = saga.get(run.run_id).is_finished  # killed right after the final commit
            recover(saga)
            assert outcome(saga, run.run_id) == expected, f"boundary {boundary}"
            check_history(saga, run.run_id)
            calls = [json.loads(line) for line in log.read_text().splitlines()] \
                if log.exists() else []
            # A kill after a commit and before acting never repeats an effect.
            effects = Counter(c["key"] for c in calls if c["tool"] == "effect")
            assert all(n == 1 for n in effects.values()), (boundary, effects)
        if last:
            break
        boundary += 1


def test_a_crash_inside_a_tool_reruns_it_with_the_same_key(settings: Settings,
                                                           registry: Registry,
                                                           tmp_path: Path) -> None:
    settings = replace(settings, lease_seconds=LEASE)
    marker = tmp_path / "killed"
    definition = {"name": "crash-in-tool", "steps": [
        effect("before", 0),
        {"id": "risky", "tool": "effect", "idempotent": True,
         "args": {"value": 1, "kill_once": str(marker)}},
        effect("after", 2)]}
    log = tmp_path / "calls.log"
    with Saga(settings, registry=registry) as saga:
        run = saga.submit(saga.load(definition))
        assert crash_worker(settings, 0, log) == -9  # killed by the tool, mid-step
        assert marker.exists()
        recover(saga)
        final = saga.get(run.run_id)
        assert final.status == "completed"
        # The tool's effect happened in the dead process; it ran again under the same key.
        keys = [c["key"] for c in map(json.loads, log.read_text().splitlines())
                if c["step"] == "risky"]
        # Once in the worker that died right after the effect (its call log), once more
        # in the restarted drive here (this process's record), under the same key.
        assert keys == [f"{run.run_id}:risky:0"]
        assert sum(c["key"] == keys[0] for c in standins.CALLS) == 1
        assert marker.read_text() == f"{run.run_id}:risky:0"
        risky = [e for e in saga.history(run.run_id) if e.get("step_id") == "risky"]
        assert [e["type"] for e in risky] == ["StepStarted", "StepFailed", "StepStarted",
                                             "StepCompleted"]
        assert risky[1]["payload"]["error_type"] == "Interrupted"
        assert {e["payload"]["idempotency_key"] for e in risky if e["type"] == "StepStarted"} \
            == {f"{run.run_id}:risky:0"}
        check_history(saga, run.run_id)


def test_on_interrupt_compensate_undoes_the_interrupted_step_too(sqlite_settings: Settings,
                                                                 registry: Registry,
                                                                 tmp_path: Path) -> None:
    settings = replace(sqlite_settings, lease_seconds=LEASE)
    marker = tmp_path / "killed"
    risky = effect("risky", 1)
    risky["args"]["kill_once"] = str(marker)
    risky["on_interrupt"] = "compensate"
    # An interrupted step has no recorded output: its compensation reads its parameters.
    risky["compensate"]["args"] = {"what": "{{ parameters.value }}"}
    definition = {"name": "undo-interrupted", "steps": [effect("first", 0), risky]}
    with Saga(settings, registry=registry) as saga:
        run = saga.submit(saga.load(definition))
        assert crash_worker(settings, 0, tmp_path / "calls.log") == -9
        recover(saga)
        final = saga.get(run.run_id)
        assert final.status == "compensated"
        undone = [e["step_id"] for e in saga.history(run.run_id)
                  if e["type"] == "StepCompensated"]
        assert undone == ["risky", "first"]
        assert saga.get(run.run_id).steps["risky"]["compensation_output"] == {"undone": 1}


@pytest.mark.doctored  # it records a skip no scheduler decided, to test the fence
def test_a_stale_writer_is_fenced_by_the_version(saga: Saga) -> None:
    plan = saga.load({"name": "fence", "steps": [{"id": "a", "tool": "noop"}]})
    run = saga.submit(plan)
    mine, theirs = saga.get(run.run_id), saga.get(run.run_id)
    mine.skip_step("a", 0, "first writer")
    saga.app.save_run(mine)
    theirs.skip_step("a", 0, "second writer")
    from saga.errors import ConcurrentWriteError

    with pytest.raises(ConcurrentWriteError):
        saga.app.save_run(theirs)
    assert [e["payload"].get("reason") for e in saga.history(run.run_id)][1:] == ["first writer"]


def test_a_run_driven_elsewhere_is_not_driven_twice(saga: Saga) -> None:
    plan = saga.load({"name": "held", "steps": [{"id": "a", "tool": "noop"}]})
    run = saga.submit(plan)
    assert saga.leases.claim(run.run_id, "someone-else", 30)
    from saga.errors import LeaseHeldError

    with pytest.raises(LeaseHeldError, match="someone-else"):
        saga.drive(saga.get(run.run_id), wait=0.2)
    assert saga.worker_loop(poll_interval=0.05).run(until_idle=True) == 0
    assert saga.get(run.run_id).status == "running"


def test_many_workers_drain_hundreds_of_runs_exactly_once(pg_settings: Settings,
                                                          registry: Registry,
                                                          tmp_path: Path) -> None:
    settings = pg_settings
    definition = {"name": "drain", "steps": [{"id": "a", "tool": "effect", "args": {"value": 1}},
                                             {"id": "b", "tool": "effect", "args": {"value": 2}}]}
    with Saga(settings, registry=registry) as saga:
        plan = saga.load(definition)
        ids = [saga.submit(plan).run_id for _ in range(200)]
        env = store_env(settings)
        log = tmp_path / "calls.log"
        env["SAGA_TEST_CALL_LOG"] = str(log)
        workers = [subprocess.Popen(
            [sys.executable, str(CRASH_WORKER), "0", "--concurrency", "8", "--poll", "0.05",
             "--id", f"w{i}", "--lease", "15"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE) for i in range(3)]
        for w in workers:
            assert w.wait(timeout=300) == 0, w.stderr.read() if w.stderr else ""
        statuses = Counter(saga.get(i).status for i in ids)
        assert statuses == {"completed": 200}
        effects = Counter((c["key"]) for c in map(json.loads, log.read_text().splitlines()))
        assert len(effects) == 400 and set(effects.values()) == {1}
        workers_seen = {e["payload"]["worker"] for i in ids[:50] for e in saga.history(i)
                        if e["type"] == "StepStarted"}
        assert workers_seen <= {"w0", "w1", "w2"} and workers_seen
        for run_id in ids[:20]:
            assert saga.verify(run_id) is None
        assert all(saga.get(i).status in TERMINAL for i in ids)


def test_a_waiting_run_survives_restarts_and_a_worker_continues_it(settings: Settings,
                                                                  registry: Registry,
                                                                  tmp_path: Path) -> None:
    settings = replace(settings, lease_seconds=LEASE)
    definition = {"name": "approve-me", "steps": [
        effect("prepare", 1),
        {"id": "deploy", "tool": "effect", "args": {"value": 2}, "confirm": "Deploy now?"}]}
    log = tmp_path / "calls.log"
    with Saga(settings, registry=registry) as saga:
        run = saga.submit(saga.load(definition))
    # A worker process drives it until it waits, then exits: nothing holds the run.
    assert crash_worker(settings, 0, log) == 0
    with Saga(settings, registry=registry) as saga:
        waiting = saga.get(run.run_id)
        assert waiting.status == "waiting" and waiting.pending_approvals == ["deploy"]
        saga.approve(run.run_id, "deploy", actor="carol")
    assert crash_worker(settings, 0, log) == 0  # a fresh worker sees the decision
    with Saga(settings, registry=registry) as saga:
        final = saga.get(run.run_id)
        assert final.status == "completed"
        assert final.approvals["deploy"]["actor"] == "carol"
        check_history(saga, run.run_id)


def test_a_saga_run_killed_after_its_first_append_is_taken_over_when_its_lease_expires(
        pg_settings: Settings, registry: Registry, tmp_path: Path) -> None:
    """On PostgreSQL a new run's lease is claimed by the statement that appends its first
    events. A ``saga run`` killed right after that commit (inside its first step's tool)
    leaves a run whose lease is held by nobody alive: once the lease expires a worker takes
    the run over, records the dead attempt as interrupted and finishes the run, calling the
    tool again under the same idempotency key."""
    settings = replace(pg_settings, lease_seconds=LEASE)
    marker = tmp_path / "killed"
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps({"name": "killed-run", "steps": [
        {"id": "risky", "tool": "effect", "idempotent": True,
         "args": {"value": 1, "kill_once": str(marker)}},
        effect("after", 2, depends_on=["risky"])]}), encoding="utf-8")
    log = tmp_path / "calls.log"
    env = store_env(settings) | {"SAGA_TEST_CALL_LOG": str(log)}
    proc = subprocess.run([sys.executable, "-m", "saga.cli", "run", str(flow), "--id",
                           "KILLED-1", "--tools", "tests.standins.standins"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    with Saga(settings, registry=registry) as saga:
        run = saga.get("KILLED-1")
        assert [e["type"] for e in saga.history("KILLED-1")] == ["RunStarted", "StepStarted"]
        held = saga.leases.holder(str(run.id))
        assert held is not None  # claimed with the first append, by the process now dead
        recover(saga)
        final = saga.get("KILLED-1")
        assert final.status == "completed", final.error
        risky = [e for e in saga.history("KILLED-1") if e.get("step_id") == "risky"]
        assert [e["type"] for e in risky] == ["StepStarted", "StepFailed", "StepStarted",
                                             "StepCompleted"]
        assert risky[1]["payload"]["error_type"] == "Interrupted"
        assert risky[2]["payload"]["worker"] != risky[0]["payload"]["worker"]
        assert marker.read_text() == f"{final.run_id}:risky:0"
        check_history(saga, "KILLED-1")
