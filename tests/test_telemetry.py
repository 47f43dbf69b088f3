"""Observability as an operator meets it: spans from ``OTEL_TRACES_EXPORTER=console``, the
``traceparent`` an HTTP server receives, one trace across a crash and a resume, a
worker's Prometheus metrics, and JSON log lines that say which run and step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from saga.api import Saga
from saga.telemetry import scope, tracing

ROOT = Path(__file__).resolve().parent.parent

TWO_STEPS = """
name: two
steps:
  - {id: first, tool: echo, args: {a: 1}}
  - {id: second, tool: echo, args: {b: 2}}
"""

SAY = '''
from saga import tool


@tool("say")
def say(params, ctx):
    ctx.logger.info("saying %s", params["word"])
    return {"said": params["word"], "traceparent": ctx.traceparent}
'''


def saga(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga", *args], cwd=cwd,
                          env=_env(cwd, **env), capture_output=True, text=True, timeout=120)


def _env(cwd: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SAGA_", "OTEL_", "TRACEPARENT"))}
    env |= {"SAGA_HOME": str(cwd / ".saga"), "SAGA_LEASE_SECONDS": "2",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd)])}
    return env | extra


def spans(stderr: str) -> list[dict[str, Any]]:
    """The console exporter's spans (one JSON object per line on stderr)."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("{") and '"context"' in line:
            span = json.loads(line)
            if "name" in span and "trace_id" in span.get("context", {}):
                found.append(span)
    return found


def trace_id(span: dict[str, Any]) -> str:
    return str(span["context"]["trace_id"]).removeprefix("0x")


def started_context(cwd: Path, run_id: str) -> dict[str, Any]:
    history = json.loads(saga(["history", run_id, "--json"], cwd).stdout)
    assert history[0]["type"] == "RunStarted"
    return dict(history[0]["payload"]["context"])


def test_console_spans_of_a_two_step_run(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_STEPS, encoding="utf-8")
    ran = saga(["run", "two.yaml", "--json"], tmp_path, OTEL_TRACES_EXPORTER="console")
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]  # stdout stays the command's JSON
    found = spans(ran.stderr)
    by_name = {s["name"]: [x for x in found if x["name"] == s["name"]] for s in found}
    assert sorted(by_name) == ["saga.run", "saga.step"]
    [run_span] = by_name["saga.run"]
    assert run_span["attributes"]["saga.run_id"] == run_id
    assert run_span["attributes"]["saga.definition"] == "two"
    assert run_span["attributes"]["saga.outcome"] == "completed"
    assert run_span["resource"]["attributes"]["service.name"] == "saga"
    steps = {s["attributes"]["saga.step_id"]: s for s in by_name["saga.step"]}
    assert set(steps) == {"first", "second"}
    for step in steps.values():
        assert step["attributes"]["saga.run_id"] == run_id
        assert step["attributes"]["saga.attempt"] == 1
        assert step["attributes"]["saga.outcome"] == "completed"
        assert step["parent_id"] == run_span["context"]["span_id"]
    recorded = started_context(tmp_path, run_id)["trace_id"]
    assert {trace_id(s) for s in found} == {recorded}


