"""Notifications across real processes: `saga worker` processes derive webhooks from the
log into the outbox and deliver them, signed, to a receiver on loopback that is down at
first; a second worker, a restart and a replayed log make no second notification; the
CLI, in new processes, lists and redelivers them. The signature is checked with the
verifier the documentation prints."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from saga import Saga
from saga.cli import main
from saga.config import Settings, load_settings
from saga.store.outbox import Outbox
from saga.worker.notify import Notifier

ROOT = Path(__file__).resolve().parents[2]
SECRET = "whsec_test_0123456789"
DOCS = ROOT / "docs" / "howto" / "notifications.md"


def docs_verify() -> Callable[..., bool]:
    """The ``verify`` of the documentation's receiver, as printed there."""
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"```python\n(# receiver\.py\n.*?)```", text, re.S)
    assert block is not None
    namespace: dict[str, Any] = {"__name__": "receiver"}
    exec(block.group(1), namespace)  # our own documentation's code
    verify: Callable[..., bool] = namespace["verify"]
    return verify


class Receiver:
    """A webhook receiver on loopback (started on demand): records every request and
    answers each path as told (``answers``: path -> (status, headers); else 200)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.got: list[tuple[str, dict[str, str], bytes]] = []
        self.answers: dict[str, tuple[int, dict[str, str]]] = {}
        self._server: http.server.HTTPServer | None = None

    def start(self) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.got.append((self.path, dict(self.headers), body))
                status, headers = outer.answers.get(self.path, (200, {}))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self._server = http.server.HTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def until(what: str, check: Callable[[], Any], seconds: float = 60) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def env_of(settings: Settings, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_CONFIG": str(config), "HOOK_SECRET": SECRET, "SAGA_LEASE_SECONDS": "2"}
    if settings.is_postgres:
        env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                "SAGA_DATABASE_SCHEMA": settings.schema or ""}
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env


def cli(env: dict[str, str], *args: str) -> Any:
    """A saga command in a new process; its --json output."""
    done = subprocess.run([sys.executable, "-m", "saga.cli", *args, "--json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (args, done.stderr)
    return json.loads(done.stdout)


@contextmanager
def workers(env: dict[str, str]) -> Iterator[Callable[[str], subprocess.Popen[bytes]]]:
    """Start `saga worker` processes by id; all are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(worker_id: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--poll", "0.1",
                                 "--id", worker_id], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started.append(proc)
        return proc
    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)


