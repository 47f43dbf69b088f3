"""Prometheus metrics of what this process records and sees (``prometheus_client``).

Off until :func:`enable` (``saga worker --metrics-port``, ``saga serve``'s ``/metrics``);
until then every function here returns at once and prometheus_client is not imported.
Counters count the events this process appended to the log (so summing over processes
counts each event once): a worker counts the attempts it made and the runs it finished,
whoever submitted them; the process that submits a run counts it started.

=========================================  ==============================================
``saga_runs_started_total{definition}``     ``RunStarted`` recorded
``saga_runs_finished_total{definition,      ``RunCompleted``/``RunFailed``/``RunCompensated``
status}``                                   /``RunCancelled`` recorded
``saga_step_attempts_total{tool}``          ``StepStarted`` recorded
``saga_step_failures_total{tool,            ``StepFailed`` recorded (``Interrupted`` for an
error_type}``                               attempt a dead worker left)
``saga_step_duration_seconds{tool,          how long each attempt this process made took
outcome}`` (histogram)
``saga_compensations_total{outcome}``       ``StepCompensated``/``CompensationFailed``
``saga_lease_takeovers_total{definition}``  ``RunTakenOver``: runs taken from a dead worker
``saga_queue_depth``                        runnable runs the worker's index sees now
``saga_projection_lag_events``              events the read model has not applied yet
``saga_resource_slots_in_use{resource}``    calls holding a slot of a resource now (all
                                            workers: read from the store at each scrape)
``saga_resource_waiters{resource}``         calls waiting for a slot of it now
``saga_resource_limit{resource}``           its ``concurrency`` (saga.toml ``[resources]``)
=========================================  ==============================================

plus the client's process and Python collectors (``process_*``, ``python_*``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from saga.errors import ConfigError

log = logging.getLogger("saga.telemetry")

_ENDINGS = {"RunCompleted": "completed", "RunFailed": "failed",
            "RunCompensated": "compensated", "RunCancelled": "cancelled"}
#: Seconds: from a fraction of a millisecond (an echo, a compute step) to ten minutes.
_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
            0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, math.inf)


class Metrics:
    """The metrics of this process, in a registry of their own."""

    def __init__(self) -> None:
        import prometheus_client as p

        p.disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series
        r = self.registry = p.CollectorRegistry()
        for collector in (p.ProcessCollector, p.PlatformCollector, p.GCCollector):
            collector(registry=r)
        self.runs_started = p.Counter("saga_runs_started", "Runs started (RunStarted "
                                      "recorded by this process).", ["definition"], registry=r)
        self.runs_finished = p.Counter("saga_runs_finished", "Runs ended, by status (the "
                                       "ending recorded by this process).",
                                       ["definition", "status"], registry=r)
        self.step_attempts = p.Counter("saga_step_attempts", "Step attempts started "
                                       "(StepStarted recorded).", ["tool"], registry=r)
        self.step_failures = p.Counter("saga_step_failures", "Failed step attempts "
                                       "(StepFailed recorded).", ["tool", "error_type"],
                                       registry=r)
        self.step_duration = p.Histogram("saga_step_duration_seconds", "How long step "
                                         "attempts took.", ["tool", "outcome"],
                                         buckets=_BUCKETS, registry=r)
        self.compensations = p.Counter("saga_compensations", "Compensations recorded, by "
                                       "outcome.", ["outcome"], registry=r)
        self.takeovers = p.Counter("saga_lease_takeovers", "Runs taken over from a worker "
                                   "that died with attempts in hand (RunTakenOver).",
                                   ["definition"], registry=r)
        self.queue_depth = p.Gauge("saga_queue_depth", "Runnable runs the worker's index "
                                   "sees.", registry=r)
        self.projection_lag = p.Gauge("saga_projection_lag_events", "Events the read model "
                                      "has not applied yet.", registry=r)
        self.projection_lag.set(math.nan)

    def watch_lag(self, lag: Callable[[], int]) -> None:
        """Read the projection lag from ``lag()`` at each scrape (NaN when it fails)."""
        def read() -> float:
            try:
                return float(lag())
            except Exception as e:  # a scrape must answer even when the store does not
                log.warning("projection lag unavailable: %s", e)
                return math.nan
        self.projection_lag.set_function(read)

    def watch_resources(self, usage: Callable[[], Mapping[str, tuple[int, int, int | None]]]
                        ) -> None:
        """Export each limited resource's slots in use, waiters and concurrency, read
        from ``usage()`` (``{name: (in_use, waiting, concurrency)}``, the store's view,
        shared by every worker) at each scrape; none when it fails."""
        from prometheus_client.core import GaugeMetricFamily

        class Resources:
            def collect(self) -> Iterable[Any]:
                families = [GaugeMetricFamily(name, text, labels=["resource"]) for name, text
                            in (("saga_resource_slots_in_use", "Calls holding a slot of the "
                                 "resource now, on every worker."),
                                ("saga_resource_waiters", "Calls waiting for a slot of the "
                                 "resource now, on every worker."),
                                ("saga_resource_limit", "The resource's concurrency limit."))]
                try:
                    found = usage()
                except Exception as e:  # a scrape must answer even when the store does not
                    log.warning("resource usage unavailable: %s", e)
                    found = {}
                for resource, values in sorted(found.items()):
                    for family, value in zip(families, values, strict=True):
                        if value is not None:
                            family.add_metric([resource], float(value))
                yield from families

        self.registry.register(Resources())

    def exposition(self) -> tuple[bytes, str]:
        """The metrics in the text format, and its content type."""
        import prometheus_client as p

        return p.generate_latest(self.registry), p.CONTENT_TYPE_LATEST

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` (any path, in fact) over HTTP from a thread; the server."""
        import prometheus_client as p

        server, _thread = p.start_http_server(port, addr=host, registry=self.registry)
        return server


