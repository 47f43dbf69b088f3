"""Traces: OpenTelemetry spans of run drives (``saga.run``), step attempts (``saga.step``)
and compensations (``saga.compensate``), when an exporter is configured.

Configuration is OpenTelemetry's own environment: ``OTEL_TRACES_EXPORTER`` (``otlp``,
``console``, ``none``, or a comma-separated list), ``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (an endpoint alone means ``otlp``) and the
exporter's other ``OTEL_EXPORTER_OTLP_*`` settings, ``OTEL_SERVICE_NAME`` (default
``saga``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``, ``OTEL_SDK_DISABLED``.
With no exporter (or without the ``otel`` extra) no span is made, opentelemetry is never
imported, and every handle is :data:`NOOP`. ``console`` writes one JSON span per line to
stderr (stdout is the commands' data); ``otlp`` sends batches over HTTP/protobuf.

One run is one trace, whichever processes drive it. ``RunStarted`` records the run's
``trace_id`` in its context (and a ``traceparent`` when the run started inside a span:
a nested run under its parent's step, or an API request that carried one). Each drive's
``saga.run`` span is a child of that ``traceparent``, or else a root span with the
recorded trace id; so a run resumed by another worker hours later joins the same trace.
A run recorded before trace ids were has its UUID as its trace id.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import Any

log = logging.getLogger("saga.telemetry")

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
#: The trace id the next root span takes (set around starting a drive's span).
_FORCED: contextvars.ContextVar[int | None] = contextvars.ContextVar("saga_trace_id",
                                                                    default=None)


def parse(traceparent: Any) -> tuple[str, str, int] | None:
    """``(trace_id, span_id, flags)`` of a W3C ``traceparent`` (version 00), or None."""
    if not isinstance(traceparent, str):
        return None
    found = _TRACEPARENT.match(traceparent.strip().lower())
    if found is None or found[1] == _ZERO_TRACE or found[2] == _ZERO_SPAN:
        return None
    return found[1], found[2], int(found[3], 16)


def trace_context(traceparent: str | None = None,
                  trace_id: str | None = None) -> dict[str, str]:
    """What a new run records in its context: ``trace_id``, and ``traceparent`` when it
    starts inside a span. Without a valid ``traceparent``, the given ``trace_id`` (a
    parent run's) or a new random one."""
    parsed = parse(traceparent)
    if parsed is not None:
        return {"trace_id": parsed[0],
                "traceparent": f"00-{parsed[0]}-{parsed[1]}-{parsed[2]:02x}"}
    if isinstance(trace_id, str) and _TRACE_ID.match(trace_id) and trace_id != _ZERO_TRACE:
        return {"trace_id": trace_id}
    return {"trace_id": os.urandom(16).hex()}  # as secrets.token_hex, without its imports


def exporters(env: Mapping[str, str] | None = None) -> list[str]:
    """The span exporters the environment asks for (empty: tracing is off)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = env.get("OTEL_TRACES_EXPORTER")
    if raw is None or not raw.strip():
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or \
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    return [] if "none" in names else list(dict.fromkeys(names))


class Span:
    """A span handle. This one (:data:`NOOP`) does nothing: tracing is off."""

    traceparent: str | None = None

    def child(self, name: str, attributes: Mapping[str, Any]) -> Span:
        """A span under this one (here: this no-op handle again)."""
        return self

    def end(self, outcome: str, error_type: str | None = None, message: str = "",
            **attributes: Any) -> None:
        """End the span with ``saga.outcome`` (and an error status when ``error_type``)."""

    @property
    def ids(self) -> tuple[str, str] | None:
        """``(trace_id, span_id)`` for log lines, or None."""
        parsed = parse(self.traceparent)
        return None if parsed is None else (parsed[0], parsed[1])


NOOP = Span()


class _Live(Span):
    """A recording OpenTelemetry span."""

    def __init__(self, tracer: Any, span: Any) -> None:
        self._tracer, self._span, self._ended = tracer, span, False
        c = span.get_span_context()
        self.traceparent = f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"

    def child(self, name: str, attributes: Mapping[str, Any]) -> Span:
        from opentelemetry import trace

        parent = trace.set_span_in_context(self._span)
        return _Live(self._tracer, self._tracer.start_span(name, context=parent,
                                                           attributes=_clean(attributes)))

    def end(self, outcome: str, error_type: str | None = None, message: str = "",
            **attributes: Any) -> None:
        if self._ended:
            return
        self._ended = True
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attributes(_clean({"saga.outcome": outcome, **{
            f"saga.{k}": v for k, v in attributes.items()}}))
        if error_type:
            self._span.set_attribute("saga.error_type", error_type)
            self._span.set_status(Status(StatusCode.ERROR, f"{error_type}: {message}"[:500]))
        self._span.end()


def _clean(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Attributes OpenTelemetry accepts: no None, plain values."""
    return {k: v if isinstance(v, str | bool | int | float) else str(v)
            for k, v in attributes.items() if v is not None}


_lock = threading.Lock()
_tracer: list[Any] = []  # [the tracer, or None when tracing is off], once configured


def tracer() -> Any:
    """The tracer saga's spans come from, or None when tracing is off (decided once per
    process, from the environment, the first time a run is driven)."""
    if not _tracer:
        with _lock:
            if not _tracer:
                _tracer.append(_build(exporters()))
    return _tracer[0]


def enabled() -> bool:
    """True when spans are made and exported."""
    return tracer() is not None


def start_run(run_id: str, definition: str, context: Mapping[str, Any], fallback: str,
              worker: str | None) -> Span:
    """The ``saga.run`` span of one drive of a run, in the run's trace (see the module's
    doc; ``fallback`` is the trace id of a run that recorded none)."""
    t = tracer()
    if t is None:
        return NOOP
    from opentelemetry import trace
    from opentelemetry.context import Context

    attributes = _clean({"saga.run_id": run_id, "saga.definition": definition,
                         "saga.worker": worker})
    parsed = parse(context.get("traceparent"))
    if parsed is not None:
        remote = trace.SpanContext(int(parsed[0], 16), int(parsed[1], 16), is_remote=True,
                                   trace_flags=trace.TraceFlags(parsed[2]))
        parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        return _Live(t, t.start_span("saga.run", context=parent, attributes=attributes))
    recorded = trace_context(None, context.get("trace_id") or fallback)["trace_id"]
    token = _FORCED.set(int(recorded, 16))
    try:  # a root span (an empty context: no parent) that takes the run's trace id
        return _Live(t, t.start_span("saga.run", context=Context(), attributes=attributes))
    finally:
        _FORCED.reset(token)


#: Seconds one export of spans may take, retries included (see :func:`_otlp`).
EXPORT_TIMEOUT = 1.0


def _build(names: list[str]) -> Any:
    """A tracer exporting to ``names``, or None (no exporter, or no otel extra)."""
    if not names:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    except ImportError as e:
        log.warning("OTEL_TRACES_EXPORTER asks for %s, but the otel extra is not installed "
                    "(%s is missing): pip install 'saga[otel]'; no traces",
                    ",".join(names), e.name)
        return None

    class RunTraceIds(RandomIdGenerator):
        """Random ids, except the trace id of a drive's root span: its run's."""

        def generate_trace_id(self) -> int:
            return _FORCED.get() or super().generate_trace_id()

    resource = Resource.create({})
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "saga"}))
    provider = TracerProvider(resource=resource, id_generator=RunTraceIds())
    for name in names:
        if name == "console":
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
                out=sys.stderr, formatter=lambda span: span.to_json(indent=None) + "\n")))
        elif name == "otlp":
            provider.add_span_processor(BatchSpanProcessor(_otlp()))
        else:
            log.warning("OTEL_TRACES_EXPORTER: unknown exporter %r ignored "
                        "(otlp, console or none)", name)
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)  # tools' own instrumentation joins the trace
    return provider.get_tracer("saga")


def _otlp() -> Any:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or \
        os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    if protocol != "http/protobuf":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: saga exports traces over "
                    "http/protobuf only", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    # The exporter's own default (10 s, retried with backoff) made every CLI command wait
    # 8 s at exit while the collector was down; a span export never holds a command up
    # longer than EXPORT_TIMEOUT unless the OTEL_ timeout variables say otherwise.
    given = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or \
        os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    return OTLPSpanExporter(timeout=None if given else EXPORT_TIMEOUT)
