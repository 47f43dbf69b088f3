"""Queues and priorities: runs are claimed by priority, then age; a queue's concurrency
and rate limits hold across every worker together; both are recorded in RunStarted."""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import QueueLimit, Settings, load_settings, parse_queues
from saga.domain import run_uuid
from saga.errors import ConfigError, InputError
from saga.store import Database, Leases
from saga.tools import Registry, Tool

ROOT = Path(__file__).resolve().parents[2]
Make = Callable[..., Saga]


@pytest.fixture
def queued(settings: Settings, registry: Registry) -> Iterator[Make]:
    """Sagas on one store (SQLite and PostgreSQL) with the given queue limits; every run
    they recorded replays to the same decisions afterwards."""
    made: list[Saga] = []

    def make(**queues: QueueLimit) -> Saga:
        s = Saga(dataclasses.replace(settings, queues=queues), registry=registry)
        made.append(s)
        return s

    yield make
    for _, run_id in made[0].app.run_ids() if made else []:
        assert made[0].verify(run_id) is None
    for s in made:
        s.close()


class Overlap:
    """A tool that records how many of its calls run at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.calls = 0

    def __call__(self, params: dict[str, Any], ctx: Any) -> dict[str, Any]:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
        time.sleep(self.seconds)
        with self.lock:
            self.now -= 1
        return {"run": ctx.run_id}


def one_step(name: str, queue: str | None = None, tool: str = "echo") -> dict[str, Any]:
    definition: dict[str, Any] = {"name": name, "steps": [{"id": "s", "tool": tool,
                                                          "args": {"x": 1}}]}
    if queue is not None:
        definition["queue"] = queue
    return definition


def first_started(s: Saga, run_id: str) -> datetime:
    return min(datetime.fromisoformat(e["timestamp"]) for e in s.history(run_id)
               if e["type"] == "StepStarted")


def step_spans(s: Saga, run_id: str) -> tuple[datetime, datetime]:
    """From the run's first StepStarted to its last StepCompleted (inside its lease)."""
    events = s.history(run_id)
    return (min(datetime.fromisoformat(e["timestamp"]) for e in events
                if e["type"] == "StepStarted"),
            max(datetime.fromisoformat(e["timestamp"]) for e in events
                if e["type"] == "StepCompleted"))


# -- recorded ----------------------------------------------------------------------------


def test_queue_and_priority_are_recorded_in_run_started(queued: Make) -> None:
    s = queued()
    plan = s.load(one_step("q", queue="reports"))
    from_file = s.submit(plan)
    chosen = s.submit(plan, queue="urgent", priority=7)
    plain = s.submit(s.load(one_step("p")))
    by_options = s.submit(s.load(one_step("p")), options={"queue": "batch", "priority": -2})
    started = {r.run_id: s.history(r.run_id)[0] for r in (from_file, chosen, plain, by_options)}
    assert {k: (e["type"], e["payload"]["options"]) for k, e in started.items()} == {
        from_file.run_id: ("RunStarted", {"queue": "reports", "priority": 0}),
        chosen.run_id: ("RunStarted", {"queue": "urgent", "priority": 7}),
        plain.run_id: ("RunStarted", {"queue": "default", "priority": 0}),
        by_options.run_id: ("RunStarted", {"queue": "batch", "priority": -2}),
    }
    assert (s.get(chosen.run_id).queue, s.get(chosen.run_id).priority) == ("urgent", 7)
    assert {k: s.status(k)["queue"] for k in started} == {
        from_file.run_id: "reports", chosen.run_id: "urgent", plain.run_id: "default",
        by_options.run_id: "batch"}
    with pytest.raises(InputError, match="queue name"):
        s.submit(plan, queue="no spaces")
    with pytest.raises(InputError, match="--priority"):
        s.submit(plan, priority="high")  # type: ignore[arg-type]


