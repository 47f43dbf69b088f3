"""The package reads as the data flow: no module imports from a stage above its own, the
import graph has no cycle, and imports are at module level except optional drivers.

The stages, top to bottom (DESIGN.md §2). A module may import its own package, and any
module of its own stage or a stage below; never one above. ``TYPE_CHECKING`` imports are
for annotations only and are not counted.

A module that loads another on first use (``x = lazy("saga.x")``, :mod:`saga.lazy`, so that
``saga run`` does not import what it never touches) still names it at its top, and that
name counts as an import here, for the stages and for cycles alike: laziness changes
when a module loads, not which modules may depend on which. ``lazy()`` inside a function
is a deferred import like any other.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "saga"

STAGES: list[set[str]] = [
    {"saga.cli", "saga.server", "saga.__main__", "saga"},
    {"saga.report"},
    {"saga.api"},
    {"saga.worker", "saga.schedules"},
    {"saga.executor", "saga.replay"},
    {"saga.scheduler", "saga.audit", "saga.projection", "saga.views"},
    {"saga.tools", "saga.composition", "saga.store", "saga.diagram"},
    {"saga.secrets", "saga.config", "saga.expressions", "saga.domain", "saga.telemetry"},
    {"saga.errors", "saga.chain", "saga.lazy"},
]
#: Third-party modules a function may import when it first needs them: drivers and
#: optional extras, so that importing saga (and starting the CLI) loads none of them.
OPTIONAL_DRIVERS = {"psycopg", "psycopg_pool", "mcp", "anyio", "rich", "uvicorn", "fastapi",
                    "starlette", "httpx", "opentelemetry", "prometheus_client", "croniter",
                    "signal"}


def module_name(path: Path) -> str:
    """``saga/executor/drive.py`` -> ``saga.executor.drive``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def stage_of(module: str) -> int:
    """The stage a module belongs to: that of its longest listed prefix."""
    best, found = -1, None
    for level, names in enumerate(STAGES):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), level
    assert found is not None, f"{module} is in no stage: add it to STAGES"
    return found


def _type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name | ast.Attribute) and \
        ast.unparse(node.test).endswith("TYPE_CHECKING")


def _lazy_target(node: ast.AST) -> str | None:
    """``"saga.x"`` for a call ``lazy("saga.x")``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
            and node.func.id == "lazy" and len(node.args) == 1 \
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def imports(path: Path) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(module-level saga imports, imports inside functions), each with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: list[tuple[str, int]] = []
    nested: list[tuple[str, int]] = []

    def names(node: ast.Import | ast.ImportFrom) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        base = node.module or ""
        if node.level:  # relative: resolve against this module's package
            package = module_name(path).rsplit(".", node.level - (path.stem == "__init__"))[0]
            base = f"{package}.{base}" if base else package
        # `from saga import audit` imports the module saga.audit, not just the package
        return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                for a in node.names]

    def visit(children: list[ast.AST], inside: bool) -> None:
        for child in children:
            if isinstance(child, ast.If) and _type_checking(child):
                visit(list(child.orelse), inside)  # `else: x = lazy("saga.x")`
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                (nested if inside else top).extend((n, child.lineno) for n in names(child))
            if (target := _lazy_target(child)) is not None:
                (nested if inside else top).append((target, child.lineno))
            visit(list(ast.iter_child_nodes(child)),
                  inside or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))
    visit([tree], False)
    return top, nested


MODULES = {module_name(p) for p in PACKAGE.rglob("*.py")}
FILES = sorted(PACKAGE.rglob("*.py"))


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else module


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_name(p))
def test_no_import_points_up(path: Path) -> None:
    here = module_name(path)
    for target, line in imports(path)[0]:
        if not target.startswith("saga") or (target == "saga" and here != "saga"):
            assert target != "saga" or here in ("saga", "saga.__main__"), \
                f"{path}:{line} imports the package root (import the stage instead)"
            continue
        if _package(target) == _package(here):
            continue  # a package may use its own modules
        assert stage_of(target) >= stage_of(here), \
            f"{path}:{line}: {here} imports {target}, a stage above it"


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_name(p))
def test_no_deferred_import(path: Path) -> None:
    for target, line in imports(path)[1]:
        root = target.split(".")[0]
        assert root in OPTIONAL_DRIVERS or target.startswith("saga.server"), \
            f"{path}:{line} imports {target} inside a function; import it at the top " \
            "(only optional drivers may load late)"


def test_the_import_graph_has_no_cycle() -> None:
    graph = nx.DiGraph()
    for path in FILES:
        here = module_name(path)
        graph.add_node(here)
        for target, _ in imports(path)[0]:
            if target in MODULES and target != here and not here.startswith(target + "."):
                graph.add_edge(here, target)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:3]}"


def test_the_layering_test_catches_an_upward_import(tmp_path: Path) -> None:
    """The checks above can fail: a scheduler module importing the executor is caught."""
    bad = PACKAGE / "scheduler" / f"_layering_probe_{os.getpid()}.py"
    bad.write_text("from saga.executor import Executor\n", encoding="utf-8")
    try:
        with pytest.raises(AssertionError, match="a stage above it"):
            test_no_import_points_up(bad)
    finally:
        bad.unlink()
    lazy = PACKAGE / "scheduler" / f"_layering_probe_lazy_{os.getpid()}.py"
    lazy.write_text("from typing import TYPE_CHECKING\nfrom saga.lazy import lazy\n"
                    "if TYPE_CHECKING:\n    from saga import executor\n"
                    "else:\n    executor = lazy('saga.executor')\n", encoding="utf-8")
    try:
        assert ("saga.executor", 6) in imports(lazy)[0]
        with pytest.raises(AssertionError, match="a stage above it"):
            test_no_import_points_up(lazy)
    finally:
        lazy.unlink()
    nested = tmp_path / "probe.py"
    nested.write_text("def f():\n    import saga.api\n    return lazy('saga.views')\n",
                      encoding="utf-8")
    assert imports(nested)[1] == [("saga.api", 2), ("saga.views", 3)]


def test_no_module_is_over_600_lines() -> None:
    long = {module_name(p): n for p in FILES
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, f"split these modules: {long}"
