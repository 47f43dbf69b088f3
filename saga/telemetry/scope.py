"""What the code running now works on: the run, the step and attempt, the span.

The executor sets it (a drive: the run and its ``saga.run`` span; a call: the step,
iteration, attempt and the call's span) in a context variable, so it follows asyncio
tasks and, through :func:`contextvars.copy_context`, the threads tools run in. Log lines
read it (:mod:`saga.telemetry.logs`), a nested run records its span as its parent.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from saga.telemetry.tracing import NOOP, Span


@dataclass(frozen=True)
class Scope:
    """The run, step and span of the code running now (None where not known)."""

    run_id: str | None = None
    step_id: str | None = None
    iteration: int | None = None
    attempt: int | None = None
    span: Span = NOOP


_CURRENT: contextvars.ContextVar[Scope] = contextvars.ContextVar(
    "saga_scope", default=Scope())  # noqa: B039 - a frozen dataclass, never mutated


def current() -> Scope:
    """The scope of the code running now."""
    return _CURRENT.get()


@contextlib.contextmanager
def scoped(**changes: Any) -> Iterator[Scope]:
    """The current scope with ``changes`` while the block runs (in this task or thread)."""
    token = _CURRENT.set(replace(_CURRENT.get(), **changes))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)
