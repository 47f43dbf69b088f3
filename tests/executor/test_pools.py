"""Worker pools across real processes (issue 42): two ``saga worker`` processes, each in
its own pool, hand one run back and forth (a -> b -> a), each step running once, on a
worker of its pool; a step whose pool no worker serves leaves its run waiting, as
``saga status`` says from a new process, until a worker of that pool starts; a worker
without ``--only-pools`` runs unpooled steps too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from saga import Saga
from saga.cli.app import main
from saga.config import Settings
from saga.executor.pools import Pools
from saga.server.app import create_app
from saga.tools import load_registry
from saga.worker import Worker

ROOT = Path(__file__).resolve().parents[2]

#: The tool each step calls: it notes which worker process ran which step, in a file.
TOOLS = '''
import json, os
from saga import ToolContext, tool

@tool("where")
def where(params: dict, ctx: ToolContext) -> dict:
    with open(os.environ["POOL_TEST_LOG"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"run": ctx.run_id, "step": ctx.step_id,
                            "attempt": ctx.attempt, "tag": os.environ["POOL_TAG"],
                            "pid": os.getpid()}) + "\\n")
    return {"tag": os.environ["POOL_TAG"]}
'''
#: A tool only the hosts of pool c have (their workers alone load this module).
VPN_TOOLS = TOOLS.replace('"where"', '"tunnel"').replace("def where", "def tunnel")


def _env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_LEASE_SECONDS": "20", "POOL_TEST_LOG": str(tmp_path / "calls.jsonl"),
            "POOL_TAG": "cli", "SAGA_TOOLS": "pool_tools,vpn_tools",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    if settings.is_postgres:
        env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                "SAGA_DATABASE_SCHEMA": settings.schema or ""}
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@contextmanager
def _worker(env: dict[str, str], tag: str, *pool_args: str,
            tools: str = "pool_tools") -> Iterator[subprocess.Popen[str]]:
    """A real ``saga worker`` process named ``tag`` (its id, and what its tool notes),
    with the tools of ``tools`` (modules, comma-separated)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "saga.cli", "worker", "--poll", "0.1", "--id", tag,
         *pool_args], cwd=ROOT, env={**env, "POOL_TAG": tag, "SAGA_TOOLS": tools},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for(s: Saga, run_id: str, status: str, procs: list[subprocess.Popen[str]],
              seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while s.get(run_id).status != status:
        dead = [p for p in procs if p.poll() is not None]
        assert not dead, dead[0].stderr.read() if dead[0].stderr else "a worker died"
        assert time.monotonic() < deadline, f"run {run_id}: {s.status(run_id)}"
        time.sleep(0.1)


def _calls(tmp_path: Path, run_id: str) -> list[dict[str, Any]]:
    path = tmp_path / "calls.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [c for c in map(json.loads, lines) if c["run"] == run_id]


def _step(step_id: str, pool: str | None, after: str | None,
          tool: str = "where") -> dict[str, Any]:
    step: dict[str, Any] = {"id": step_id, "tool": tool}
    if pool is not None:
        step["pool"] = pool
    if after is not None:
        step["depends_on"] = [after]
    return step


def test_runs_move_between_pool_workers_and_wait_for_a_missing_pool(
        settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pool_tools.py").write_text(TOOLS)
    (tmp_path / "vpn_tools.py").write_text(VPN_TOOLS)
    monkeypatch.syspath_prepend(str(tmp_path))
    env = _env(settings, tmp_path)
    with Saga(settings, registry=load_registry(["pool_tools", "vpn_tools"])) as s:
        hops = s.load({"name": "hops", "steps": [
            _step("s1", "a", None), _step("s2", "b", "s1"), _step("s3", "a", "s2")]})
        late = s.load({"name": "late", "steps": [
            _step("t1", "a", None), _step("t2", "c", "t1", "tunnel"),
            _step("t3", None, "t2")]})
        hopping = s.submit(hops).run_id
        waiting = s.submit(late).run_id
        s.leases  # noqa: B018 - the tables exist before the workers start
        with _worker(env, "wa", "--pool", "a", "--only-pools") as wa, \
                _worker(env, "wb", "--pool", "b", "--only-pools") as wb:
            _wait_for(s, hopping, "completed", [wa, wb])
            # Every step ran once, on a worker of its pool, and the run changed hands.
            calls = _calls(tmp_path, hopping)
            assert [(c["step"], c["tag"], c["attempt"]) for c in calls] == [
                ("s1", "wa", 1), ("s2", "wb", 1), ("s3", "wa", 1)]
            assert {c["pid"] for c in calls} == {wa.pid, wb.pid}
            history = s.history(hopping)
            started = [(e["step_id"], e["payload"]["worker"]) for e in history
                       if e["type"] == "StepStarted"]
            assert started == [("s1", "wa"), ("s2", "wb"), ("s3", "wa")]
            awaited = [(e["step_id"], e["payload"]["pool"], e["payload"]["worker"])
                       for e in history
                       if e["type"] == "StepAwaitingPool"]
            # (wb may have claimed the new run first, and handed it to pool a at once)
            assert awaited in ([("s2", "b", "wa"), ("s3", "a", "wb")],
                               [("s1", "a", "wb"), ("s2", "b", "wa"), ("s3", "a", "wb")])

            # No worker serves pool c: the run waits (never fails), and says so.
            deadline = time.monotonic() + 60
            while not any(e["type"] == "StepAwaitingPool"
                          for e in s.history(waiting)):
                assert time.monotonic() < deadline, s.status(waiting)
                time.sleep(0.1)
            time.sleep(1)  # a few more looks of both workers change nothing
            assert s.get(waiting).status == "running"
            shown = _cli(env, "status", waiting)
            assert shown.returncode == 0, shown.stderr
            assert "waiting: pool c (step t2" in shown.stdout, shown.stdout
            summary = json.loads(_cli(env, "status", waiting, "--json").stdout)
            assert [(w["step"], w["pool"]) for w in summary["waiting_for_pools"]] == \
                [("t2", "c")]
            assert [c["step"] for c in _calls(tmp_path, waiting)] == ["t1"]

            # A worker of pool c (and, without --only-pools, of unpooled steps) comes: it
            # alone has the tool t2 calls (wa ran t1 without it).
            with _worker(env, "wc", "--pool", "c", tools="pool_tools,vpn_tools") as wc:
                _wait_for(s, waiting, "completed", [wa, wb, wc])
            calls = _calls(tmp_path, waiting)
            assert [(c["step"], c["tag"]) for c in calls] == [
                ("t1", "wa"), ("t2", "wc"), ("t3", "wc")]
            assert "waiting_for_pools" not in s.status(waiting)
    for run_id in (hopping, waiting):  # a new process replays and verifies each
        assert _cli(env, "replay", run_id, "--verify").returncode == 0
        verified = _cli(env, "audit", "verify", run_id)
        assert verified.returncode == 0, verified.stdout + verified.stderr


def test_an_undo_waits_for_its_steps_pool_and_no_other_worker_claims_the_run(
        lite: Saga) -> None:
    """In one process, fast: a run whose failed step (pool b) must undo a step of pool a
    hands the undo to pool a; a worker of neither pool looks at the run once, records
    why it waits, and never claims it again."""
    s = lite
    plan = s.load({"name": "undo-hops", "steps": [
        {"id": "s1", "tool": "act", "pool": "a",
         "compensate": {"tool": "undo", "parameters": {"what": "s1"}}},
        {"id": "s2", "tool": "act", "pool": "b", "depends_on": ["s1"],
         "parameters": {"fail": True}, "on_error": "compensate"}]})
    run_id = s.submit(plan).run_id

    def worker(*pools: str, only: bool = True) -> Worker:
        return s.worker_loop(worker_id="w-" + "".join(pools), poll_interval=0.05,
                             lease_seconds=30, pools=Pools.of(pools, only))

    def awaited() -> list[tuple[str, str | None, bool]]:
        return [(e["step_id"], e["payload"]["pool"], e["payload"]["compensation"])
                for e in s.history(run_id) if e["type"] == "StepAwaitingPool"]

    idle = worker("c")  # serves neither pool (nor unpooled steps)
    idle.run(until_idle=True)
    assert awaited() == [("s1", "a", False)]
    version = s.get(run_id).version
    assert idle.run(until_idle=True) == 1  # no second drive: it waits for pool a
    assert idle.index.runnable() == [] and s.get(run_id).version == version
    # News (a label) makes every worker look again: this one says again why it waits,
    # once, instead of claiming the run at every look.
    s.label(run_id, {"team": "x"})
    assert idle.run(until_idle=True) == 2
    assert awaited() == [("s1", "a", False)] * 2
    assert idle.run(until_idle=True) == 2 and len(awaited()) == 2
    assert s.status(run_id)["waiting_for_pools"][0]["pool"] == "a"

    worker("a").run(until_idle=True)
    worker("b").run(until_idle=True)  # s2 fails: s1's undo needs pool a
    assert awaited()[-2:] == [("s2", "b", False), ("s1", "a", True)]
    assert s.get(run_id).status == "compensating"
    assert s.status(run_id)["waiting_for_pools"] == [
        {"step": "s1", "pool": "a", "compensation": True,
         "since": s.status(run_id)["waiting_for_pools"][0]["since"]}]
    with TestClient(create_app(s.settings, worker=False),
                    base_url="http://127.0.0.1") as http:  # the HTTP API says the same
        answer = http.get(f"/api/v1/runs/{run_id}").json()
    assert [(w["step"], w["pool"]) for w in answer["waiting_for_pools"]] == [("s1", "a")]
    undone = worker("a")
    undone.run(until_idle=True)
    run = s.get(run_id)
    assert run.status == "compensated"
    assert [(e["type"], e["payload"].get("worker")) for e in s.history(run_id)
            if e["type"] == "StepStarted"] == [("StepStarted", "w-a"), ("StepStarted", "w-b")]
    assert "waiting_for_pools" not in s.status(run_id)


def test_a_run_waiting_for_a_pool_still_times_out(lite: Saga) -> None:
    """A run's deadline applies while it waits for a pool no worker serves: a worker of
    another pool takes it up when the deadline passes, and undoes what it did."""
    s = lite
    plan = s.load({"name": "late-pool", "steps": [
        {"id": "s1", "tool": "act", "compensate": {"tool": "undo", "parameters": {}}},
        {"id": "s2", "tool": "act", "pool": "nowhere", "depends_on": ["s1"]}]})
    run_id = s.submit(plan, options={"timeout": 4}).run_id
    plain = s.worker_loop(worker_id="plain", poll_interval=0.05, lease_seconds=30)
    plain.run(until_idle=True)
    assert s.status(run_id)["waiting_for_pools"][0]["pool"] == "nowhere"
    deadline = time.monotonic() + 30
    while s.get(run_id).status not in ("compensated", "failed"):
        assert time.monotonic() < deadline, s.status(run_id)
        plain.run(until_idle=True)  # idle until the deadline: then it takes the run up
        time.sleep(0.1)
    kinds = [e["type"] for e in s.history(run_id)]
    assert kinds[kinds.index("StepAwaitingPool") + 1] == "RunTimedOut", kinds
    assert s.get(run_id).status == "compensated" and "s2" not in s.get(run_id).steps


def test_only_pools_without_a_pool_is_refused(tmp_path: Path) -> None:
    """A worker that would run nothing is an operator's mistake: one line, exit 2."""
    result = CliRunner().invoke(main, ["worker", "--only-pools"],
                                env={"SAGA_HOME": str(tmp_path / ".saga")})
    assert result.exit_code == 2
    assert "--only-pools: needs at least one --pool NAME" in result.output
