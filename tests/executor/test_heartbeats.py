"""Heartbeats of long calls (issue 42), across real processes, on SQLite and PostgreSQL.

A ``saga worker`` process runs a tool that beats ``{"done": N}`` and then hangs; other
processes (``saga status``, the HTTP API) see the details live; the worker is SIGKILLed,
a second worker takes the run over, and the retried attempt resumes from the details the
log kept (``ctx.last_heartbeat``). A step with ``heartbeat_timeout`` whose tool stops
beating fails with ``HeartbeatTimeout`` and is retried; the ``shell`` tool passes its
progress lines as details. The run replays and its audit chain verifies.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from saga import Saga
from saga.config import Settings
from saga.executor.heartbeats import Beats
from saga.server.app import create_app
from saga.store import heartbeats as heartbeats_store
from saga.tools import load_registry

ROOT = Path(__file__).resolve().parents[2]
TOOLS = "tests.standins.beating"
DEFINITION: dict[str, Any] = {
    "name": "long-calls",
    "steps": [
        # beats {"done": 1..3}, then hangs on its first attempt (its worker is killed)
        {"id": "migrate", "tool": "beating", "parameters": {"count": 3, "hang_on": [1]}},
        # beats twice, then stops beating for 2 s on its first attempt: timed out
        {"id": "watched", "tool": "beating", "heartbeat_timeout": 1,
         "retry": {"max_attempts": 2, "delay": 0.1, "jitter": 0},
         "parameters": {"count": 2, "hang_on": [1], "hang": 2}},
        {"id": "progress", "tool": "shell", "heartbeat_timeout": "5s",
         "parameters": {"argv": ["sh", "-c", "echo PROGRESS 1/2; echo noise; "
                                               "echo PROGRESS 2/2 >&2"],
                        "progress": r"^PROGRESS (?P<done>\d+)/(?P<total>\d+)"}},
    ],
}


def env_of(settings: Settings) -> dict[str, str]:
    """A saga process's environment: this test's store and tools, short leases."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_TOOLS": TOOLS, "SAGA_SHELL_ALLOW": "sh", "SAGA_LEASE_SECONDS": "1"}
    if settings.is_postgres:
        env["SAGA_DATABASE_URL"] = settings.database_url or ""
        env["SAGA_DATABASE_SCHEMA"] = settings.schema or ""
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT,
                          env=env_of(settings), capture_output=True, text=True, timeout=120)


def worker(settings: Settings) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--poll", "0.05",
                             "--lease", "1"], cwd=ROOT, env=env_of(settings),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def until(check: Callable[[], bool], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.1)


def beat_of(summary: dict[str, Any], step: str) -> dict[str, Any]:
    found: dict[str, Any] = summary["steps"].get(step, {}).get("heartbeat") or {}
    return found


