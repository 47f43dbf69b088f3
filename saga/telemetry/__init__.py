"""Observability: traces (:mod:`~saga.telemetry.tracing`, OpenTelemetry), metrics
(:mod:`~saga.telemetry.metrics`, Prometheus) and structured logs
(:mod:`~saga.telemetry.logs`), tied together by the :mod:`~saga.telemetry.scope` of the
code running now (which run, step and attempt, which span).

Each part is off until it is asked for (an ``OTEL_*`` exporter, ``--metrics-port`` or
``saga serve``, ``--log-format``), and then costs a function call that returns at once:
opentelemetry and prometheus_client are imported only when they are on. This package
imports nothing at its top, so the CLI can load :mod:`~saga.telemetry.logs` without the
rest.
"""