def test_a_foreground_run_records_its_queue_and_counts_in_it(queued: Make) -> None:
    s = queued(reports=QueueLimit(concurrency=1))
    seen: list[int] = []

    def count(*_: Any) -> None:
        seen.extend(r["n"] for r in s.leases.db.query(
            "SELECT COUNT(*) AS n FROM saga_leases WHERE queue = ?", ("reports",)))

    run = s.run(s.load(one_step("fg")), queue="reports", priority=3, on_events=count)
    assert run.status == "completed"
    assert s.history(run.run_id)[0]["payload"]["options"] == {"queue": "reports",
                                                              "priority": 3}
    # Its lease was held in the queue while it ran; on PostgreSQL the append that ended
    # the run gave it up (a hook sees each append once it is made).
    assert seen[:-1] and set(seen[:-1]) == {1}
    assert seen[-1] == (0 if s.app.claims_with_append() else 1)


# -- claiming order ----------------------------------------------------------------------


def test_workers_claim_by_priority_then_age(queued: Make) -> None:
    s = queued(line=QueueLimit(concurrency=1))  # one at a time: claims show as starts
    plan = s.load(one_step("ordered", queue="line"))
    runs = {name: s.submit(plan, run_id=name, priority=p).run_id
            for name, p in [("a0", 0), ("b5", 5), ("c0", 0), ("d5", 5), ("e-1", -1),
                            ("f9", 9)]}
    index = s.worker_loop().index
    index.refresh()
    assert index.runnable() == [str(run_uuid(r)) for r in ["f9", "b5", "d5", "a0", "c0",
                                                           "e-1"]]
    assert s.worker_loop(poll_interval=0.02, concurrency=4).run(until_idle=True) == 6
    order = sorted(runs, key=lambda r: first_started(s, r))
    assert order == ["f9", "b5", "d5", "a0", "c0", "e-1"]
    assert {s.get(r).status for r in runs} == {"completed"}


def test_a_full_queue_does_not_hold_back_other_queues(queued: Make) -> None:
    s = queued(narrow=QueueLimit(concurrency=1))
    first = s.submit(s.load(one_step("n", queue="narrow")), priority=10)
    other = s.submit(s.load(one_step("w")))
    s.leases.claim("elsewhere", "another-worker", 60, "narrow")  # fills the queue
    assert s.worker_loop(poll_interval=0.02).run(until_idle=True) == 1  # and exits
    assert s.get(first.run_id).status == "running"
    assert s.get(other.run_id).status == "completed"
    s.leases.release("elsewhere", "another-worker")
    assert s.worker_loop(poll_interval=0.02).run(until_idle=True) == 1
    assert s.get(first.run_id).status == "completed"


def test_an_expired_lease_does_not_count_in_its_queue(queued: Make) -> None:
    s = queued(narrow=QueueLimit(concurrency=1))
    run = s.submit(s.load(one_step("n", queue="narrow")))
    s.leases.claim("dead-worker-run", "dead", -1, "narrow")  # expired already
    assert s.worker_loop(poll_interval=0.02).run(until_idle=True) == 1
    assert s.get(run.run_id).status == "completed"


def test_a_redriven_run_is_claimed_from_its_queue(queued: Make) -> None:
    s = queued(narrow=QueueLimit(concurrency=1))
    run = s.run(s.load({"name": "flaky", "queue": "narrow",
                        "error_handling": {"rollback_on_failure": False},
                        "steps": [{"id": "f", "tool": "fail",
                                   "args": {"message": "not yet", "times": 1}}]}),
                priority=4)
    assert run.status == "failed"
    worker = s.worker_loop(poll_interval=0.02)
    worker.index.refresh()  # it follows the log from before the redrive
    s.retry(run.run_id, drive=False)
    s.leases.claim("elsewhere", "another-worker", 60, "narrow")  # the queue is full
    assert worker.run(until_idle=True) == 0
    followed = worker.index.runs[str(run_uuid(run.run_id))]
    assert (followed.queue, followed.priority, followed.begun) == ("narrow", 4, True)
    s.leases.release("elsewhere", "another-worker")
    assert worker.run(until_idle=True) == 1
    assert s.get(run.run_id).status == "completed"


