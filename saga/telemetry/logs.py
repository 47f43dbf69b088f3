"""Log lines: plain text, or one JSON object per line (``saga --log-format json``).

Every line says when, how bad, which logger and what; and, when the line was written
while the executor worked on a run (a tool's ``ctx.logger``, the executor's own lines,
a library the tool called), the run, step, iteration and attempt, and with tracing on
the trace and span ids, read from the current :mod:`~saga.telemetry.scope`.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from saga.telemetry import scope

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
#: Names :meth:`logging.Logger.info` and friends accept in ``extra=`` that a JSON line
#: carries as they are.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message", "asctime", "taskName"}


def context_of(record: logging.LogRecord) -> dict[str, Any]:
    """What the line is about: run, step, iteration, attempt, trace and span ids."""
    now = scope.current()
    fields: dict[str, Any] = {"run_id": now.run_id, "step_id": now.step_id,
                              "iteration": now.iteration, "attempt": now.attempt}
    ids = now.span.ids
    if ids is not None:
        fields["trace_id"], fields["span_id"] = ids
    for key, value in vars(record).items():  # extra={...} wins over the scope
        if key not in _RECORD_FIELDS and not key.startswith("_"):
            fields[key] = value
    return {k: v for k, v in fields.items() if v is not None}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, then the
    run, step, ... it is about, and ``exception`` with a traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
            **context_of(record)}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message [run=... step=...]``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        about = context_of(record)
        tags = " ".join(f"{k}={about[k]}" for k in ("run_id", "step_id", "attempt")
                        if k in about)
        if not tags:
            return text
        first, newline, rest = text.partition("\n")
        return f"{first} [{tags}]{newline}{rest}"


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """saga's handler on the root logger (replaced, never stacked, when configured
    again)."""


def configure(fmt: str = "text", level: str | None = None) -> None:
    """Send log records at ``level`` and above (default ``info`` for JSON, ``warning``
    for text) to stderr in format ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel((level or ("info" if fmt == "json" else "warning")).upper())


def configured() -> bool:
    """True once :func:`configure` set saga's handler up."""
    return any(isinstance(h, _Handler) for h in logging.getLogger().handlers)


def is_json() -> bool:
    """True when log lines are JSON (what a command's notes on stderr should be too)."""
    return any(isinstance(h, _Handler) and isinstance(h.formatter, JsonFormatter)
               for h in logging.getLogger().handlers)
