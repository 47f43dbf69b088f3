"""Tools: named callables ``(params, ctx) -> JSON value``, their registry and loading.

A tool is registered with :func:`tool` (a decorator), from the ``saga.tools``
entry-point group, or by importing a module named with ``--tools``, ``SAGA_TOOLS`` or
``saga.toml``. Built-ins are always present: ``noop``, ``echo``, ``sleep``, ``fail``
(:mod:`saga.tools.builtin`) and the adapters that reach real systems, ``shell``,
``http``, ``sql``, ``file`` and ``git`` (one module each). Tools on MCP servers declared
in ``saga.toml`` are addressed as ``mcp.SERVER.TOOL`` (:mod:`saga.tools.mcp`).
"""

from saga.tools.base import (
    DECORATED,
    UNDO,
    ParamSchema,
    Registry,
    Tool,
    ToolContext,
    ToolFunc,
    tool,
)
from saga.tools.loading import import_modules, load_registry, modules_of

__all__ = ["DECORATED", "UNDO", "ParamSchema", "Registry", "Tool", "ToolContext", "ToolFunc",
           "import_modules", "load_registry", "modules_of", "tool"]
