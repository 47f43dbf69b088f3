"""Resource limits (saga.toml ``[resources.NAME]``) across real ``saga worker`` processes,
on SQLite and PostgreSQL: at most N calls at once on every worker together, a killed
worker's slot back at once (its liveness lock gone, not after its lease), a rate's starts
per second, and a waiting step shown (``saga status``, the metrics) by other processes
while it holds no worker."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from saga import Saga
from saga.config import Settings, parse_resources
from saga.server.app import create_app
from saga.tools import Registry, load_registry

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "tests.standins.spans"


@pytest.fixture
def spans_registry() -> Registry:
    return load_registry([TOOLS])


class Fleet:
    """Worker processes on one store with one saga.toml, killed by their pids after."""

    def __init__(self, settings: Settings, tmp_path: Path, toml: str,
                 lease: float = 10.0) -> None:
        self.config = tmp_path / "saga.toml"
        self.config.write_text(toml)
        self.tmp = tmp_path
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        env |= {"SAGA_CONFIG": str(self.config), "SAGA_LEASE_SECONDS": str(lease),
                "SAGA_TOOLS": TOOLS, "PYTHONPATH": str(ROOT)}
        if settings.is_postgres:
            env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                    "SAGA_DATABASE_SCHEMA": settings.schema or ""}
        else:
            env |= {"SAGA_HOME": str(settings.home)}
        self.env = env
        self.procs: list[subprocess.Popen[bytes]] = []

    def worker(self, name: str, *extra: str) -> subprocess.Popen[bytes]:
        err = (self.tmp / f"{name}.err").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--poll", "0.1",
                                 "--id", name, *extra], cwd=ROOT, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=err)
        self.procs.append(proc)
        return proc

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=120)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(toml: str, lease: float = 10.0) -> Fleet:
        made.append(Fleet(settings, tmp_path, toml, lease))
        return made[-1]

    yield make
    for f in made:
        f.stop()


def one_call(log: Path, seconds: float, resource: str | None = "db",
             **step: Any) -> dict[str, Any]:
    return {"name": "call", "steps": [{"id": "s", "tool": "spanned", **step,
                                      "args": {"log": str(log), "seconds": seconds},
                                      **({"resource": resource} if resource else {})}]}


def spans(log: Path) -> dict[str, dict[str, float]]:
    """Each call's start and end (wall clock), by RUN:STEP:ATTEMPT."""
    found: dict[str, dict[str, float]] = {}
    for line in log.read_text().splitlines() if log.exists() else []:
        entry = json.loads(line)
        found.setdefault(entry["key"], {}).update(
            {k: v for k, v in entry.items() if k in ("start", "end")})
    return found


def most_at_once(calls: dict[str, dict[str, float]], until: float = float("inf")) -> int:
    """The most calls in flight at one time (a call that never ended runs ``until``)."""
    points = sorted([(c["start"], 1) for c in calls.values()]
                    + [(c.get("end", until), -1) for c in calls.values()],
                    key=lambda p: (p[0], p[1]))  # an end before a start at the same time
    now = most = 0
    for _, step in points:
        now += step
        most = max(most, now)
    return most