def test_a_failed_run_is_notified_once_per_event_and_target_by_real_workers(
        settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "saga.toml"
    config.write_text(f"""
[[notify]]
url = "http://127.0.0.1:{port}/fleet"
events = ["run.failed", "step.failed"]
secret_env = "HOOK_SECRET"

[notifications]
backoff_max = "1s"
url_of_runs = "https://saga.example.com"
""", encoding="utf-8")
    composition = tmp_path / "early.yaml"  # fails before any step starts
    composition.write_text(yaml.safe_dump({
        "name": "early", "inputs": {"n": {"type": "integer", "default": 1}},
        "notify": [{"url": f"http://127.0.0.1:{port}/own", "events": ["run.failed"],
                    "secret_env": "HOOK_SECRET"}],
        "steps": [{"id": "a", "tool": "noop", "when": "inputs.n / 0 > 1"}]}),
        encoding="utf-8")
    env = env_of(settings, config)
    receiver = Receiver(port)
    verify = docs_verify()
    # this process submits and polls; the CLI checks from new ones, workers deliver
    reader = Saga(settings)
    with workers(env) as start:
        first = start("w1")
        run_id = reader.submit(composition).run_id

        def retried() -> list[dict[str, Any]] | None:
            found = reader.notifications()
            return found if len(found) == 3 and all(
                n["status"] == "pending" and n["attempts"] >= 2 for n in found) else None
        # the receiver is down: each is tried again and again
        down = until("attempts while the receiver is down", retried)
        start("w2")  # a second worker follows the same log
        receiver.start()
        try:
            until("every notification delivered", lambda: len(
                reader.notifications("delivered")) == 3)
            shown = reader.notification(down[0]["id"][:6])
            outcomes = [a["outcome"] for a in shown["attempts_log"]]
            assert outcomes[-1] == "delivered" and set(outcomes[:-1]) == {"failed"}, outcomes
            assert "Connection" in shown["attempts_log"][0]["error"]

            # once per (event, target), signed as the documentation verifies
            sent = [(path, headers["Saga-Event-Id"], json.loads(body))
                    for path, headers, body in receiver.got]
            assert sorted((p, e) for p, e, _ in sent) == sorted(
                [("/fleet", f"{run_id}:2"), ("/fleet", f"{run_id}:3"), ("/own", f"{run_id}:3")])
            for _, headers, body in receiver.got:
                assert verify(SECRET, headers["Saga-Signature"], body)
                assert not verify("another secret", headers["Saga-Signature"], body)
                assert SECRET.encode() not in body
            bodies = {(p, b["type"]): b for p, _, b in sent}
            assert bodies[("/own", "run.failed")] | {"occurred_at": None} == {
                "id": f"{run_id}:3", "type": "run.failed", "run_id": run_id,
                "definition": "early", "status": "failed", "occurred_at": None,
                "error": bodies[("/own", "run.failed")]["error"],
                "url_of_run": f"https://saga.example.com/runs/{run_id}"}
            assert bodies[("/fleet", "step.failed")]["step_id"] == "a"
            assert "ZeroDivisionError" in bodies[("/fleet", "step.failed")]["error"]["message"]

            # a worker killed and restarted, and the log derived again from its start:
            # no second notification, no second delivery
            before = {n["id"]: n["attempts"] for n in cli(env, "notifications", "list")}
            first.send_signal(signal.SIGKILL)
            first.wait(30)
            start("w1-again")
            outbox = Outbox(load_settings(env, cwd=tmp_path))
            try:
                outbox.position("log:0")
                outbox._db.execute("UPDATE saga_outbox_position SET position = 0")
            finally:
                outbox.close()
            marker = reader.submit(composition).run_id
            until("the next run's notifications", lambda: len(
                reader.notifications("delivered", marker)) == 3)
            after = cli(env, "notifications", "list", "--run", run_id)
            assert {n["id"]: n["attempts"] for n in after} == before
            assert len([g for g in receiver.got if run_id in g[1]["Saga-Event-Id"]]) == 3

            # retry redelivers: the same notification, one more attempt
            own = next(n for n in after if n["target"].endswith("/own"))
            assert cli(env, "notifications", "retry", own["id"])["status"] == "pending"
            until("the redelivery", lambda: [g for g in receiver.got if g[0] == "/own"
                                             and g[1]["Saga-Event-Id"] == f"{run_id}:3"][1:])
            until("the redelivery recorded", lambda: reader.notification(own["id"])[
                "status"] == "delivered")
            again = {n["id"]: n for n in cli(env, "notifications", "list", "--run", run_id)}
            assert len(again) == 3 and again[own["id"]]["attempts"] == own["attempts"] + 1
            assert again[own["id"]]["delivered_at"] > own["delivered_at"]
        finally:
            receiver.stop()
            reader.close()


def test_redirects_are_not_followed_and_plain_http_goes_to_loopback_only(
        sqlite_settings: Settings, tmp_path: Path) -> None:
    port = free_port()
    receiver = Receiver(port)
    receiver.answers["/hop"] = (302, {"Location": f"http://127.0.0.1:{port}/elsewhere"})
    receiver.start()
    definition = {"name": "hop", "steps": [{"id": "a", "tool": "fail"}],
                  "notify": [{"url": f"http://127.0.0.1:{port}/hop", "events": ["run.failed"],
                              "secret_env": "HOOK_SECRET"}]}
    saga = Saga(sqlite_settings)
    notifier = Notifier(saga.app, sqlite_settings, "t", env={"HOOK_SECRET": SECRET})
    try:
        saga.run(saga.load(definition))
        assert notifier.round() == (1, 0)
        [found] = saga.notifications()
        assert found["status"] == "pending" and found["attempts"] == 1
        assert "redirect" in found["last_error"] and "/elsewhere" in found["last_error"]
        assert [g[0] for g in receiver.got] == ["/hop"]  # never /elsewhere
    finally:
        notifier.stop()
        saga.close()
        receiver.stop()

    files = {"insecure.yaml": "http://hooks.example.com/x",
             "allowed.yaml": "http://hooks.example.com/x"}
    for name, url in files.items():
        target = {"url": url, "events": ["run.failed"], "secret_env": "HOOK_SECRET",
                  **({"allow_insecure": True} if name == "allowed.yaml" else {})}
        (tmp_path / name).write_text(yaml.safe_dump(
            {"name": "n", "steps": [{"id": "a", "tool": "noop"}], "notify": [target]}))
    env = {"SAGA_HOME": str(sqlite_settings.home), "SAGA_DATABASE_URL": None,
           "SAGA_CONFIG": None}
    runner = CliRunner()
    refused = runner.invoke(main, ["validate", str(tmp_path / "insecure.yaml")], env=env)
    assert refused.exit_code == 2 and "allow_insecure" in refused.output, refused.output
    allowed = runner.invoke(main, ["validate", str(tmp_path / "allowed.yaml")], env=env)
    assert allowed.exit_code == 0, allowed.output
    (tmp_path / "bad.toml").write_text('[[notify]]\nurl = "http://10.1.2.3/hook"\n'
                                       'events = ["run.failed"]\nsecret_env = "S"\n')
    worker = runner.invoke(main, ["worker", "--until-idle"],
                           env=env | {"SAGA_CONFIG": str(tmp_path / "bad.toml")})
    assert worker.exit_code == 2 and "is plain http" in worker.output, worker.output



def test_the_kinds_of_news_and_the_filters(sqlite_settings: Settings) -> None:
    """Approvals and signal waits are run.waiting (a timer is not), a cancel is
    run.cancelled, and saga.toml's filter picks runs by definition and labels."""
    port = free_port()
    receiver = Receiver(port)
    receiver.start()
    settings = replace(sqlite_settings, file={"notify": [
        {"url": f"http://127.0.0.1:{port}/all", "secret_env": "HOOK_SECRET",
         "events": ["run.waiting", "run.cancelled", "run.completed"]},
        {"url": f"http://127.0.0.1:{port}/paying", "secret_env": "HOOK_SECRET",
         "events": ["run.waiting"], "filter": {"labels": {"team": "pay"}}},
        {"url": f"http://127.0.0.1:{port}/other", "secret_env": "HOOK_SECRET",
         "events": ["run.waiting"], "filter": {"definition": "nothing-of-ours"}}]})
    saga = Saga(settings)
    notifier = Notifier(saga.app, settings, "t", env={"HOOK_SECRET": SECRET})
    try:
        gate = saga.run(saga.load({"name": "gate", "steps": [
            {"id": "nap", "sleep": 0.01}, {"id": "ok", "tool": "noop", "confirm": "go?"}]}),
            labels={"team": "pay"}).run_id
        wait = saga.run(saga.load({"name": "wait", "steps": [
            {"id": "go", "signal": "go", "timeout": 3600}]})).run_id
        saga.cancel(wait, reason="not today")
        graph = saga.run(saga.load({  # the graph form takes notify: too
            "id": "g", "name": "graph", "entry_point": "a",
            "notify": [{"url": f"http://127.0.0.1:{port}/graph", "events": ["run.failed"],
                        "secret_env": "HOOK_SECRET"}],
            "nodes": [{"id": "a", "type": "task",
                       "task_config": {"role": "fail", "task_template": "x"}}]})).run_id
        notifier.round()
        assert sorted((g[0], json.loads(g[2])["type"], json.loads(g[2])["run_id"])
                      for g in receiver.got) == sorted([
            ("/all", "run.waiting", gate), ("/paying", "run.waiting", gate),
            ("/all", "run.waiting", wait), ("/all", "run.cancelled", wait),
            ("/graph", "run.failed", graph)])
        assert {json.loads(g[2])["status"] for g in receiver.got} == {"waiting", "cancelled",
                                                                      "failed"}
    finally:
        notifier.stop()
        saga.close()
        receiver.stop()


def test_an_attempt_its_worker_never_finished_is_recorded_interrupted(
        settings: Settings) -> None:
    """A worker that dies mid-send leaves its attempt ``sending``; once its lease lapses
    another worker sends the notification again and records the first one interrupted."""
    port = free_port()
    receiver = Receiver(port)
    receiver.start()
    settings = replace(settings, file={"notify": [
        {"url": f"http://127.0.0.1:{port}/h", "events": ["run.failed"],
         "secret_env": "HOOK_SECRET"}]})
    later = [datetime.now(UTC)]
    saga = Saga(settings)
    notifier = Notifier(saga.app, settings, "alive", env={"HOOK_SECRET": SECRET},
                        clock=lambda: later[0])
    try:
        saga.run(saga.load({"name": "dies", "steps": [{"id": "a", "tool": "fail"}]}))
        assert notifier.deriver.round() == 1
        now = later[0]
        [dead] = notifier.outbox.claim("dead", now.isoformat(timespec="microseconds"),
                                       (now + timedelta(seconds=5)).isoformat(
                                           timespec="microseconds"), 8)
        assert notifier.round() == (0, 0)  # leased to the dead worker: not sent
        later[0] = now + timedelta(seconds=6)
        assert notifier.round() == (0, 1)
        shown = saga.notification(dead.row["id"])
        assert [(a["attempt"], a["worker"], a["outcome"]) for a in shown["attempts_log"]] == [
            (1, "dead", "interrupted"), (2, "alive", "delivered")]
        assert len(receiver.got) == 1
    finally:
        notifier.stop()
        saga.close()
        receiver.stop()