_lock = threading.Lock()
_active: list[Metrics] = []


def enable() -> Metrics:
    """Turn metrics on for this process (once); ConfigError without prometheus_client."""
    with _lock:
        if not _active:
            try:
                _active.append(Metrics())
            except ImportError as e:
                raise ConfigError(f"metrics need prometheus_client ({e.name} is missing): "
                                  "pip install 'saga[metrics]'") from None
        return _active[0]


def active() -> Metrics | None:
    """This process's metrics, or None while they are off."""
    return _active[0] if _active else None


def recorded(definition: str, events: Iterable[Any],
             tool_of: Callable[[str], str] | None = None) -> None:
    """Count events this process just appended to a run of ``definition``;
    ``tool_of(step_id)`` names a step's tool."""
    if not _active:
        return
    m = _active[0]
    for e in events:
        kind = type(e).__name__
        if kind == "StepStarted":
            m.step_attempts.labels(_tool(tool_of, e)).inc()
        elif kind == "StepFailed":
            m.step_failures.labels(_tool(tool_of, e), e.error_type).inc()
        elif kind == "RunStarted":
            m.runs_started.labels(definition).inc()
        elif kind in _ENDINGS:
            m.runs_finished.labels(definition, _ENDINGS[kind]).inc()
        elif kind == "StepCompensated":
            m.compensations.labels("compensated").inc()
        elif kind == "CompensationFailed":
            m.compensations.labels("failed").inc()
        elif kind == "RunTakenOver":
            m.takeovers.labels(definition).inc()


def _tool(tool_of: Callable[[str], str] | None, event: Any) -> str:
    return tool_of(event.step_id) if tool_of is not None else "unknown"


def step_duration(tool: str, outcome: str, seconds: float) -> None:
    """Observe how long one attempt took."""
    if _active:
        _active[0].step_duration.labels(tool, outcome).observe(seconds)


def queue_depth(runnable: int) -> None:
    """Set how many runs the worker's index sees as runnable."""
    if _active:
        _active[0].queue_depth.set(runnable)
