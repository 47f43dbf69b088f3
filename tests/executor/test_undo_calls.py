"""Undo calls a worker's death (or a stop past its lease) cuts short: each compensation
call's start is recorded (``StepCompensationStarted``) before it is made, so the worker
that takes the run over knows the undo was in flight and runs it again knowingly, under
the same key (issue 38, conformance: SQLite salt 153883); and a step cut short before it
recorded the output its compensation reads is named not undone, with the reason, while
the other undos go on (issue 38, conformance: PostgreSQL salt 396030)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from saga import Saga, scheduler
from saga.config import Settings
from saga.scheduler.policy import UNSAID
from saga.tools import Registry
from tests.executor.test_churn import TOOLS, entries, stop, wait_for, worker
from tests.executor.test_recovery import LEASE, ROOT, crash_worker, effect, recover, store_env
from tests.standins import standins


def lapsed(saga: Saga, run_id: str) -> None:
    """Wait until no live worker holds the run's lease (a dead one's has expired)."""
    wait_for(lambda: (h := saga.leases.holder(run_id)) is None or h[1] < time.time(), 10,
             "the dead worker's lease to lapse")


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """A saga command in a new process, on the settings' store."""
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT,
                          env=store_env(settings), capture_output=True, text=True, timeout=60)


def test_a_cut_short_undo_runs_again_knowingly_and_an_unsayable_one_is_named(
        settings: Settings, registry: Registry, tmp_path: Path) -> None:
    """Three processes: a worker dies inside ``risky`` (no output recorded); a second
    takes the run over, ``risky`` is interrupted (``on_interrupt: compensate``) and its
    compensation reads ``{{ output.step }}``: it is recorded not undone, with the reason,
    and the rollback goes on to ``first``, whose undo kills that worker mid-call; this
    process takes over, records the undo as interrupted (``RunTakenOver`` after its
    ``StepCompensationStarted``) and calls it again, attempt 2, with the same key. The
    run ends compensated; ``saga status`` and ``saga replay --verify`` in new processes
    say so."""
    settings = replace(settings, lease_seconds=LEASE)
    first = effect("first", 0)
    first["compensate"]["args"]["kill_once"] = str(tmp_path / "undo-killed")
    risky = effect("risky", 1)
    risky["args"]["kill_once"] = str(tmp_path / "step-killed")
    risky["on_interrupt"] = "compensate"
    log = tmp_path / "calls.log"
    with Saga(settings, registry=registry) as saga:
        run = saga.submit(saga.load({"name": "undo-calls", "steps": [first, risky]}))
        rid = run.run_id
        assert crash_worker(settings, 0, log) == -9  # died inside risky
        lapsed(saga, rid)
        assert crash_worker(settings, 0, log) == -9  # died inside first's undo
        standins.CALLS.clear()
        recover(saga)
        final = saga.get(rid)
        assert final.status == "compensated", final.error
        history = saga.history(rid)
        kinds = [e["type"] for e in history]
        not_undone = [e for e in history if e["type"] == "StepNotUndone"]
        assert [e["step_id"] for e in not_undone] == ["risky"]
        assert not_undone[0]["payload"]["reason"].startswith(UNSAID)
        assert "CompensationFailed" not in kinds
        starts = [e for e in history if e["type"] == "StepCompensationStarted"]
        assert [(e["step_id"], e["payload"]["attempt"]) for e in starts] == \
            [("first", 1), ("first", 2)]
        key = f"{rid}:first:0:compensate"
        assert {e["payload"]["idempotency_key"] for e in starts} == {key}
        # the second start follows a takeover that found the first in flight
        between = kinds[history.index(starts[0]) + 1:history.index(starts[1])]
        assert between == ["RunTakenOver"]
        assert [e["step_id"] for e in history if e["type"] == "StepCompensated"] == ["first"]
        # the undo ran twice, knowingly: attempt 1 in the worker it killed, 2 here
        dead = [(c["key"], c["attempt"]) for c in map(json.loads, log.read_text().splitlines())
                if c["tool"] == "undo"]
        here = [(c["key"], c["attempt"]) for c in standins.CALLS if c["tool"] == "undo"]
        assert (dead, here) == ([(key, 1)], [(key, 2)])
        status = cli(settings, "status", rid, "--json")
        assert status.returncode == 0, status.stderr
        summary = json.loads(status.stdout)
        assert summary["not_undone"] == ["risky"]
        assert summary["steps"]["risky"]["not_undone"].startswith(UNSAID)
        shown = cli(settings, "status", rid)
        assert "interrupted before its output was recorded" in " ".join(shown.stdout.split())
        replayed = cli(settings, "replay", rid, "--verify")
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr


