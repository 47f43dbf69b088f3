"""What the code running now works on: the run, the step and attempt, the span.

The executor sets it (a drive: the run and its ``saga.run`` span; a call: the step,
iteration, attempt and the call's span) in a context variable, so it follows asyncio
tasks and, through :func:`contextvars.copy_context`, the threads tools run in. Log lines
read it (:mod:`saga.telemetry.logs`), a nested run records its span as its parent.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, fields
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


_FIELDS = frozenset(f.name for f in fields(Scope))
_CURRENT: contextvars.ContextVar[Scope] = contextvars.ContextVar(
    "saga_scope", default=Scope())  # noqa: B039 - a frozen dataclass, never mutated


def current() -> Scope:
    """The scope of the code running now."""
    return _CURRENT.get()


def scoped(**changes: Any) -> Scoped:
    """The current scope with ``changes`` while the block runs (in this task or thread)."""
    if not changes.keys() <= _FIELDS:
        raise TypeError(f"a scope has no {', '.join(sorted(changes.keys() - _FIELDS))}")
    return Scoped(changes)


class Scoped:
    """The block of :func:`scoped` (a class, not a generator: each step's call enters
    one, and contextlib's machinery and ``dataclasses.replace`` took 1.7 times as long)."""

    __slots__ = ("changes", "token")

    def __init__(self, changes: dict[str, Any]) -> None:
        self.changes = changes
        self.token: contextvars.Token[Scope] | None = None

    def __enter__(self) -> Scope:
        inner = Scope(**{**vars(_CURRENT.get()), **self.changes})
        self.token = _CURRENT.set(inner)
        return inner

    def __exit__(self, *_: object) -> None:
        assert self.token is not None
        _CURRENT.reset(self.token)
