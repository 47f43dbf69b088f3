"""Modules imported on first use, so that a command loads only what it touches.

``saga run flow.yaml`` needs neither networkx (only the graph form and the drawings do)
nor the audit, replay or schedule modules, which together took most of its start-up
time. A module names such a dependency at its top, where every import is::

    if TYPE_CHECKING:
        import networkx as nx
    else:
        nx = lazy("networkx")

and pays for the import when it first reads an attribute (``nx.DiGraph``). The stage and
cycle checks of tests/test_layers.py read ``lazy("saga....")`` as an import.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["lazy"]


class _LazyModule(types.ModuleType):
    """Stands for a module until an attribute is read, then forwards every read to it.

    The real module is imported by the ordinary machinery (thread-safe, one copy in
    ``sys.modules``); this object only holds its name, so a test that patches the real
    module is seen through it."""

    def __getattr__(self, attr: str) -> Any:
        # import_module, not sys.modules: it waits while another thread is importing it
        return getattr(importlib.import_module(self.__name__), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


def lazy(name: str) -> types.ModuleType:
    """The module ``name``, imported when one of its attributes is first read."""
    return _LazyModule(name)