def test_a_stopped_workers_late_undo_is_fenced_and_the_taker_runs_it_again(
        settings: Settings, tmp_path: Path) -> None:
    """A real worker SIGSTOPped in the middle of a (slow) undo, past its lease; a second
    worker takes the run over, records the undo interrupted and runs it again (attempt 2,
    the same key). When the first is continued its undo returns, and its result is
    fenced: one ``StepCompensated``, the run compensated once, replay verifies."""
    log = tmp_path / "calls.jsonl"
    with Saga(replace(settings, lease_seconds=LEASE), tools=[TOOLS]) as saga:
        rid = saga.submit(saga.load({"name": "zombie-undo", "steps": [
            {"id": "a", "tool": "work", "args": {"seconds": 0},
             "compensate": {"tool": "unwork", "args": {"seconds": 2.5}}},
            {"id": "b", "tool": "refuse"}]})).run_id
        zombie = worker(settings, log)
        procs = [zombie]
        try:
            wait_for(lambda: any(c["kind"] == "undo" for c in entries(log)), 30,
                     "the undo to start")
            zombie.send_signal(signal.SIGSTOP)
            lapsed(saga, rid)
            procs.append(worker(settings, log))
            wait_for(lambda: saga.get(rid).is_finished, 30, "the taker to finish the run")
            zombie.send_signal(signal.SIGCONT)
            wait_for(lambda: sum(c["kind"] == "undone" for c in entries(log)) == 2, 30,
                     "the stopped worker's undo to return")
            time.sleep(0.5)  # room for a late append it must not make
        finally:
            if zombie.poll() is None:
                zombie.send_signal(signal.SIGCONT)
            stop(procs)
        history = saga.history(rid)
        assert saga.get(rid).status == "compensated"
        assert [e["type"] for e in history].count("StepCompensated") == 1
        assert history[-1]["type"] == "RunCompensated"
        undos = sorted((c["pid"], c["attempt"], c["key"]) for c in entries(log)
                       if c["kind"] == "undo")
        assert [(a, k) for _, a, k in sorted(undos, key=lambda u: u[1])] == \
            [(1, f"{rid}:a:0:compensate"), (2, f"{rid}:a:0:compensate")]
        assert {p for p, _, _ in undos} == {procs[0].pid, procs[1].pid}
        starts = [e["payload"]["attempt"] for e in history
                  if e["type"] == "StepCompensationStarted"]
        assert starts == [1, 2]
        assert saga.verify(rid) is None


def test_a_run_recorded_before_undo_calls_were_recorded_still_replays(lite: Saga) -> None:
    """A history an older saga recorded, with neither ``StepCompensationStarted`` nor
    ``StepNotUndone``: an interrupted step's undo that needed its output recorded as a
    failed compensation (``ExpressionError``), the other undone with no recorded start.
    The current scheduler still reproduces every decision of it."""
    plan = lite.load({"name": "old-undo", "steps": [
        effect("first", 0),
        {**effect("risky", 1), "on_interrupt": "compensate"}]})
    rid = lite.submit(plan).run_id
    run = lite.get(rid)

    def decided(*, skip: type | None = None) -> None:
        for action in scheduler.decide(plan, run):
            if skip is None or not isinstance(action, skip):
                action.record(run, "old-worker")  # type: ignore[union-attr]

    decided()  # first starts
    run.complete_step("first", 0, 1, {"step": "first", "value": 0}, 3)
    decided()  # risky starts; its worker dies
    run.take_over("new-worker")
    for failure in scheduler.interrupted(plan, run):
        failure.record(run, "new-worker")
    decided()  # the rollback: risky (it may have acted), then first
    run.compensation_failed("risky", 0, "ExpressionError",
                            "'None' has no attribute 'step' in template '{{ output.step }}'")
    run.compensated("first", 0, {"undone": "first"})
    decided()  # the run ends failed, naming risky's failed compensation
    assert run.status == "failed"
    lite.app.save_run(run)
    assert lite.verify(rid) is None
