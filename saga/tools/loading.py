"""Loading tools: built-ins, MCP servers, entry points and modules of decorated tools."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any

from saga.config import Settings
from saga.errors import ConfigError
from saga.tools import builtin, mcp
from saga.tools.base import DECORATED, Registry, Tool


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


def modules_of(names: Iterable[str], registry: Registry) -> list[str]:
    """The Python modules that define these tools (``--tools`` modules, saga.toml's
    ``tools``): what another process must import to call them. Built-in, entry-point and
    MCP tools are found without one; a script's own tools (``__main__``) have none."""
    modules = set()
    for name in names:
        source = registry.get(name).source if name in registry else ""
        module = source.removeprefix("python:") if source.startswith("python:") else ""
        if module and module != "__main__":
            modules.add(module)
    return sorted(modules)


def load_registry(modules: Iterable[str] = (), settings: Settings | None = None) -> Registry:
    """Built-ins, MCP servers' tools, entry-point tools and decorated tools (after
    importing ``modules``).

    ``settings`` supplies ``saga.toml`` (``Settings.file``): the shell allowlist, SQL
    connections, file limits and ``[mcp.servers.NAME]``. Without it built-ins use their
    defaults plus the environment (``SAGA_SHELL_ALLOW``) and no MCP server is declared.
    """
    config: Mapping[str, Any] = settings.file if settings is not None else {}
    import_modules(modules)
    registry = Registry(builtin.builtin_tools(config),
                        [*mcp.providers(config), EntryPointTools()])
    for t in DECORATED:
        registry.add(t)
    return registry


class EntryPointTools:
    """The tools installed packages publish in the ``saga.tools`` entry-point group: a
    provider the registry asks on the first name no other tool has, or when every tool
    is listed. Reading every installed package's entry points took 2–3 ms of every
    command here (11 ms in a process that had not read them yet), though most commands
    name only built-in tools. A name a built-in, decorated or MCP tool already has stays
    theirs: an installed package cannot replace a built-in tool behind its user's back."""

    prefix = ""  # any name may be an entry point's

    def load(self) -> list[Tool]:
        """The group's tools (ConfigError names an entry point that cannot be loaded)."""
        tools: list[Tool] = []
        for ep in entry_points(group="saga.tools"):
            try:
                loaded = ep.load()
            except Exception as e:  # a broken plugin must not hide the others
                raise ConfigError(f"cannot load tool entry point {ep.name!r}: {e}") from e
            if isinstance(loaded, Tool):
                tools.append(loaded)
            elif callable(loaded):
                tools.append(Tool(ep.name, loaded, source=f"entry-point:{ep.value}"))
        return tools
