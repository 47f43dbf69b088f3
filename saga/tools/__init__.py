"""Tools: named callables ``(params, ctx) -> JSON value``, their registry and loading.

A tool is registered with :func:`tool` (a decorator), from the ``saga.tools``
entry-point group, or by importing a module named with ``--tools``, ``SAGA_TOOLS`` or
``saga.toml``. Built-ins live in :mod:`saga.tools.builtin` and are always present.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from saga.errors import ConfigError, UnknownToolError

ToolFunc = Callable[..., Any]


@dataclass(frozen=True)
class ToolContext:
    """What a tool knows about the call it serves.

    Attributes:
        run_id: the run's id.
        step_id: the step being executed.
        iteration: the loop iteration (0 outside loops).
        attempt: 1 for the first attempt, 2 for the first retry, ...
        idempotency_key: ``run_id:step_id:iteration``, the same on every attempt and on
            re-execution after a crash, so a tool can deduplicate its effect.
        deadline: the wall-clock time (epoch seconds) after which the attempt is cancelled,
            or None.
        logger: a logger named after the run and step.
    """

    run_id: str
    step_id: str
    iteration: int
    attempt: int
    idempotency_key: str
    deadline: float | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("saga.tool"))


@dataclass(frozen=True)
class Tool:
    """A registered tool: the function, its optional compensation, where it came from."""

    name: str
    func: ToolFunc
    compensate: ToolFunc | None = None
    description: str = ""
    source: str = "python"

    @property
    def is_async(self) -> bool:
        """True when calling the function returns a coroutine."""
        return inspect.iscoroutinefunction(self.func)


class Registry:
    """Tools by name."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {t.name: t for t in tools}

    def add(self, tool: Tool) -> Tool:
        """Register a tool (a later registration of the same name replaces the earlier)."""
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool:
        """The tool with this name, or UnknownToolError."""
        try:
            return self._tools[name]
        except KeyError:
            raise UnknownToolError(f"unknown tool {name!r}") from None

    def tools(self) -> dict[str, Tool]:
        """Every registered tool by name (what validation checks steps against)."""
        return dict(self._tools)

    def names(self) -> set[str]:
        """Every registered tool name."""
        return set(self._tools)

    def __iter__(self) -> Any:
        return iter(sorted(self._tools.values(), key=lambda t: t.name))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def copy(self) -> Registry:
        """A registry with the same tools that can be extended separately."""
        return Registry(self._tools.values())


#: Tools registered with the :func:`tool` decorator anywhere in the process.
DECORATED = Registry()


def tool(name: str, *, compensate: ToolFunc | None = None,
         description: str | None = None) -> Callable[[ToolFunc], ToolFunc]:
    """Register a Python function as a tool.

    Example::

        from saga import tool

        @tool("greet")
        def greet(params: dict, ctx) -> dict:
            return {"message": f"hello {params['name']}", "key": ctx.idempotency_key}
    """

    def register(func: ToolFunc) -> ToolFunc:
        doc = description if description is not None else (inspect.getdoc(func) or "")
        DECORATED.add(Tool(name, func, compensate, doc.split("\n")[0], f"python:{func.__module__}"))
        return func

    return register


def import_modules(modules: Iterable[str]) -> None:
    """Import modules of tools (their ``@tool`` decorators register them).

    The working directory is importable, as it is for ``python -m``, so ``--tools mytools``
    finds ``./mytools.py`` when saga runs from its console script.
    """
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    for module in modules:
        module = module.strip()
        if not module:
            continue
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"cannot import tools module {module!r}: {e}") from e


def load_registry(modules: Iterable[str] = ()) -> Registry:
    """Built-ins, entry-point tools and decorated tools (after importing ``modules``)."""
    from saga.tools import builtin

    import_modules(modules)
    registry = Registry(builtin.TOOLS)
    for ep in entry_points(group="saga.tools"):
        try:
            loaded = ep.load()
        except Exception as e:  # a broken plugin must not hide the others
            raise ConfigError(f"cannot load tool entry point {ep.name!r}: {e}") from e
        if isinstance(loaded, Tool):
            registry.add(loaded)
        elif callable(loaded):
            registry.add(Tool(ep.name, loaded, source=f"entry-point:{ep.value}"))
    for t in DECORATED:
        registry.add(t)
    return registry
