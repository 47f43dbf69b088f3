"""Crash safety of waits: real workers SIGKILLed at every event boundary of runs that
sleep on a durable timer or wait for a signal, and again and again while a schedule
fires; then recovered and compared with runs no kill interrupted.

Each boundary gets a store of its own and a worker process of its own
(tests/standins/crash_worker.py, which imports the engine once and forks them), all at
once: their timers and lease expiries overlap, so a test takes a few seconds however
many boundaries its runs have. The timer and signal cases all run on SQLite, one of each
on PostgreSQL.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.tools import Registry
from tests.conftest import postgres_store
from tests.executor.test_recovery import (
    CRASH_WORKER,
    LEASE,
    ROOT,
    baseline,
    check_history,
    crash_worker,
    effect,
    outcome,
    recover,
    store_env,
)
from tests.standins import standins

Hook = Callable[[Saga, str], None]
BACKENDS = ["sqlite", "postgres"]


@dataclass(frozen=True)
class Case:
    """A run to kill at every boundary: the commits an uninterrupted worker makes (its
    boundaries). ``prepare(saga, run_id)`` runs before its worker starts, ``revive`` after
    the worker ended (killed or not) and before recovery, and ``check`` on the recovered
    run."""

    definition: dict[str, Any]
    commits: int
    prepare: Hook | None = None
    revive: Hook | None = None
    check: Hook | None = None


@dataclass
class Trial:
    """One store with one run of a case, and a worker killed right after its
    ``boundary``-th commit (0: the reference run, never killed)."""

    case: str
    boundary: int
    settings: Settings
    log: Path
    run_id: str = ""


@contextlib.contextmanager
def store_maker(backend: str, tmp_path: Path) -> Iterator[Callable[[], Settings]]:
    """Makes fresh stores of one backend (PostgreSQL schemas are dropped afterwards)."""
    with contextlib.ExitStack() as stack:
        made = itertools.count(1)

        def make() -> Settings:
            if backend == "sqlite":
                return Settings(home=tmp_path / f"store{next(made)}", actor="tester",
                                lease_seconds=LEASE)
            return replace(stack.enter_context(postgres_store()), lease_seconds=LEASE)
        yield make


class CrashWorkers:
    """Starts worker processes in batches, all of a batch at once (forked by one
    crash_worker, which imports the engine once for all of them)."""

    def __init__(self, errors: Path) -> None:
        self.errors = errors
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        with errors.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(CRASH_WORKER), "--fork", "--poll", "0.05", "--lease",
                 str(LEASE)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=err, text=True)

    def run(self, trials: list[Trial], crash_after: int | None = None) -> list[int]:
        """One worker per trial, on its store, killed right after commit ``crash_after``
        (by default its trial's boundary; 0: never); their exit codes once all ended."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        jobs = [{"crash_after": t.boundary if crash_after is None else crash_after,
                 "env": {k: v for k, v in store_env(t.settings).items()
                         if k.startswith("SAGA_")} | {"SAGA_TEST_CALL_LOG": str(t.log)}}
                for t in trials]
        self.proc.stdin.write(json.dumps(jobs) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, self.errors.read_text()[-3000:]
        codes: list[int] = json.loads(answer)
        return codes

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


def settled(saga: Saga, run_id: str) -> dict[str, Any]:
    """outcome(), less the time a sleep ended (it differs from run to run)."""
    result = outcome(saga, run_id)
    if isinstance(result["outputs"], dict):
        result["outputs"] = {k: v for k, v in result["outputs"].items() if k != "nap"}
    return result


def kill_at_every_boundary(backend: str, tmp_path: Path, registry: Registry,
                           cases: dict[str, Case]) -> dict[str, Any]:
    """Run each case once per event boundary, in a store of its own with a worker process
    killed right after that commit, once more with a worker killed one commit later (it
    ends on its own: there were no more boundaries) and once with a worker never killed
    (the reference); then let restarted workers recover every store, and compare each run
    with its case's reference. Returns the references' outcomes by case."""
    with store_maker(backend, tmp_path) as make, \
            contextlib.closing(CrashWorkers(tmp_path / "workers.err")) as workers:
        def begin(name: str, boundary: int) -> Trial:
            t = Trial(name, boundary, make(), tmp_path / f"calls-{name}-{boundary}.log")
            with Saga(t.settings, registry=registry) as saga:
                t.run_id = saga.submit(saga.load(cases[name].definition)).run_id
                if (prepare := cases[name].prepare) is not None:
                    prepare(saga, t.run_id)
            return t

        trials = [begin(name, b) for name, case in cases.items()
                  for b in range(case.commits + 2)]
        for t, code in zip(trials, workers.run(trials), strict=True):
            assert code == (-9 if 0 < t.boundary <= cases[t.case].commits else 0), \
                f"{t.case}: the worker killed after commit {t.boundary} exited {code}"
        # Every worker ended, so every lease its run had expires within one lease length.
        time.sleep(LEASE + 0.05)
        for t in trials:
            if (revive := cases[t.case].revive) is not None:
                with Saga(t.settings, registry=registry) as saga:
                    revive(saga, t.run_id)
        assert set(workers.run(trials, 0)) == {0}  # restarted workers drain every store
        expected: dict[str, Any] = {}
        for t in trials:
            with Saga(t.settings, registry=registry) as saga:
                got = settled(saga, t.run_id)
                assert got == expected.setdefault(t.case, got), (t.case, t.boundary)
                check_history(saga, t.run_id)
                calls = [json.loads(line) for line in t.log.read_text().splitlines()] \
                    if t.log.exists() else []
                calls += [c for c in standins.CALLS if c["key"].startswith(t.run_id)]
                # A kill after a commit and before acting never repeats an effect.
                effects = Counter(c["key"] for c in calls if c["tool"] == "effect")
                assert set(effects.values()) == {1}, (t.case, t.boundary, effects)
                if (check := cases[t.case].check) is not None:
                    check(saga, t.run_id)
        return expected


# -- durable timers -----------------------------------------------------------------------

def check_timer(saga: Saga, run_id: str) -> None:
    """The timer was started once, and neither it nor the step after it ended before it
    was due."""
    events = saga.history(run_id)
    nap = [e for e in events if e.get("step_id") == "nap"]
    assert [e["type"] for e in nap] == ["StepStarted", "StepWaiting", "StepCompleted"]
    until = nap[1]["payload"]["until"]
    assert datetime.fromisoformat(nap[2]["timestamp"]) >= datetime.fromisoformat(until)
    assert nap[2]["payload"]["output"] == {"slept_until": until}
    after = [e for e in events if e["type"] == "StepStarted" and e["step_id"] == "b"]
    assert after and all(datetime.fromisoformat(e["timestamp"])
                         >= datetime.fromisoformat(until) for e in after)


NAP = {"id": "nap", "sleep": 1}
# Commits: a started; a completed and the timer recorded (the worker waits it out in
# process: it is no longer than a worker's hold); the timer done and b started; ...
TIMERS = {
    "timer_success": Case({"name": "nap-ok", "steps": [effect("a", 1), NAP, effect("b", 2)]},
                          commits=4, check=check_timer),
    "timer_compensate": Case({"name": "nap-undo", "steps": [
        effect("a", 1), NAP, effect("b", 2), effect("c", 3, fail=True)]}, commits=7,
        check=check_timer),
}


@pytest.mark.parametrize(("backend", "names"), [
    ("sqlite", ["timer_success", "timer_compensate"]), ("postgres", ["timer_success"])])
def test_sigkill_around_a_durable_timer_neither_skips_nor_restarts_it(
        backend: str, names: list[str], registry: Registry, tmp_path: Path) -> None:
    expected = kill_at_every_boundary(backend, tmp_path, registry,
                                      {n: TIMERS[n] for n in names})
    for name in names:  # the reference is what the run does in the foreground, too
        foreground = baseline(tmp_path / name, registry, TIMERS[name].definition)
        foreground["outputs"].pop("nap")
        assert expected[name] == foreground


def test_a_timer_pending_when_its_worker_died_is_continued_when_due_not_before(
        settings: Settings, registry: Registry, tmp_path: Path) -> None:
    """A timer longer than a worker holds a run, its worker killed right after recording
    it: restarted workers that look before it is due leave it waiting (and hold no run),
    one that looks when it is due ends it."""
    settings = replace(settings, lease_seconds=LEASE)
    definition = {"name": "long-nap", "steps": [
        effect("a", 1), {"id": "nap", "sleep": 2.5}, effect("b", 2)]}
    with Saga(settings, registry=registry) as saga:
        run = saga.submit(saga.load(definition))
        assert crash_worker(settings, 2, tmp_path / "calls.log") == -9
        until = datetime.fromisoformat(saga.get(run.run_id).waits["nap"]["until"])
        early = 0
        for _ in range(100):
            recover(saga)  # a restarted worker: it returns once nothing is runnable now
            looked = datetime.now(UTC)
            if saga.get(run.run_id).is_finished:
                break
            early += looked < until
            assert saga.get(run.run_id).steps["nap"]["status"] == "running"
            time.sleep(0.1)
        if not early:
            pytest.skip("this machine was too slow to look before the timer was due")
        assert saga.get(run.run_id).status == "completed"
        check_timer(saga, run.run_id)
        check_history(saga, run.run_id)


# -- signals ------------------------------------------------------------------------------

DATA = {"amount": 42}
SIGNAL = {"name": "go-signal", "outputs": {"paid": "{{ b.value }}", "got": "{{ go }}"},
          "steps": [
    effect("a", 1),
    {"id": "go", "signal": "go", "timeout": 30},
    {"id": "b", "tool": "effect", "args": {"value": "{{ go.amount }}"},
     "compensate": {"tool": "undo", "args": {"what": "{{ output.step }}"}}},
    # A second wait for the same name: one signal is taken once, so this one times out.
    {"id": "again", "signal": "go", "timeout": 0.3, "on_error": "continue"}]}


def send(saga: Saga, run_id: str) -> None:
    saga.signal(run_id, "go", DATA, actor="ops")


def wait_then_send(saga: Saga, run_id: str) -> None:
    """A worker leaves the run waiting for the signal (until its timeout, later than a
    worker holds a run); then it is sent."""
    saga.worker_loop(lease_seconds=LEASE, poll_interval=0.05).run(until_idle=True)
    assert saga.get(run_id).waits["go"]["signal"] == "go"
    send(saga, run_id)


def check_signal(saga: Saga, run_id: str) -> None:
    """One signal, taken once, by the first step waiting for it, as its output."""
    events = saga.history(run_id)
    assert [e["payload"]["data"] for e in events if e["type"] == "SignalReceived"] == [DATA]
    go = [e for e in events if e.get("step_id") == "go"]
    assert [e["type"] for e in go] == ["StepStarted", "StepWaiting", "StepCompleted"]
    assert go[2]["payload"]["output"] == DATA
    run = saga.get(run_id)
    assert run.outputs == {"paid": 42, "got": DATA}
    assert run.steps["again"]["error"]["type"] == "SignalTimeout"


SIGNALS = {
    # The worker dies before or while the run waits (a started; a completed and the wait
    # recorded: then the worker leaves the run), and the signal is sent while none runs.
    "while_dead": Case(SIGNAL, 2, revive=send, check=check_signal),
    # Sent right after submit, before any step ran: a started; a completed, the wait
    # recorded and ended by the signal, b started; b completed and `again` waits; that
    # wait times out and the run completes.
    "before_the_wait": Case(SIGNAL, 4, prepare=send, check=check_signal),
    # A worker left the run waiting and the signal was sent; the worker that takes it up
    # is killed at every boundary from there on.
    "to_the_waiting_run": Case(SIGNAL, 3, prepare=wait_then_send, check=check_signal),
}


@pytest.mark.parametrize(("backend", "names"), [("sqlite", list(SIGNALS)),
                                               ("postgres", ["while_dead"])])
def test_sigkill_around_a_signal_wait_delivers_the_signal_once(
        backend: str, names: list[str], registry: Registry, tmp_path: Path) -> None:
    expected = kill_at_every_boundary(backend, tmp_path, registry,
                                      {n: SIGNALS[n] for n in names})
    assert {e["status"] for e in expected.values()} == {"completed"}


def test_a_signal_sent_in_time_while_the_worker_is_dead_is_taken_after_the_timeout(
        settings: Settings, registry: Registry, tmp_path: Path) -> None:
    """Regression: the worker died waiting out a short signal timeout, the signal was
    sent before the timeout, and the restarted worker (after the dead one's lease) came
    after it: it recorded SignalTimeout, and the run was undone, as if the signal were
    late."""
    settings = replace(settings, lease_seconds=LEASE)
    flow = {"name": "short-wait", "steps": [
        effect("a", 1), {"id": "go", "signal": "go", "timeout": 0.6}, effect("b", 2)]}
    with Saga(settings, registry=registry) as saga:
        run = saga.submit(saga.load(flow))
        assert crash_worker(settings, 2, tmp_path / "calls.log") == -9  # waiting it out
        send(saga, run.run_id)
        recover(saga)
        events = saga.history(run.run_id)
        until = datetime.fromisoformat(saga.get(run.run_id).steps["go"]["wait"]["until"])
        [received] = [e for e in events if e["type"] == "SignalReceived"]
        [taken] = [e for e in events if e.get("step_id") == "go" and e["type"] in (
            "StepCompleted", "StepFailed")]
        if not datetime.fromisoformat(received["timestamp"]) < until \
                < datetime.fromisoformat(taken["timestamp"]):
            pytest.skip("the signal came late, or the restarted worker early")
        assert (taken["type"], taken["payload"].get("output")) == ("StepCompleted", DATA)
        assert saga.get(run.run_id).status == "completed"
        check_history(saga, run.run_id)


# -- schedules ----------------------------------------------------------------------------

TICK = {"name": "tick", "steps": [
    {"id": "t", "tool": "effect", "args": {"value": "{{ context.scheduled_at }}"}},
    effect("u", 2)]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_schedule_firing_under_repeated_sigkills_starts_one_run_per_due_time(
        backend: str, registry: Registry, tmp_path: Path) -> None:
    """Two worker slots fire an every-0.5s schedule (catch_up: all, so every due time gets
    a run) for 4 s; each worker dies right after the 1st or 2nd run it fired (before it
    moved the schedule on, or started the next due time it was firing), with what it was
    driving then, and is replaced at once; at the end the survivors are killed too.

    Only firing commits count: killed at any commit, a run can lose three workers in a row
    and be quarantined, as it should be (test_recovery covers kills during drives)."""
    rng = random.Random(7)
    kills = [rng.choice([1, 1, 2]) for _ in range(200)]
    kill_log = tmp_path / "kills.log"
    with store_maker(backend, tmp_path) as make, Saga(make(), registry=registry) as saga:
        saga.schedules.add("tick", "inline", saga.load(TICK).record(), every="0.5s",
                           catch_up="all")
        env = store_env(saga.settings) | {"SAGA_TEST_KILL_LOG": str(kill_log),
                                          "SAGA_TEST_COUNT_ONLY": "RunStarted",
                                          "SAGA_TEST_CALL_LOG": str(tmp_path / "calls.log")}
        proc = subprocess.run([sys.executable, str(CRASH_WORKER), "--chaos", "4", "2",
                               ",".join(map(str, kills)), "--poll", "0.05", "--lease",
                               str(LEASE)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        codes = json.loads(proc.stdout.splitlines()[-1])
        assert set(codes) == {-9}  # every worker was killed, none failed
        saga.schedules.remove("tick")
        recover(saga)

        runs = [saga.get(run_id) for _, run_id in saga.app.run_ids()]
        due = sorted(datetime.fromisoformat(r.context["scheduled_at"]) for r in runs)
        assert len(runs) >= 3
        # One run per due time, and (catch_up: all) one for every time from the first on.
        assert due == [due[0] + timedelta(seconds=i / 2) for i in range(len(runs))]
        assert sorted(r.run_id for r in runs) == sorted(
            f"tick@{r.context['scheduled_at']}" for r in runs)
        for run in runs:  # every run started completes after recovery, each step once
            if run.status != "completed":
                Path("/tmp/fail.json").write_text(json.dumps(saga.history(run.run_id), indent=1))
            assert run.status == "completed", (run.run_id, run.status)
            assert run.outputs["t"] == {"step": "t", "value": run.context["scheduled_at"]}
            assert [e["type"] for e in saga.history(run.run_id)].count("RunStarted") == 1
            check_history(saga, run.run_id)
        died = [json.loads(line) for line in kill_log.read_text().splitlines()]
        assert {tuple(k["events"]) for k in died} == {("RunStarted",)}
        assert len(died) >= 2  # right after firing a due time (the others: at the end)
        print(f"\n{backend}: {len(codes)} workers killed, {len(died)} right after firing, "
              f"{len(runs)} runs, {sum(r.takeovers for r in runs)} takeovers")
