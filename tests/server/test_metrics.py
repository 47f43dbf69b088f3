"""``/metrics`` of a real ``saga serve``, behind the same tokens as the API, and the trace
context a submitting client passes."""

from __future__ import annotations

import time
from collections.abc import Callable

from tests.server.conftest import Server

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_metrics_count_what_the_service_records(make_server: Callable[..., Server]) -> None:
    server = make_server(SAGA_API_TOKEN="w-secret", SAGA_API_READ_TOKEN="r-secret")
    with server.client("w-secret") as c:
        answer = c.post("/api/v1/runs", json={"template": "quickstart"},
                        headers={"traceparent": CALLER})
        assert answer.status_code == 202, answer.text
        submitted = answer.json()
        assert submitted["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
        assert server.wait_for(c, submitted["run_id"])["status"] == "completed"
        history = c.get(f"/api/v1/runs/{submitted['run_id']}/events").json()
    started = next(e for e in history if e["type"] == "RunStarted")
    assert started["payload"]["context"]["traceparent"] == CALLER

    with server.client(None) as anonymous:
        assert anonymous.get("/metrics").status_code == 401
    with server.client("r-secret") as reader:  # a read token is enough to scrape
        deadline = time.monotonic() + 30
        while True:
            page = reader.get("/metrics")
            assert page.status_code == 200, page.text
            if 'saga_runs_finished_total{definition="quickstart",status="completed"} 1.0' \
                    in page.text:
                break
            assert time.monotonic() < deadline, page.text
            time.sleep(0.1)
    assert page.headers["content-type"].startswith("text/plain")
    text = page.text
    assert 'saga_runs_started_total{definition="quickstart"} 1.0' in text
    assert 'saga_step_attempts_total{tool="echo"} 2.0' in text  # reserve, charge
    assert 'saga_step_attempts_total{tool="compute"} 1.0' in text  # confirm
    assert "saga_queue_depth " in text
    lag = next(line for line in text.splitlines()
               if line.startswith("saga_projection_lag_events "))
    assert float(lag.split()[1]) >= 0