# -- concurrency across workers ----------------------------------------------------------


def test_concurrency_one_holds_across_two_workers(queued: Make, registry: Registry) -> None:
    overlap = Overlap(0.05)
    registry.add(Tool("overlap", overlap))
    limit = {"one": QueueLimit(concurrency=1)}
    first, second = queued(**limit), queued(**limit)
    plan = first.load(one_step("serial", queue="one", tool="overlap"))
    ids = [first.submit(plan).run_id for _ in range(6)]
    free = [first.submit(first.load(one_step("free"))).run_id for _ in range(2)]
    deadline = time.monotonic() + 120
    errors: list[BaseException] = []

    def work(s: Saga, name: str) -> None:
        w = s.worker_loop(worker_id=name, concurrency=4, poll_interval=0.01)
        try:
            w.run(stop=lambda: (w.index.position > 0 and not w.index.runs)
                  or time.monotonic() > deadline)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s, name))
               for s, name in ((first, "w1"), (second, "w2"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert {first.get(r).status for r in ids + free} == {"completed"}
    assert overlap.calls == 6 and overlap.most == 1
    spans = sorted(step_spans(first, r) for r in ids)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_claims_racing_from_many_connections_stay_within_the_limit(queued: Make) -> None:
    s = queued()
    s.leases  # noqa: B018 - the store and its tables exist before the racers connect
    racers = [Leases(Database(s.settings)) for _ in range(6)]
    limit = QueueLimit(concurrency=2)
    try:
        for round_ in range(4):
            barrier = threading.Barrier(len(racers))
            outcomes: list[str] = []

            def claim(i: int, leases: Leases, round_: int = round_,
                      barrier: threading.Barrier = barrier,
                      outcomes: list[str] = outcomes) -> None:
                barrier.wait()
                outcomes.append(leases.claim_queued(f"r{round_}-{i}", f"w{i}", 30, "race",
                                                    limit, start=True))

            threads = [threading.Thread(target=claim, args=(i, leases))
                       for i, leases in enumerate(racers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(outcomes) == ["claimed", "claimed"] + ["full"] * 4
            held = s.leases.db.query("SELECT run_id, worker FROM saga_leases WHERE queue = ?",
                                     ("race",))
            assert len(held) == 2
            for row in held:
                s.leases.release(row["run_id"], row["worker"])
    finally:
        for leases in racers:
            leases.db.close()


def test_two_worker_processes_never_run_two_of_a_queue_at_once(settings: Settings,
                                                               registry: Registry,
                                                               tmp_path: Path) -> None:
    config = tmp_path / "saga.toml"
    config.write_text('[queues.one]\nconcurrency = 1\n')
    with Saga(settings, registry=registry) as s:
        plan = s.load({"name": "slow", "queue": "one", "steps": [
            {"id": "a", "tool": "sleep", "args": {"seconds": 0.2}},
            {"id": "b", "tool": "sleep", "args": {"seconds": 0.1}}]})
        ids = [s.submit(plan).run_id for _ in range(5)]
        s.leases  # noqa: B018 - tables exist before the workers start
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        env |= {"SAGA_CONFIG": str(config), "SAGA_LEASE_SECONDS": "15"}
        if settings.is_postgres:
            env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                    "SAGA_DATABASE_SCHEMA": settings.schema or ""}
        else:
            env |= {"SAGA_HOME": str(settings.home)}
        workers = [subprocess.Popen(
            [sys.executable, "-m", "saga.cli", "worker", "--poll", "0.05", "--id", f"p{i}"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for i in range(2)]
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and any(
                    s.get(r).status != "completed" for r in ids):
                time.sleep(0.2)
        finally:
            for p in workers:
                p.terminate()
            for p in workers:
                p.wait(timeout=30)
        assert {s.get(r).status for r in ids} == {"completed"}
        spans = sorted(step_spans(s, r) for r in ids)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


# -- rate ----------------------------------------------------------------------------------


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_a_rate_limit_holds_across_workers(queued: Make) -> None:
    s = queued()
    s.leases  # noqa: B018
    clock = Clock()
    a, b = (Leases(Database(s.settings), clock) for _ in range(2))
    limit = QueueLimit(rate=2, per=60.0)
    try:
        assert a.claim_queued("r1", "a", 30, "slow", limit, start=True) == "claimed"
        assert b.claim_queued("r2", "b", 30, "slow", limit, start=True) == "claimed"
        assert b.claim_queued("r3", "b", 30, "slow", limit, start=True) == "rate"
        assert a.claim_queued("r3", "a", 30, "slow", limit, start=True) == "rate"
        a.release("r1", "a")
        # a run started before (resumed after a timer, say) is not a new start
        assert a.claim_queued("r1", "a", 30, "slow", limit, start=False) == "claimed"
        assert a.claim_queued("r4", "a", 30, "other", limit, start=True) == "claimed"
        clock.now += 59
        assert a.claim_queued("r3", "a", 30, "slow", limit, start=True) == "rate"
        clock.now += 2
        assert b.claim_queued("r3", "b", 30, "slow", limit, start=True) == "claimed"
        assert a.claim_queued("r5", "a", 30, "slow", limit, start=True) == "claimed"
        assert a.claim_queued("r6", "a", 30, "slow", limit, start=True) == "rate"
    finally:
        a.db.close()
        b.db.close()


def test_a_worker_until_idle_waits_out_its_queue_rate(queued: Make,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    s = queued(slow=QueueLimit(rate=2, per=60.0))
    plan = s.load(one_step("limited", queue="slow"))
    ids = [s.submit(plan).run_id for _ in range(5)]
    clock = Clock()
    s.leases.clock = clock
    starts: list[tuple[float, str]] = []
    refused: list[float] = []
    claim = s.leases.claim_queued

    def recording(run_id: str, *args: Any, **kwargs: Any) -> str:
        outcome = claim(run_id, *args, **kwargs)
        if outcome == "claimed" and kwargs["start"]:
            starts.append((clock.now, run_id))
        elif outcome == "rate":
            refused.append(clock.now)
        return outcome

    monkeypatch.setattr(s.leases, "claim_queued", recording)

    def tick() -> bool:
        clock.now += 7  # each look for work, a moment later
        return False

    assert s.worker_loop(poll_interval=0.01).run(until_idle=True, stop=tick) == 5
    assert {s.get(r).status for r in ids} == {"completed"}
    assert sorted(r for _, r in starts) == sorted(ids)
    assert refused  # some were held back
    times = [t for t, _ in starts]
    assert all(later - earlier >= 60 for earlier, later in zip(times, times[2:],
                                                                 strict=False))


# -- nested --------------------------------------------------------------------------------


def test_child_runs_are_driven_by_their_parent_not_by_queues(queued: Make,
                                                            tmp_path: Path) -> None:
    child = tmp_path / "child.yaml"
    child.write_text("name: child\nqueue: blocked\nsteps:\n  - {id: c, tool: echo, args: "
                     "{x: 1}}\n")
    s = queued(blocked=QueueLimit(concurrency=1, rate=1, per=3600.0))
    s.leases.claim("elsewhere", "another-worker", 60, "blocked")  # the queue is full
    parent = s.submit(s.load({"name": "parent", "steps": [{"id": "n", "use": str(child)}]}))
    assert s.worker_loop(poll_interval=0.02).run(until_idle=True) == 1
    done = s.status(parent.run_id)
    assert done["status"] == "completed"
    assert done["queue"] == "default"
    assert [c["queue"] for c in done["children"]] == [None]


# -- configuration -------------------------------------------------------------------------


def test_saga_toml_sets_queue_limits(tmp_path: Path) -> None:
    (tmp_path / "saga.toml").write_text(
        '[queues.reports]\nconcurrency = 2\nrate = "10/m"\n\n'
        '[queues.bursts]\nrate = "5/s"\n\n[queues.few]\nconcurrency = 1\nrate = "3/10s"\n')
    settings = load_settings({}, tmp_path)
    assert settings.queues == {"reports": QueueLimit(2, 10, 60.0),
                               "bursts": QueueLimit(None, 5, 1.0),
                               "few": QueueLimit(1, 3, 10.0)}
    for bad in ({"q": {"concurrency": 0}}, {"q": {"rate": "10"}}, {"q": {"rate": "0/m"}},
                {"q": {"limit": 3}}, {"q": 3}, [1]):
        with pytest.raises(ConfigError):
            parse_queues(bad)


# -- command line --------------------------------------------------------------------------


def cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_HOME": str(cwd / ".saga"), "SAGA_ACTOR": "ops"}
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_queue_and_priority(tmp_path: Path) -> None:
    (tmp_path / "report.yaml").write_text(
        "name: report\nqueue: reports\nsteps:\n  - {id: build, tool: echo, args: {pages: 3}}\n")
    (tmp_path / "saga.toml").write_text("[queues.reports]\nconcurrency = 1\n")
    submitted = cli(["submit", "report.yaml", "--id", "R-1", "--json"], tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    assert cli(["submit", "report.yaml", "--id", "R-2", "--priority", "10"],
               tmp_path).returncode == 0
    assert cli(["submit", "report.yaml", "--id", "R-3", "--queue", "other", "--priority",
                "-1"], tmp_path).returncode == 0
    bad = cli(["submit", "report.yaml", "--priority", "high"], tmp_path)
    assert bad.returncode == 2 and "--priority" in bad.stderr
    bad = cli(["submit", "report.yaml", "--queue", "a b"], tmp_path)
    assert bad.returncode == 2 and "queue name" in bad.stderr
    worker = cli(["worker", "--until-idle", "--poll", "0.05"], tmp_path)
    assert worker.returncode == 0, worker.stderr
    shown = {r: json.loads(cli(["status", r, "--json"], tmp_path).stdout)
             for r in ("R-1", "R-2", "R-3")}
    assert {r: (v["status"], v["queue"], v["priority"]) for r, v in shown.items()} == {
        "R-1": ("completed", "reports", 0), "R-2": ("completed", "reports", 10),
        "R-3": ("completed", "other", -1)}
    ran = cli(["run", "report.yaml", "--queue", "now", "--priority", "4", "--json"], tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert (json.loads(ran.stdout)["queue"], json.loads(ran.stdout)["priority"]) == ("now", 4)


@pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")
def test_http_submit_takes_queue_and_priority(sqlite_settings: Settings) -> None:
    from fastapi.testclient import TestClient

    from saga.server.app import create_app

    with TestClient(create_app(sqlite_settings, worker=False),
                    base_url="http://127.0.0.1") as client:
        body = {"composition": one_step("web", queue="reports"), "queue": "urgent",
                "priority": 3}
        sent = client.post("/api/v1/runs", json=body)
        assert sent.status_code == 202, sent.text
        shown = client.get(f"/api/v1/runs/{sent.json()['run_id']}").json()
        assert (shown["queue"], shown["priority"]) == ("urgent", 3)
        plain = client.post("/api/v1/runs", json={"composition": one_step("web",
                                                                            queue="reports")})
        assert client.get(plain.json()["url"]).json()["queue"] == "reports"
        bad = client.post("/api/v1/runs", json={**body, "queue": "not a queue"})
        assert bad.status_code == 422
