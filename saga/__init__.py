"""saga: a durable saga executor on an event-sourced log.

The public API: :class:`Saga` to load, run and inspect compositions; :func:`tool` to
register Python functions as tools; the error hierarchy rooted in :class:`SagaError`.
"""

from saga.api import Saga
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
from saga.tools import Tool, ToolContext, tool
from saga.views import run_summary

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
