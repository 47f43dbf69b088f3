"""saga: a durable saga executor on an event-sourced log.

The public API: :class:`Saga` to load, run and inspect compositions; :func:`tool` to
register Python functions as tools; the error hierarchy rooted in :class:`SagaError`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from saga.errors import (
    ConcurrentWriteError,
    ConfigError,
    DefinitionError,
    ExpressionError,
    InputError,
    Problem,
    RunNotFoundError,
    RunStateError,
    SagaError,
    StoreUnavailableError,
    ToolError,
    UnknownToolError,
)

if TYPE_CHECKING:
    from saga.api import Saga
    from saga.tools import Tool, ToolContext, tool
    from saga.views import run_summary

#: Names loaded on first use: ``import saga`` (and so every CLI command's start-up) does not
#: pay for the engine, the store and the tools until they are used.
_LAZY = {"Saga": "saga.api", "Tool": "saga.tools", "ToolContext": "saga.tools",
         "tool": "saga.tools", "run_summary": "saga.views"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'saga' has no attribute {name!r}")

__all__ = [
    "ConcurrentWriteError",
    "ConfigError",
    "DefinitionError",
    "ExpressionError",
    "InputError",
    "Problem",
    "RunNotFoundError",
    "RunStateError",
    "Saga",
    "SagaError",
    "StoreUnavailableError",
    "Tool",
    "ToolContext",
    "ToolError",
    "UnknownToolError",
    "run_summary",
    "tool",
]