def wait_until(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_concurrency_two_and_a_rate_under_three_workers(
        settings: Settings, spans_registry: Registry, fleet: Callable[..., Fleet],
        tmp_path: Path) -> None:
    log, rated = tmp_path / "spans.log", tmp_path / "rated.log"
    f = fleet('[resources.db]\nconcurrency = 2\n\n[resources.api]\nrate = "2/s"\n')
    with Saga(settings, registry=spans_registry) as s:
        ids = [s.submit(s.load(one_call(log, 1.0))).run_id for _ in range(6)]
        ids += [s.submit(s.load(one_call(rated, 0.05, resource="api"))).run_id
                for _ in range(6)]
        s.leases  # noqa: B018 - the side tables exist before the workers start
        for i in range(3):
            f.worker(f"w{i}")
        wait_until(lambda: all(s.get(r).is_finished for r in ids), 120, "the runs")
        assert {s.get(r).status for r in ids} == {"completed"}
        calls = spans(log)
        assert len(calls) == 6
        assert most_at_once(calls) == 2  # never three; and two did run together
        waited = [r for r in ids if any(e["type"] == "StepWaitingForResource"
                                        for e in s.history(r))]
        assert waited  # six one-second calls through two slots: some waited
        for r in ids:
            assert s.verify(r) is None
        # A bucket of 2 refilled at 2/s: 6 starts take 2 s at least (unlimited, they
        # would all start at once), and in any one second at most 2 + 2 start.
        starts = sorted(c["start"] for c in spans(rated).values())
        assert len(starts) == 6
        assert starts[-1] - starts[0] >= 2.0 * 0.9
        assert max(sum(1 for t in starts if first <= t < first + 1.0)
                   for first in starts) <= 4
    audit = f.cli("audit", "verify", "--all")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    replayed = f.cli("replay", waited[0], "--verify")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr


def test_a_waiting_step_is_shown_holds_no_worker_and_starts_when_its_slot_frees(
        settings: Settings, spans_registry: Registry, fleet: Callable[..., Fleet],
        tmp_path: Path) -> None:
    log = tmp_path / "spans.log"
    f = fleet("[resources.db]\nconcurrency = 1\n")
    limited = dataclasses.replace(settings, resources=parse_resources(
        {"db": {"concurrency": 1}}))
    with Saga(limited, registry=spans_registry) as s:
        # Another process's call holds the one slot, for a minute.
        assert s.resources.acquire(["db"], "other:x:1", "other", "x", "elsewhere", 60, 60
                                   ).granted
        waiting = s.submit(s.load(one_call(log, 0.1))).run_id
        free = s.submit(s.load(one_call(log, 0.1, resource=None))).run_id
        worker = f.worker("w0", "--metrics-port", "0", "--concurrency", "1")
        wait_until(lambda: any(e["type"] == "StepWaitingForResource"
                               for e in s.history(waiting)), 60, "the wait")
        # One drive at a time, and the waiting run holds it not: the other run completes.
        wait_until(lambda: s.get(free).status == "completed", 60, "the unlimited run")
        status = f.cli("status", waiting)
        assert "waiting: resource db (step s, since" in status.stdout, status.stdout
        shown = json.loads(f.cli("status", waiting, "--json").stdout)
        assert shown["status"] == "running"
        assert [(w["step"], w["resources"]) for w in shown["waiting_for_resources"]] == [
            ("s", ["db"])]
        port = re.search(r"metrics on http://[\d.]+:(\d+)/metrics",
                         (tmp_path / "w0.err").read_text())
        assert port is not None
        page = urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/metrics",
                                      timeout=10).read().decode()
        assert 'saga_resource_slots_in_use{resource="db"} 1.0' in page
        assert 'saga_resource_waiters{resource="db"} 1.0' in page
        assert 'saga_resource_limit{resource="db"} 1.0' in page
        assert spans(log).keys() == {f"{free}:s:1"}  # the waiting step never started
        listed = json.loads(f.cli("resources", "--json").stdout)  # the operator's view
        assert [(r["resource"], r["in_use"], r["waiting"]) for r in listed] == [("db", 1, 1)]
        assert [h["worker"] for h in listed[0]["holders"]] == ["elsewhere"]
        assert [(w["run_id"], w["step"]) for w in listed[0]["waiters"]] == [(waiting, "s")]
        with TestClient(create_app(limited, worker=False), base_url="http://127.0.0.1") as c:
            assert c.get("/api/v1/resources").json() == [
                {"resource": "db", "concurrency": 1, "rate": None, "burst": None,
                 "in_use": 1, "waiting": 1}]
        s.resources.release(["other:x:1"])
        wait_until(lambda: s.get(waiting).status == "completed", 60, "the waiting run")
        assert worker.poll() is None
        assert s.verify(waiting) is None
        assert "waiting_for_resources" not in s.status(waiting)


def test_a_killed_workers_slot_comes_back_at_once_not_after_its_lease(
        settings: Settings, spans_registry: Registry, fleet: Callable[..., Fleet],
        tmp_path: Path) -> None:
    """A worker SIGKILLed mid-call: its liveness lock goes with it, so its slot is free
    at once (a 30 s lease would hold it ~30 s), and the step taken over gets a slot."""
    log = tmp_path / "spans.log"
    f = fleet("[resources.db]\nconcurrency = 1\n", lease=30.0)
    limited = dataclasses.replace(settings, resources=parse_resources(
        {"db": {"concurrency": 1}}))
    with Saga(limited, registry=spans_registry) as s:
        long = s.submit(s.load(one_call(log, 3.0))).run_id
        s.leases  # noqa: B018
        doomed = f.worker("doomed")
        wait_until(lambda: bool(spans(log)), 60, "the long call")
        short = [s.submit(s.load(one_call(log, 0.2))).run_id for _ in range(2)]
        held = s.resources.holders("db")
        assert [h["worker"] for h in held] == ["doomed"]
        assert held[0]["expires_at"] - time.time() > 20  # the lease would hold it long
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        killed_at = time.time()
        f.worker("heir")
        wait_until(lambda: all(s.get(r).status == "completed" for r in short), 90,
                   "the runs after the kill")
        # From the log: each run's first StepStarted after the kill came well before the
        # dead call's slot would have expired (the taken-over run's retry included).
        wait_until(lambda: s.get(long).is_finished, 60, "the taken-over run")
        assert s.get(long).status == "completed"
        since_kill = {}
        for r in [long, *short]:
            started = [datetime.fromisoformat(e["timestamp"]).timestamp()
                       for e in s.history(r) if e["type"] == "StepStarted"]
            since_kill[r] = max(started) - killed_at
        # The first call after the kill started well inside the 30 s the slot would have
        # been held, the others one after another (0.2 s and 3 s calls) right after it.
        lapse = held[0]["expires_at"] - killed_at
        assert min(since_kill.values()) < 10.0, (since_kill, lapse)
        assert max(since_kill.values()) < 10.0 + 3.0 + 2 * 0.2, (since_kill, lapse)
        calls = spans(log)
        assert f"{long}:s:2" in calls  # the interrupted call was tried again
        assert all(c["start"] - killed_at < 14.0 for k, c in calls.items()
                   if k != f"{long}:s:1")
        # Never two calls at once after the kill: one slot, the dead call's given up.
        assert most_at_once({k: c for k, c in calls.items() if k != f"{long}:s:1"}) == 1
        for r in [long, *short]:
            assert s.verify(r) is None
