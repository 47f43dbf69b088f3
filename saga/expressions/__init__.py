"""Templates, conditions and compute blocks: every place where user text is evaluated.

Compositions are written by users in YAML/JSON, so each ``{{ ... }}`` template, each
``condition`` and each ``compute`` block is untrusted text. None of it ever reaches
Python's ``eval``/``exec``:

* templates are rendered by Jinja2's immutable sandbox, with strict undefined names,
  almost no globals, and size-checked ``*``/``**``/``%``;
* conditions and compute blocks are parsed with :func:`ast.parse`, checked against a
  whitelist of syntax, and run by :class:`_Interpreter`, which walks the tree itself. Only
  whitelisted names, builtins and methods exist and no attribute starting with ``_`` does.
  Each node visited costs one step of a bounded budget, and operations that could allocate
  without bound are size-checked before they run. Namespace values are deep-copied on
  first read, so user code can never mutate the caller's data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from saga.errors import ExpressionError
from saga.expressions.interpreter import _parse, _plain_result, _run
from saga.expressions.limits import DEFAULT_MAX_STEPS, DEFAULT_SECONDS, configure, time_limit
from saga.expressions.markers import _template_strings, _whole_template, is_template
from saga.expressions.names import _compute_source, _free_names
from saga.lazy import lazy

# Jinja2 loads with the first template: plain values and conditions never need it.
if TYPE_CHECKING:
    from jinja2 import exceptions, meta, nodes

    from saga.expressions import jinja
else:
    exceptions, meta, nodes = lazy("jinja2.exceptions"), lazy("jinja2.meta"), lazy("jinja2.nodes")
    jinja = lazy("saga.expressions.jinja")

__all__ = [
    "DEFAULT_MAX_STEPS",
    "DEFAULT_SECONDS",
    "check_compute",
    "check_expression",
    "check_template",
    "compute_references",
    "configure",
    "evaluate",
    "expression_references",
    "is_template",
    "references",
    "render",
    "run_compute",
    "time_limit",
]


def render(value: Any, namespace: Mapping[str, Any]) -> Any:
    """Render every template in ``value`` (recursing into dicts, their string keys, and lists).

    A string that is exactly one ``{{ expr }}`` yields the expression's native value (a dict
    stays a dict); any other templated string renders to a string; everything else is
    returned unchanged. Keys always render to strings. Raises ExpressionError on a missing
    name or attribute, a syntax error, or anything the sandbox refuses.
    """
    if isinstance(value, str):
        return jinja._render_string(value, namespace) if is_template(value) else value
    if isinstance(value, dict):
        rendered: dict[Any, Any] = {}
        for key, item in value.items():
            if is_template(key):
                with jinja._template_errors(key):
                    rendered[jinja._text_template(key).render(dict(namespace))] = \
                        render(item, namespace)
            else:
                rendered[key] = render(item, namespace)
        return rendered
    if isinstance(value, list | tuple):
        items = [render(item, namespace) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def evaluate(expression: str, namespace: Mapping[str, Any], *,
             max_steps: int = DEFAULT_MAX_STEPS, seconds: float | None = None) -> Any:
    """Evaluate a condition (one Python-like expression) with the sandboxed interpreter.

    A condition that is a whole ``{{ ... }}`` template is rendered instead; a non-string
    (e.g. a YAML ``true``) is returned unchanged. Raises ExpressionError on anything refused,
    undefined or failing, and past ``max_steps`` evaluated nodes.
    """
    if not isinstance(expression, str):
        return expression
    if _whole_template(expression):
        return render(expression, namespace)
    source = expression.strip()
    return _plain_result(_run(source, "eval", namespace, max_steps, seconds)[0], source,
                         f"condition {source!r}")


def run_compute(code: str, namespace: Mapping[str, Any], *,
                max_steps: int = DEFAULT_MAX_STEPS, seconds: float | None = None) -> Any:
    """Run a compute block and return what it bound to ``result``.

    The block is dedented, checked against the whitelist, then run statement by statement
    in a fresh local scope over (deep copies of) the namespace, which is never mutated.
    Raises ExpressionError when refused, failing, or if ``result`` is unset, and
    ExpressionLimit past its budget: ``max_steps`` nodes, or ``seconds`` (default, and at
    most, the configured ``expression_seconds``).
    """
    source = _compute_source(code)
    scope = _run(source, "exec", namespace, max_steps, seconds)[1]
    if "result" not in scope:
        raise ExpressionError("compute block did not assign 'result'", source)
    return _plain_result(scope["result"], source, "the compute block's result")


def references(value: Any) -> set[str]:
    """Root names the templates in ``value`` read (recursing into dicts, keys and lists)."""
    names: set[str] = set()
    for source in _template_strings(value):
        with jinja._template_errors(source):
            names |= meta.find_undeclared_variables(jinja._ENV.parse(source))
    return names - set(jinja._ENV.globals) if names else names


def expression_references(expression: str) -> set[str]:
    """Free names a condition reads, safe builtins left out; templates via :func:`references`."""
    if not isinstance(expression, str):
        return set()
    if _whole_template(expression):
        return references(expression)
    return _free_names(expression.strip(), "eval")


def compute_references(code: str) -> set[str]:
    """Free names a compute block reads before binding them, safe builtins left out."""
    return _free_names(_compute_source(code), "exec")


def check_template(value: Any) -> list[str]:
    """Static problems of every template in ``value``: syntax errors, private attributes."""
    problems: list[str] = []
    for source in _template_strings(value):
        try:
            tree = jinja._ENV.parse(source)
        except exceptions.TemplateSyntaxError as exc:
            problems.append(f"invalid template {source!r}: {exc.message} (line {exc.lineno})")
            continue
        problems += [f"attribute {node.attr!r} is not allowed in template {source!r}"
                     for node in tree.find_all(nodes.Getattr) if node.attr.startswith("_")]
    return problems


def check_expression(expression: str) -> list[str]:
    """Static problems of a condition (syntax errors, refused syntax); empty when fine."""
    if not isinstance(expression, str):
        return []
    if _whole_template(expression):
        return check_template(expression)
    return list(_parse(expression.strip(), "eval")[1])


def check_compute(code: str) -> list[str]:
    """Static problems of a compute block (syntax errors, refused syntax); empty when fine."""
    return list(_parse(_compute_source(code), "exec")[1])