def test_a_failed_step_and_its_compensation_are_spans(tmp_path: Path) -> None:
    (tmp_path / "undo.yaml").write_text("""
name: undo
steps:
  - id: made
    tool: echo
    args: {thing: 1}
    compensate: {tool: echo, args: {removed: 1}}
  - {id: broken, tool: fail, args: {message: "no"}}
""", encoding="utf-8")
    ran = saga(["run", "undo.yaml", "--json"], tmp_path, OTEL_TRACES_EXPORTER="console",
               OTEL_SERVICE_NAME="billing")
    assert ran.returncode == 1
    found = spans(ran.stderr)
    outcomes = {(s["name"], s["attributes"].get("saga.step_id")): s for s in found}
    assert outcomes["saga.step", "broken"]["attributes"]["saga.outcome"] == "failed"
    assert outcomes["saga.step", "broken"]["status"]["status_code"] == "ERROR"
    assert outcomes["saga.compensate", "made"]["attributes"]["saga.outcome"] == "compensated"
    assert outcomes["saga.run", None]["attributes"]["saga.outcome"] == "compensated"
    assert found[0]["resource"]["attributes"]["service.name"] == "billing"


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def loopback() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A loopback HTTP server that records each request's headers."""
    seen: ClassVar[list[dict[str, str]]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", seen
    server.shutdown()
    server.server_close()


def test_the_http_tool_sends_the_steps_traceparent(
        tmp_path: Path, loopback: tuple[str, list[dict[str, str]]]) -> None:
    url, seen = loopback
    (tmp_path / "call.yaml").write_text(f"""
name: call
steps:
  - {{id: fetch, tool: http, args: {{url: "{url}"}}}}
""", encoding="utf-8")
    ran = saga(["run", "call.yaml", "--json"], tmp_path, OTEL_TRACES_EXPORTER="console")
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    [headers] = seen
    version, trace, span, flags = headers["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    assert trace == started_context(tmp_path, run_id)["trace_id"]
    [step] = [s for s in spans(ran.stderr) if s["name"] == "saga.step"]
    assert step["context"]["span_id"] == "0x" + span  # the server's parent is the step

    seen.clear()  # tracing off: no header, and nothing of opentelemetry is loaded
    quiet = saga(["run", "call.yaml", "--json"], tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "traceparent" not in seen[0]
    assert spans(quiet.stderr) == []


def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_STEPS, encoding="utf-8")
    code = ("import sys\nfrom saga.cli import main\n"
            "try:\n    main(['run', 'two.yaml', '--json'], standalone_mode=False)\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', "
            "'prometheus_client'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(tmp_path),
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.splitlines()[-1] == "[]"


NAP = '''
import time
from pathlib import Path

from saga import tool


@tool("nap")
def nap(params, ctx):
    """The first attempt says it started, then naps until its process is killed."""
    if ctx.attempt == 1:
        Path("napping").write_text(ctx.run_id)
        time.sleep(120)
    return {"attempt": ctx.attempt}
'''


def test_a_resumed_run_stays_in_the_trace_recorded_in_run_started(tmp_path: Path) -> None:
    (tmp_path / "naptools.py").write_text(NAP, encoding="utf-8")
    (tmp_path / "slow.yaml").write_text("""
name: slow
steps:
  - {id: first, tool: echo, args: {a: 1}}
  - {id: nap, tool: nap}
""", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "saga", "run", "slow.yaml", "--json",
                             "--tools", "naptools"], cwd=tmp_path,
                            env=_env(tmp_path, OTEL_TRACES_EXPORTER="console"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "napping").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "nap never started"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)  # the process driving the run dies in the nap
        _, first_err = proc.communicate(timeout=30)
    run_id = (tmp_path / "napping").read_text()
    recorded = started_context(tmp_path, run_id)["trace_id"]
    assert {trace_id(s) for s in spans(first_err)} == {recorded}  # the first step's span

    resumed = saga(["resume", run_id, "--json", "--tools", "naptools"], tmp_path,
                   OTEL_TRACES_EXPORTER="console")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    later = spans(resumed.stderr)
    assert {trace_id(s) for s in later} == {recorded}
    [run_span] = [s for s in later if s["name"] == "saga.run"]
    assert run_span["parent_id"] is None and run_span["attributes"]["saga.run_id"] == run_id
    [step] = [s for s in later if s["name"] == "saga.step"]
    assert (step["attributes"]["saga.step_id"], step["attributes"]["saga.attempt"]) == ("nap", 2)


def test_a_worker_serves_prometheus_metrics(tmp_path: Path) -> None:
    (tmp_path / "two.yaml").write_text(TWO_STEPS, encoding="utf-8")
    submitted = saga(["submit", "two.yaml", "--json"], tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    worker = subprocess.Popen(
        [sys.executable, "-m", "saga", "worker", "--metrics-port", "0", "--poll", "0.05"],
        cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True)
    try:
        assert worker.stderr is not None
        first = worker.stderr.readline()
        assert first.startswith("metrics on http://127.0.0.1:"), first
        url = first.split()[-1]
        deadline = time.monotonic() + 60
        while True:
            text = httpx.get(url, timeout=5).text
            if 'saga_runs_finished_total{definition="two",status="completed"} 1.0' in text \
                    and "saga_queue_depth 0.0" in text:  # the worker looked again since
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.1)
    finally:
        worker.terminate()
        worker.wait(30)
    values = _samples(text)
    assert values['saga_step_attempts_total{tool="echo"}'] == 2
    assert values['saga_step_duration_seconds_count{outcome="completed",tool="echo"}'] == 2
    assert values["saga_queue_depth"] == 0
    assert "saga_projection_lag_events" in values
    assert not any(name.startswith("saga_runs_started") for name in values)  # submit did
    assert "process_cpu_seconds_total" in values


def _samples(text: str) -> dict[str, float]:
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def write_say(folder: Path) -> None:
    """A tool that logs, and a one-step composition calling it."""
    (folder / "saytools.py").write_text(SAY, encoding="utf-8")
    (folder / "say.yaml").write_text("""
name: say
steps:
  - {id: hello, tool: say, args: {word: hi}}
""", encoding="utf-8")


def test_json_log_lines_say_which_run_and_step(tmp_path: Path) -> None:
    write_say(tmp_path)
    ran = saga(["--log-format", "json", "run", "say.yaml", "--tools", "saytools"], tmp_path,
               OTEL_TRACES_EXPORTER="console")
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stderr.splitlines()]  # every line is JSON
    logged = [x for x in lines if "level" in x]
    [said] = [x for x in logged if x["logger"] == "saga.tool.say"]
    run_id = said["run_id"]
    assert said["message"] == "saying hi" and said["level"] == "INFO"
    assert said["step_id"] == "hello" and said["attempt"] == 1
    assert said["time"].endswith("Z")
    [step] = [s for s in spans(ran.stderr) if s["name"] == "saga.step"]
    assert said["trace_id"] == trace_id(step)  # a log line finds its span
    assert said["span_id"] == step["context"]["span_id"].removeprefix("0x")
    assert any(x["message"] == f"run {run_id} (say)" for x in logged)


def test_text_log_lines_carry_the_run_too(tmp_path: Path) -> None:
    write_say(tmp_path)
    ran = saga(["run", "say.yaml", "--tools", "saytools", "--json"], tmp_path,
               SAGA_LOG_FORMAT="text", SAGA_LOG_LEVEL="INFO")
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    assert f"saga.tool.say: saying hi [run_id={run_id} step_id=hello attempt=1]" in ran.stderr


# -- in process ------------------------------------------------------------------------


def test_every_run_records_a_trace_id_and_children_share_it(lite: Saga,
                                                           tmp_path: Path) -> None:
    (tmp_path / "child.yaml").write_text("name: child\nsteps:\n  - {id: c, tool: noop}\n",
                                         encoding="utf-8")
    run = lite.run(lite.load({"name": "parent", "steps": [
        {"id": "nested", "use": str(tmp_path / "child.yaml")}]}))
    assert run.status == "completed"
    trace = run.context["trace_id"]
    assert len(trace) == 32 and "traceparent" not in run.context
    child = lite.get(run.outputs["nested"]["run_id"])
    assert child.context["trace_id"] == trace


def test_a_run_started_under_a_span_records_it(lite: Saga) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    run = lite.submit(lite.load({"name": "x", "steps": [{"id": "a", "tool": "noop"}]}),
                      context={"traceparent": parent})
    assert run.context["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
    assert run.context["traceparent"] == parent
    odd = lite.submit(lite.load({"name": "x", "steps": [{"id": "a", "tool": "noop"}]}),
                      context={"traceparent": "not-a-traceparent"})
    assert "traceparent" not in odd.context and len(odd.context["trace_id"]) == 32


def test_which_exporters_the_environment_asks_for() -> None:
    assert tracing.exporters({}) == []
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": "console"}) == ["console"]
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": "otlp, console"}) == ["otlp", "console"]
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": "none",
                              "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == []
    assert tracing.exporters({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == ["otlp"]
    assert tracing.exporters({"OTEL_TRACES_EXPORTER": "console",
                              "OTEL_SDK_DISABLED": "true"}) == []
    assert tracing.parse("00-" + "0" * 32 + "-b7ad6b7169203331-01") is None
    assert tracing.NOOP.child("x", {}) is tracing.NOOP and tracing.NOOP.traceparent is None


def test_a_scope_changes_only_what_it_names_and_is_undone_after_its_block() -> None:
    outer, span = scope.current(), tracing.Span()  # a span of its own, not the no-op
    with scope.scoped(run_id="r1", step_id=None, span=span) as run:
        assert (run.run_id, run.step_id, run.span) == ("r1", None, span)
        with pytest.raises(ValueError, match="inside"), \
                scope.scoped(step_id="s", iteration=2, attempt=1) as call:
            assert (call.run_id, call.step_id, call.iteration, call.attempt,
                    call.span) == ("r1", "s", 2, 1, span)
            assert scope.current() is call
            raise ValueError("inside the block")
        assert scope.current() is run
    assert scope.current() is outer
    with pytest.raises(TypeError, match="no colour"):
        scope.scoped(colour="red")
