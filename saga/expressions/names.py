"""The names a condition or compute block reads before it binds them (what a step's
``compute`` depends on), found statically."""

from __future__ import annotations

import ast
import textwrap

from saga.errors import ExpressionError
from saga.expressions.interpreter import _CONSTANTS, _SAFE_BUILTINS, _parse


class _FreeNames(ast.NodeVisitor):
    """Names read before the block binds them; comprehension targets stay local."""

    def __init__(self) -> None:
        self.free: set[str] = set()
        self.bound: set[str] = set()

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.bound.add(node.id)
        elif node.id not in self.bound:
            self.free.add(node.id)

    def visit_Assign(self, node: ast.Assign | ast.AugAssign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) \
                and node.target.id not in self.bound:
            self.free.add(node.target.id)  # `x += 1` reads x first
        for child in (node.value, *targets):
            if child is not None:
                self.visit(child)

    visit_AugAssign = visit_AnnAssign = visit_Assign

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.bound |= {alias.asname or alias.name for alias in node.names}

    visit_ImportFrom = visit_Import

    def visit_For(self, node: ast.For) -> None:
        for child in (node.iter, node.target, *node.body, *node.orelse):
            self.visit(child)

    def visit_ListComp(self, node: ast.ListComp | ast.SetComp | ast.DictComp
                       | ast.GeneratorExp) -> None:
        outer = set(self.bound)
        for generator in node.generators:
            for child in (generator.iter, generator.target, *generator.ifs):
                self.visit(child)
        for child in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
            self.visit(child)
        self.bound = outer

    visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp


def _free_names(source: str, mode: str) -> set[str]:
    tree, problems = _parse(source, mode)
    if tree is None:
        raise ExpressionError(f"{problems[0]} in {source!r}", source)
    finder = _FreeNames()
    finder.visit(tree)
    return finder.free - set(_SAFE_BUILTINS) - set(_CONSTANTS)


def _compute_source(code: str) -> str:
    return textwrap.dedent(code).strip()
