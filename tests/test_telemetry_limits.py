"""Telemetry that costs little and says something: a dead OpenTelemetry collector holds
a command up for one short export at most, and the step-duration histogram sees steps
that take less than a millisecond."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from saga.api import Saga
from saga.telemetry import metrics, tracing


class _Down(BaseHTTPRequestHandler):
    """A collector that is there but cannot take anything: 503 to every export, the
    answer the exporter retries with backoff, counted."""

    posts: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        type(self).posts.append(self.path)
        self.send_response(503)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector() -> Iterator[str]:
    _Down.posts = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Down)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_failing_collector_gets_one_short_export_per_command(collector: str,
                                                               tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SAGA_", "OTEL_"))}
    env |= {"SAGA_HOME": str(tmp_path / ".saga"), "OTEL_EXPORTER_OTLP_ENDPOINT": collector}
    done = subprocess.run([sys.executable, "-m", "saga.cli", "run", "quickstart", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # the exporter's default (10 s) retried 4 times, at 0, 1, 3 and 7 s; within a 1 s
    # budget there is room for one retry at most (its first backoff is 1 s, +-20% jitter)
    assert _Down.posts and set(_Down.posts) == {"/v1/traces"}
    assert len(_Down.posts) <= 2, _Down.posts


def test_the_export_timeout_is_one_second_unless_the_environment_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    for name in ("OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing._otlp()._client._timeout == tracing.EXPORT_TIMEOUT == 1.0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "7")
    assert tracing._otlp()._client._timeout == 7.0


def test_the_step_duration_histogram_sees_sub_millisecond_steps(lite: Saga) -> None:
    pytest.importorskip("prometheus_client")
    observed = metrics.enable()
    steps = [{"id": f"s{i}", "compute": "result = 1"} for i in range(20)]
    lite.run({"name": "fast", "steps": steps})
    samples = {s.name + str(sorted(s.labels.items())): s.value
               for family in observed.registry.collect() for s in family.samples
               if s.name.startswith("saga_step_duration_seconds")
               and s.labels.get("tool") == "compute"}
    count = samples["saga_step_duration_seconds_count[('outcome', 'completed'), " \
                    "('tool', 'compute')]"]
    total = samples["saga_step_duration_seconds_sum[('outcome', 'completed'), " \
                    "('tool', 'compute')]"]
    assert count >= 20 and total > 0, samples
    fastest = samples["saga_step_duration_seconds_bucket[('le', '0.001'), " \
                      "('outcome', 'completed'), ('tool', 'compute')]"]
    assert fastest > 0, samples  # a bucket below a millisecond, and steps in it