def test_heartbeats_are_seen_live_resumed_after_a_kill_and_timed_out(
        settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "long-calls.yaml"
    path.write_text(yaml.safe_dump(DEFINITION))
    with Saga(settings, registry=load_registry([TOOLS])) as saga:
        run_id = saga.submit(saga.load(path)).run_id
        first = worker(settings)
        try:
            until(lambda: beat_of(saga.status(run_id), "migrate").get("details")
                  == {"done": 3})
            # a new process sees the live details of the call in flight, by status and API
            shown = json.loads(cli(settings, "status", run_id, "--json").stdout)
            assert beat_of(shown, "migrate") | {"at": None} == {
                "attempt": 1, "details": {"done": 3}, "beats": 3, "at": None, "live": True}
            plain = cli(settings, "status", run_id).stdout
            assert re.search(r'migrate +running +1 +heartbeat \d+s ago: \{"done": 3\}', plain), \
                plain
            with TestClient(create_app(settings, worker=False),
                            base_url="http://127.0.0.1") as api:
                answer = api.get(f"/api/v1/runs/{run_id}").json()
            assert beat_of(answer, "migrate")["details"] == {"done": 3}
            assert saga.get(run_id).steps["migrate"].get("heartbeat") is None  # no event yet
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
        second = worker(settings)
        try:
            until(lambda: saga.get(run_id).is_finished)
        finally:
            second.terminate()
            second.wait(timeout=60)
        run = saga.get(run_id)
        assert run.status == "completed", run.error
        history = saga.history(run_id)

    kinds = [(e["type"], e.get("step_id"), e["payload"].get("attempt")) for e in history]
    # the dead attempt's last details went into the log before it was recorded interrupted
    at = kinds.index(("HeartbeatRecorded", "migrate", 1))
    assert kinds[at - 1][0] == "RunTakenOver" and kinds[at + 1] == ("StepFailed", "migrate", 1)
    assert history[at + 1]["payload"]["error_type"] == "Interrupted"
    assert history[at]["payload"]["details"] == {"done": 3}
    # ... and its retry resumed from them
    assert run.steps["migrate"]["output"] == {"resumed_from": {"done": 3}, "done": 6,
                                              "attempt": 2}
    # a step whose tool stopped beating failed with HeartbeatTimeout and was retried
    failed = [e["payload"] for e in history if e["type"] == "StepFailed"
              and e["step_id"] == "watched"]
    assert [(f["attempt"], f["error_type"], f["retryable"]) for f in failed] == [
        (1, "HeartbeatTimeout", True)]
    assert "no heartbeat for 1s" in failed[0]["message"]
    assert run.steps["watched"]["output"] == {"resumed_from": {"done": 2}, "done": 4,
                                              "attempt": 2}
    # the shell tool's progress lines (stdout and stderr) are its details
    recorded = [e["payload"] for e in history if e["type"] == "HeartbeatRecorded"
                and e["step_id"] == "progress"]
    assert [r["details"] for r in recorded] == [{"done": "2", "total": "2"}]
    # every attempt that beat recorded one HeartbeatRecorded, not one per beat
    assert sum(1 for k in kinds if k[0] == "HeartbeatRecorded") == 5
    shown = json.loads(cli(settings, "status", run_id, "--json").stdout)
    assert beat_of(shown, "progress")["details"] == {"done": "2", "total": "2"}
    replayed = cli(settings, "replay", run_id, "--verify")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    audited = cli(settings, "audit", "verify", run_id)
    assert audited.returncode == 0, audited.stdout + audited.stderr


def test_many_beats_make_one_event_and_a_write_a_second(
        sqlite_settings: Settings, monkeypatch: Any) -> None:
    """2,000 beats in about a second: one HeartbeatRecorded (with the count and the last
    details), and the side table written at most once a second (plus the first)."""
    writes: list[Any] = []
    put = heartbeats_store.Heartbeats.put

    def counted(self: Any, *args: Any, **kwargs: Any) -> None:
        writes.append(args)
        put(self, *args, **kwargs)
    monkeypatch.setattr(heartbeats_store.Heartbeats, "put", counted)
    definition = {"name": "chatty", "steps": [
        {"id": "chatty", "tool": "beating", "parameters": {"count": 2000, "pause": 0.0005}}]}
    with Saga(sqlite_settings, registry=load_registry([TOOLS])) as saga:
        began = time.monotonic()
        run = saga.run(saga.load(definition))
        took = time.monotonic() - began
        history = saga.history(run.run_id)
    assert run.status == "completed"
    recorded = [e["payload"] for e in history if e["type"] == "HeartbeatRecorded"]
    assert [(r["beats"], r["details"]) for r in recorded] == [(2000, {"done": 2000})]
    assert 1 <= len(writes) <= took + 2, (len(writes), took)  # a second apart at most


def test_beats_from_many_threads_are_all_counted_and_kept_as_json() -> None:
    """ctx.heartbeat is safe from any thread; details are kept as JSON (a value that is
    not JSON as its text, an oversized one cut short): they go into an event."""
    loop = asyncio.new_event_loop()
    loop.close()  # a Beats with nothing to write never uses it
    beats = Beats(None, loop)
    threads = [threading.Thread(target=lambda: [beats.beat({"n": i}) for i in range(500)])
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert beats.snapshot() == {"details": {"n": 499}, "beats": 4000, "at": beats.at}
    beats.beat()  # no details: the last are kept
    beats.beat({"when": datetime(2026, 1, 2, tzinfo=UTC), "rows": {1, 2}})
    assert beats.details == {"when": "2026-01-02 00:00:00+00:00", "rows": "{1, 2}"}
    beats.beat({"log": "x" * 10_000})
    assert beats.details["_truncated"] is True and len(json.dumps(beats.details)) < 8192
    assert beats.close() is not None and beats.count == 4003
    beats.beat({"late": True})  # a call given up on, still beating: not kept
    assert beats.count == 4003 and "late" not in beats.details
