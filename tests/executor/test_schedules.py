"""Schedules fired by workers: one run per due time, however many workers fire them."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from datetime import datetime, timedelta

import pytest

from saga import Saga
from saga.config import Settings
from saga.errors import InputError
from saga.schedules import Schedule, _due_times
from tests.executor.test_recovery import ROOT, store_env

FLOW = {"name": "tick", "steps": [{"id": "t", "tool": "echo",
                                   "parameters": {"at": "{{ context.scheduled_at }}"}}]}


def test_three_workers_start_one_run_per_due_time(pg_settings: Settings,
                                                  registry: object) -> None:
    with Saga(pg_settings, registry=registry) as saga:  # type: ignore[arg-type]
        plan = saga.load(FLOW)
        saga.schedules.add("tick", "inline", plan.record(), every="2s")
        env = store_env(pg_settings)
        workers = [subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--poll",
                                     "0.1", "--lease", "5"], cwd=ROOT, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for _ in range(3)]
        try:
            # Workers take a while to start on a busy machine: count from the first firing.
            deadline = time.monotonic() + 60
            while not saga.list_runs(definition="tick") and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(7)
            saga.schedules.remove("tick")
            time.sleep(1)  # a look that read the schedule before it went may still fire
            before = {r["run_id"] for r in saga.list_runs(definition="tick")}
            time.sleep(3)
            after = {r["run_id"] for r in saga.list_runs(definition="tick")}
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(timeout=30)
        assert after == before  # nothing fires after remove
        runs = [saga.get(r) for r in sorted(before)]
        assert 3 <= len(runs) <= 7
        scheduled = [r.context["scheduled_at"] for r in runs]
        assert len(set(scheduled)) == len(runs)  # never two runs for one due time
        assert [r.run_id for r in runs] == [f"tick@{at}" for at in scheduled]
        moments = sorted(datetime.fromisoformat(at) for at in scheduled)
        assert all(b - a == timedelta(seconds=2) for a, b in itertools.pairwise(moments))
        for run in runs:
            saga.worker_loop(poll_interval=0.05).run(until_idle=True)
            done = saga.get(run.run_id)
            assert done.status == "completed"
            assert done.outputs == {"t": {"at": done.context["scheduled_at"]}}


def test_catch_up_skip_fires_the_latest_missed_time_and_all_fires_each() -> None:
    start = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    skip = Schedule("s", "f", {}, every_seconds=60, next_due=start.isoformat())
    every = Schedule("s", "f", {}, every_seconds=60, catch_up="all",
                     next_due=start.isoformat())
    now = start + timedelta(minutes=3, seconds=10)
    assert _due_times(skip, now) == [start + timedelta(minutes=3)]
    assert _due_times(every, now) == [start + timedelta(minutes=m) for m in range(4)]


def test_a_cron_in_a_time_zone() -> None:
    paris = Schedule("s", "f", {}, cron="0 2 * * *", timezone="Europe/Paris")
    after = paris.after(datetime.fromisoformat("2026-07-01T12:00:00+00:00"))
    assert after.isoformat() == "2026-07-02T00:00:00+00:00"  # 02:00 in Paris, summer time


@pytest.mark.parametrize(("cron", "every", "zone"), [
    (None, None, "UTC"), ("*/5 * * * *", "5s", "UTC"), ("not cron", None, "UTC"),
    (None, "soon", "UTC"), ("0 * * * *", None, "Mars/Olympus")])
def test_bad_schedules_are_input_errors(lite: Saga, cron: str | None, every: str | None,
                                        zone: str) -> None:
    with pytest.raises(InputError):
        lite.schedules.add("s", "f", lite.load(FLOW).record(), cron=cron, every=every,
                           timezone=zone)


WORKER_WITHOUT_CRON = """
import sys
from pathlib import Path
from saga import Saga
from saga.config import Settings
with Saga(Settings(home=Path(sys.argv[1]))) as saga:
    plan = saga.load({"name": "one", "steps": [{"id": "a", "tool": "noop"}]})
    saga.schedules.add("often", "inline", plan.record(), every="1h")
    saga.submit(plan, {})
    print(saga.worker_loop(concurrency=1).run(until_idle=True), "croniter" in sys.modules)
    saga.schedules.add("nightly", "inline", plan.record(), cron="0 2 * * *")
    print("croniter" in sys.modules)
"""


def test_a_worker_loads_croniter_only_for_a_cron_schedule(tmp_path: object) -> None:
    """Importing croniter runs the `file` command: a worker's first look paid for it."""
    out = subprocess.run([sys.executable, "-c", WORKER_WITHOUT_CRON, str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "False", "True"]  # the run submitted (the schedule is due in 1h)
