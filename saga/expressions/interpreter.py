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

import ast
import copy
import json
import operator
import re
import textwrap
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, Template, Undefined, meta, nodes
from jinja2.environment import TemplateExpression
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from saga.errors import ExpressionError

__all__ = [
    "DEFAULT_MAX_STEPS", "check_compute", "check_expression", "check_template",
    "compute_references", "evaluate", "expression_references", "is_template", "references",
    "render", "run_compute",
]

DEFAULT_MAX_STEPS = 1_000_000  # nodes a condition or compute block may visit
_MAX_REPEAT = 1_000_000  # items/characters a `*` repetition may produce
_MAX_SIZE = 10_000_000  # items/characters any other growing operation may produce
_MAX_EXPONENT = _MAX_SHIFT = _MAX_WIDTH = 10_000  # WIDTH: numbers in an f-string format spec
_MAX_INT_BITS = _MAX_RANGE = 100_000
_PLAIN = (str, int, float, bool, type(None))
_SEQUENCES = (str, list, tuple)
_SCALARS = frozenset(_PLAIN)
_PY_ERRORS = (ArithmeticError, LookupError, TypeError, ValueError, AttributeError, RuntimeError)


class _Refusal(Exception):
    """An operation the sandbox will not perform: too large, or not allowed."""


class _Break(Exception):
    """``break`` unwinding to its loop."""


class _Continue(Exception):
    """``continue`` unwinding to its loop."""


def _limit(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise _Refusal(f"{what} would be too large ({size} > {limit})")


def _walk(value: Any, *, plain: bool = False) -> int:
    """Count ``value`` and everything nested in it, refusing more than _MAX_REPEAT in all.

    Shared references count each time they appear, which bounds the work ``str()``, JSON
    and repetition would do on a structure that aliases one big list many times. With
    ``plain``, also refuse anything but JSON-like data (functions, iterators, Undefined).
    """
    pending, count = [value], 1
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            children: Any = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple | set | frozenset):
            children = item
        else:
            if plain and isinstance(item, Undefined):
                raise _Refusal(item._undefined_message.rstrip("."))
            if plain and not isinstance(item, _PLAIN):
                raise _Refusal(f"evaluated to a {type(item).__name__}, which is not plain data "
                               "(wrap iterators in list(...))")
            continue
        count += len(children)
        if count > _MAX_REPEAT:
            raise _Refusal(f"value has more than {_MAX_REPEAT} nested items")
        if not set(map(type, children)) <= _SCALARS:  # else nothing below needs a look
            pending += [child for child in children if type(child) not in _SCALARS]
    return count


# -- size-checked operators, shared by the interpreter and the Jinja sandbox ---------------


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, _SEQUENCES) and isinstance(b, _SEQUENCES):
        _limit(len(a) + len(b), _MAX_SIZE, "concatenation")
    return a + b


def _mul(a: Any, b: Any) -> Any:
    for seq, count in ((a, b), (b, a)):
        if isinstance(seq, _SEQUENCES) and isinstance(count, int):
            size = len(seq) if isinstance(seq, str) else _walk(seq) - 1
            _limit(size * count, _MAX_REPEAT, "repetition")
    if isinstance(a, int) and isinstance(b, int):
        _limit(a.bit_length() + b.bit_length(), _MAX_INT_BITS, "integer product (bits)")
    return a * b


def _pow(a: Any, b: Any) -> Any:
    if isinstance(b, int | float) and abs(b) > _MAX_EXPONENT:
        raise _Refusal(f"exponent {b} is too large (limit {_MAX_EXPONENT})")
    if isinstance(a, int) and isinstance(b, int) and b > 0:
        _limit(a.bit_length() * b, _MAX_INT_BITS, "power (bits)")
    return a**b


def _lshift(a: Any, b: Any) -> Any:
    if isinstance(b, int) and b > _MAX_SHIFT:
        raise _Refusal(f"shift by {b} is too large (limit {_MAX_SHIFT})")
    if isinstance(a, int) and isinstance(b, int):
        _limit(a.bit_length() + b, _MAX_INT_BITS, "shifted integer (bits)")
    return a << b


def _mod(a: Any, b: Any) -> Any:
    if isinstance(a, str):
        raise _Refusal("%-formatting of strings is not allowed; use an f-string")
    return a % b


_BINOPS: dict[type[ast.AST], Callable[[Any, Any], Any]] = {
    ast.Add: _add, ast.Sub: operator.sub, ast.Mult: _mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: _mod, ast.Pow: _pow, ast.LShift: _lshift,
    ast.RShift: operator.rshift, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor,
}
_UNARY: dict[type[ast.AST], Callable[[Any], Any]] = {
    ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
}
_COMPARE: dict[type[ast.AST], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_,
    ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}


# -- builtins and methods the interpreter exposes -------------------------------------------


def _range(*args: int) -> range:
    """``range`` refusing more than _MAX_RANGE items."""
    result = range(*args)
    try:
        size = len(result)
    except OverflowError:
        size = _MAX_RANGE + 1
    if size > _MAX_RANGE:
        raise _Refusal(f"range longer than {_MAX_RANGE} items is not allowed")
    return result


def _sum(iterable: Any, start: Any = 0) -> Any:
    """``sum`` of numbers only (summing lists or strings could allocate without bound)."""
    if not isinstance(start, int | float):
        raise _Refusal("sum() only adds numbers")
    return sum(iterable, start)


def _keyless(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` refusing ``key=``, through which C code would call back user-chosen methods."""
    def call(*args: Any, **kwargs: Any) -> Any:
        if "key" in kwargs:
            raise _Refusal(f"{func.__name__}() does not accept key=")
        return func(*args, **kwargs)
    return call


def _str(value: Any = "") -> str:
    """``str`` refusing containers too large (or too aliased) to print."""
    _walk(value)
    return str(value)


_SAFE_BUILTINS: dict[str, Any] = {
    "len": len, "str": _str, "int": int, "float": float, "bool": bool, "list": list,
    "dict": dict, "tuple": tuple, "set": set, "min": _keyless(min), "max": _keyless(max),
    "sum": _sum, "any": any, "all": all, "sorted": _keyless(sorted), "reversed": reversed,
    "enumerate": enumerate, "zip": zip, "range": _range, "abs": abs, "round": round,
}
_SAFE_CALLABLES = frozenset(id(f) for f in _SAFE_BUILTINS.values())
# YAML and JSON spellings of the constants, so `when: "x == true"` reads as users expect.
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None}
_METHODS: dict[type, frozenset[str]] = {
    str: frozenset({
        "lower", "upper", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines",
        "replace", "startswith", "endswith", "find", "rfind", "count", "join", "title",
        "capitalize", "isdigit", "isalpha", "isalnum", "isspace", "zfill", "partition",
        "rpartition", "removeprefix", "removesuffix", "center", "ljust", "rjust"}),
    dict: frozenset({"get", "keys", "values", "items", "copy"}),
    list: frozenset({"index", "count", "copy", "append", "extend", "insert", "pop", "remove",
                     "sort", "reverse"}),
}


def _method_args(owner: Any, name: str, args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """Refuse method calls that could allocate without bound; returns the (listed) args."""
    if name in {"center", "ljust", "rjust", "zfill"} and args and isinstance(args[0], int):
        _limit(args[0], _MAX_SIZE, f"str.{name}() result")
    elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        hits = owner.count(args[0]) if args[0] else len(owner) + 1
        _limit(len(owner) + hits * len(args[1]), _MAX_SIZE, "str.replace() result")
    elif name in {"join", "extend"} and args:
        args = [list(args[0]), *args[1:]]
        size = len(owner) + len(args[0])  # extend
        if name == "join":
            size = len(owner) * len(args[0]) + sum(len(x) for x in args[0] if isinstance(x, str))
        _limit(size, _MAX_SIZE, f"{name}() result")
    elif name == "sort" and "key" in kwargs:
        raise _Refusal("list.sort(key=...) is not allowed")
    return args


def _format(value: Any, spec: str) -> str:
    """One f-string field: Python's ``format`` on plain values only, with bounded widths."""
    if not spec:
        return value if isinstance(value, str) else str(value)
    if type(value) not in _PLAIN:
        raise _Refusal(f"format spec {spec!r} is only allowed on numbers, strings and None")
    if any(int(n) > _MAX_WIDTH for n in re.findall(r"\d+", spec)):
        raise _Refusal(f"format spec {spec!r} is too wide")
    return format(value, spec)


# -- the interpreter ------------------------------------------------------------------------


class _Interpreter:
    """Runs a pre-checked tree against a namespace, one counted node at a time."""

    def __init__(self, source: str, namespace: Mapping[str, Any], max_steps: int) -> None:
        self.source, self.namespace, self.max_steps = source, namespace, max_steps
        self.steps = 0
        self.copies: dict[str, Any] = {}  # namespace values read so far, deep-copied
        self.scopes: list[dict[str, Any]] = [{}]  # block locals, then comprehension scopes
        v = self.visit
        self.handlers: dict[type[ast.AST], Callable[[Any], Any]] = {
            ast.Module: lambda n: self.run(n.body),
            ast.Assign: self._assign,
            ast.AugAssign: self._aug_assign,
            ast.AnnAssign: lambda n: None if n.value is None else self.bind(
                n.target, v(n.value), self.locals),
            ast.If: lambda n: self.run(n.body if v(n.test) else n.orelse),
            ast.For: self._for,
            ast.Break: self._jump,
            ast.Continue: self._jump,
            ast.Pass: lambda n: None,
            ast.Expr: lambda n: v(n.value),
            ast.Expression: lambda n: v(n.body),
            ast.Constant: lambda n: n.value,
            ast.Name: self._name,
            ast.List: lambda n: self.elements(n.elts),
            ast.Tuple: lambda n: tuple(self.elements(n.elts)),
            ast.Set: lambda n: set(self.elements(n.elts)),
            ast.Dict: self._dict,
            ast.JoinedStr: lambda n: "".join(v(part) for part in n.values),
            ast.FormattedValue: self._formatted_value,
            ast.BoolOp: self._bool_op,
            ast.BinOp: lambda n: _BINOPS[type(n.op)](v(n.left), v(n.right)),
            ast.UnaryOp: lambda n: _UNARY[type(n.op)](v(n.operand)),
            ast.Compare: self._compare,
            ast.IfExp: lambda n: v(n.body) if v(n.test) else v(n.orelse),
            ast.Subscript: self._subscript,
            ast.Slice: lambda n: slice(*(None if part is None else v(part)
                                         for part in (n.lower, n.upper, n.step))),
            ast.Attribute: self._attribute,
            ast.Call: self._call,
            ast.ListComp: self._comprehension,
            ast.SetComp: self._comprehension,
            ast.DictComp: self._comprehension,
            ast.GeneratorExp: self._generator_exp,
        }

    @property
    def locals(self) -> dict[str, Any]:
        return self.scopes[0]

    def visit(self, node: ast.AST) -> Any:
        """Evaluate one node, counting it against the budget and locating any error."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise ExpressionError("expression exceeded its step budget", self.source)
        handler = self.handlers.get(type(node))
        if handler is None:
            raise self.error(node, f"{_describe(node)} is not allowed")
        try:
            return handler(node)
        except RecursionError:
            raise
        except _Refusal as exc:
            raise self.error(node, str(exc)) from None
        except _PY_ERRORS as exc:
            segment = ast.get_source_segment(self.source, node) or _describe(node)
            at = "" if segment == self.source else f" at {segment!r}"
            raise self.error(node, f"{type(exc).__name__}: {exc}{at}") from None

    def error(self, node: ast.AST, message: str) -> ExpressionError:
        """An ExpressionError for ``node``, naming where it is in the source."""
        if "\n" not in self.source:
            return ExpressionError(f"{message} in {self.source!r}", self.source)
        lineno = getattr(node, "lineno", 1)
        line = self.source.splitlines()[lineno - 1].strip()
        return ExpressionError(f"{message} on line {lineno}: {line!r}", self.source)

    def run(self, body: list[ast.stmt]) -> None:
        for statement in body:
            self.visit(statement)

    # statements

    def _assign(self, node: ast.Assign) -> None:
        value = self.visit(node.value)
        for target in node.targets:
            self.bind(target, value, self.locals)

    def _aug_assign(self, node: ast.AugAssign) -> None:
        op, target = _BINOPS[type(node.op)], node.target
        if isinstance(target, ast.Name):
            self.locals[target.id] = op(self.visit(target), self.visit(node.value))
        elif isinstance(target, ast.Subscript):
            container, key = self.container(target)
            container[key] = op(container[key], self.visit(node.value))
        else:
            raise _Refusal(f"assigning to {_describe(target)} is not allowed")

    def _for(self, node: ast.For) -> None:
        for item in self.visit(node.iter):
            self.bind(node.target, item, self.locals)
            try:
                self.run(node.body)
            except _Break:
                break
            except _Continue:
                continue
        else:
            self.run(node.orelse)

    def _jump(self, node: ast.Break | ast.Continue) -> None:
        raise _Break if isinstance(node, ast.Break) else _Continue

    def bind(self, target: ast.AST, value: Any, scope: dict[str, Any]) -> None:
        """Assign ``value`` to a name, a tuple/list of targets, or a dict/list item."""
        if isinstance(target, ast.Name):
            scope[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            items = list(value)
            if len(items) != len(target.elts):
                raise ValueError(f"expected {len(target.elts)} values to unpack, got {len(items)}")
            for element, item in zip(target.elts, items, strict=True):
                self.bind(element, item, scope)
        elif isinstance(target, ast.Subscript):
            container, key = self.container(target)
            container[key] = value
        else:
            raise _Refusal(f"assigning to {_describe(target)} is not allowed")

    def container(self, target: ast.Subscript) -> tuple[Any, Any]:
        """The dict or list a subscript assignment writes into, and the key."""
        container = self.visit(target.value)
        if not isinstance(container, dict | list):
            raise _Refusal(f"cannot assign items of a {type(container).__name__}")
        return container, self.visit(target.slice)

    # expressions

    def _name(self, node: ast.Name) -> Any:
        name = node.id
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        if name in self.copies:
            return self.copies[name]
        if name in self.namespace:
            value = self.copies[name] = copy.deepcopy(self.namespace[name])
            return value
        if name in _SAFE_BUILTINS:
            return _SAFE_BUILTINS[name]
        if name in _CONSTANTS:
            return _CONSTANTS[name]
        raise self.error(node, f"name {name!r} is not defined")

    def elements(self, elts: list[ast.expr]) -> list[Any]:
        items: list[Any] = []
        for elt in elts:
            if isinstance(elt, ast.Starred):
                items.extend(self.visit(elt.value))
            else:
                items.append(self.visit(elt))
        return items

    def _dict(self, node: ast.Dict) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for key, value in zip(node.keys, node.values, strict=True):
            if key is None:
                result.update(self.visit(value))
            else:
                result[self.visit(key)] = self.visit(value)
        return result

    def _formatted_value(self, node: ast.FormattedValue) -> str:
        value = self.visit(node.value)
        _str(value)  # refuses values too large to print
        if node.conversion != -1:
            value = {ord("s"): str, ord("r"): repr, ord("a"): ascii}[node.conversion](value)
        return _format(value, "" if node.format_spec is None else self.visit(node.format_spec))

    def _bool_op(self, node: ast.BoolOp) -> Any:
        is_and = isinstance(node.op, ast.And)
        value = None
        for operand in node.values:
            value = self.visit(operand)
            if bool(value) != is_and:  # `and` stops at a falsy value, `or` at a truthy one
                return value
        return value

    def _compare(self, node: ast.Compare) -> bool:
        left = self.visit(node.left)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.visit(comparator)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _subscript(self, node: ast.Subscript) -> Any:
        obj = self.visit(node.value)
        if not isinstance(obj, Mapping | Sequence):
            raise _Refusal(f"a {type(obj).__name__} cannot be subscripted")
        return obj[self.visit(node.slice)]

    def _attribute(self, node: ast.Attribute) -> Any:
        obj, name = self.visit(node.value), node.attr
        if name.startswith("_"):
            raise _Refusal(f"attribute {name!r} is not allowed")
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if name in _METHODS.get(type(obj), ()):
            return getattr(obj, name)
        if isinstance(obj, dict):
            raise _Refusal(f"no key or attribute {name!r}")
        raise _Refusal(f"attribute {name!r} of a {type(obj).__name__} is not allowed")

    def _call(self, node: ast.Call) -> Any:
        func = self.visit(node.func)
        args = self.elements(node.args)
        kwargs: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                kwargs.update(self.visit(keyword.value))
            else:
                kwargs[keyword.arg] = self.visit(keyword.value)
        owner = getattr(func, "__self__", None)
        if isinstance(func, types.BuiltinMethodType) and func.__name__ in _METHODS.get(
                type(owner), ()):
            args = _method_args(owner, func.__name__, args, kwargs)
        elif id(func) not in _SAFE_CALLABLES:
            raise _Refusal(f"calling a {type(func).__name__} is not allowed")
        return func(*args, **kwargs)

    # comprehensions: each runs in a scope of its own

    def bindings(self, generators: list[ast.comprehension],
                 scope: dict[str, Any]) -> Iterator[None]:
        """Bind the targets of each ``for`` clause in turn; yield when all ``if``s hold."""
        first, rest = generators[0], generators[1:]
        for item in self.visit(first.iter):
            self.bind(first.target, item, scope)
            if all(self.visit(condition) for condition in first.ifs):
                if rest:
                    yield from self.bindings(rest, scope)
                else:
                    yield

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp) -> Any:
        scope: dict[str, Any] = {}
        self.scopes.append(scope)
        try:
            each = self.bindings(node.generators, scope)
            if isinstance(node, ast.DictComp):
                return {self.visit(node.key): self.visit(node.value) for _ in each}
            values = (self.visit(node.elt) for _ in each)
            return set(values) if isinstance(node, ast.SetComp) else list(values)
        finally:
            self.scopes.pop()

    def _generator_exp(self, node: ast.GeneratorExp) -> Iterator[Any]:
        """A lazy generator running in the scopes captured now, as Python's does."""
        chain = [*self.scopes, {}]
        each, done = self.bindings(node.generators, chain[-1]), object()

        def produce() -> Iterator[Any]:
            while True:
                outer, self.scopes = self.scopes, chain
                try:
                    if next(each, done) is done:
                        return
                    value = self.visit(node.elt)
                finally:
                    self.scopes = outer
                yield value

        return produce()


# -- static checks --------------------------------------------------------------------------

_ALLOWED = frozenset(_Interpreter("", {}, 0).handlers) | frozenset(_BINOPS) | frozenset(
    _UNARY) | frozenset(_COMPARE) | {ast.And, ast.Or, ast.Load, ast.Store, ast.keyword,
                                     ast.comprehension, ast.Starred}
_NODE_NAMES: dict[type[ast.AST], str] = {
    ast.Import: "import", ast.ImportFrom: "import", ast.Lambda: "lambda",
    ast.While: "a while loop (unbounded)", ast.FunctionDef: "a function definition",
    ast.AsyncFunctionDef: "a function definition", ast.ClassDef: "a class definition",
    ast.Global: "global", ast.Nonlocal: "nonlocal", ast.With: "with", ast.Try: "try",
    ast.Raise: "raise", ast.Delete: "del", ast.Await: "await", ast.Yield: "yield",
    ast.YieldFrom: "yield", ast.NamedExpr: "an assignment expression (:=)",
    ast.Return: "return", ast.MatMult: "the @ operator",
}


def _describe(node: ast.AST) -> str:
    return _NODE_NAMES.get(type(node), type(node).__name__)


def _node_problem(node: ast.AST) -> str | None:
    if type(node) not in _ALLOWED:
        return f"{_describe(node)} is not allowed"
    if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
        return f"attribute {node.attr!r} is not allowed (names starting with '_' are private)"
    if isinstance(node, ast.Name) and node.id.startswith("__"):
        return f"name {node.id!r} is not allowed"
    if isinstance(node, ast.Constant) and not isinstance(node.value, _PLAIN):
        return f"constant {node.value!r} is not allowed"
    if isinstance(node, ast.comprehension) and node.is_async:
        return "an async comprehension is not allowed"
    if isinstance(node, ast.Starred) and isinstance(node.ctx, ast.Store):
        return "starred assignment is not allowed"
    return None


@lru_cache(maxsize=1024)
def _parse(source: str, mode: str) -> tuple[ast.AST | None, tuple[str, ...]]:
    """The tree of ``source`` (None on a syntax error) and every static problem found."""
    try:
        tree = ast.parse(source, mode=mode)
    except SyntaxError as exc:
        return None, (f"syntax error: {exc.msg} (line {exc.lineno}, column {exc.offset})",)
    except (RecursionError, MemoryError):
        return None, ("expression is nested too deeply",)
    except ValueError as exc:
        return None, (f"invalid source: {exc}",)
    problems, pending = [], deque([tree])
    while pending:  # breadth first, not descending into refused nodes
        node = pending.popleft()
        problem = _node_problem(node)
        if problem:
            line = getattr(node, "lineno", None)
            problems.append(f"{problem} (line {line})" if line else problem)
        if type(node) in _ALLOWED:
            pending.extend(ast.iter_child_nodes(node))
    return tree, tuple(problems)


def _prepare(source: str, mode: str, kind: str) -> ast.AST:
    tree, problems = _parse(source, mode)
    if problems or tree is None:
        raise ExpressionError(f"invalid {kind}: {'; '.join(problems)}", source)
    return tree


def _run(source: str, mode: str, namespace: Mapping[str, Any],
         max_steps: int) -> tuple[Any, dict[str, Any]]:
    """Check and interpret ``source``: its value (conditions) and its locals (compute)."""
    kind = "condition" if mode == "eval" else "compute block"
    tree = _prepare(source, mode, kind)
    interpreter = _Interpreter(source, namespace, max_steps)
    try:
        return interpreter.visit(tree), interpreter.locals
    except RecursionError:
        raise ExpressionError(f"{kind} {source!r} is nested too deeply", source) from None
    except (_Break, _Continue):
        raise ExpressionError(f"break/continue outside a loop in {kind}", source) from None


def _plain_result(value: Any, source: str, where: str) -> Any:
    try:
        _walk(value, plain=True)
    except _Refusal as exc:
        raise ExpressionError(f"{where} {exc}", source) from None
    return value


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


# -- the Jinja sandbox ----------------------------------------------------------------------


def _finalize(value: Any) -> Any:
    _walk(value, plain=True)
    return value


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, reading dict keys before attributes and checking sizes."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        return {"*": _mul, "**": _pow, "%": _mod}[operator](left, right)


_ENV = _Sandbox(undefined=StrictUndefined, keep_trailing_newline=True, finalize=_finalize)
_ENV.globals.clear()  # cycler, joiner, lipsum and namespace are not needed
_ENV.globals.update(range=safe_range, dict=dict)
_ENV.filters.update(
    json=lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False),
    fromjson=json.loads,
)


def _whole_template(text: str) -> bool:
    text = text.strip()
    return text.startswith("{{") and text.endswith("}}")


@lru_cache(maxsize=1024)
def _text_template(source: str) -> Template:
    return _ENV.from_string(source)


@lru_cache(maxsize=1024)
def _native_expression(source: str) -> TemplateExpression | None:
    """The compiled expression when ``source`` is exactly one ``{{ ... }}``, else None."""
    text = source.strip()
    if not _whole_template(text):
        return None
    body = _ENV.parse(text).body
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1 \
            or isinstance(body[0].nodes[0], nodes.TemplateData):
        return None
    inner = text[2:-2]
    inner = inner[1:] if inner.startswith("-") else inner  # whitespace control: {{- x -}}
    inner = inner[:-1] if inner.endswith("-") else inner
    return _ENV.compile_expression(inner, undefined_to_none=False)


@contextmanager
def _template_errors(source: str) -> Iterator[None]:
    """Turn every Jinja, sandbox and Python error into an ExpressionError naming the template."""
    try:
        yield
    except TemplateSyntaxError as exc:
        raise ExpressionError(f"invalid template {source!r}: {exc.message} (line {exc.lineno})",
                              source) from None
    except SecurityError as exc:
        raise ExpressionError(f"refused by the sandbox: {str(exc).rstrip('.')} in template "
                              f"{source!r}", source) from None
    except (TemplateError, _Refusal) as exc:
        raise ExpressionError(f"{str(exc).rstrip('.')} in template {source!r}", source) from None
    except RecursionError:
        raise ExpressionError(f"template {source!r} is nested too deeply", source) from None
    except _PY_ERRORS as exc:
        raise ExpressionError(f"{type(exc).__name__}: {exc} in template {source!r}",
                              source) from None


def _render_string(source: str, namespace: Mapping[str, Any]) -> Any:
    with _template_errors(source):
        expression = _native_expression(source)
        if expression is None:
            return _text_template(source).render(dict(namespace))
        value = expression(dict(namespace))
        _walk(value, plain=True)
        return str(value) if isinstance(value, str) else value  # Markup -> str


def _template_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if is_template(value):
            yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _template_strings(key)
            yield from _template_strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _template_strings(item)


# -- public API -----------------------------------------------------------------------------


def is_template(value: str) -> bool:
    """Whether ``value`` is a string containing Jinja markers (``{{`` or ``{%``)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def render(value: Any, namespace: Mapping[str, Any]) -> Any:
    """Render every template in ``value`` (recursing into dicts, their string keys, and lists).

    A string that is exactly one ``{{ expr }}`` yields the expression's native value (a dict
    stays a dict); any other templated string renders to a string; everything else is
    returned unchanged. Keys always render to strings. Raises ExpressionError on a missing
    name or attribute, a syntax error, or anything the sandbox refuses.
    """
    if isinstance(value, str):
        return _render_string(value, namespace) if is_template(value) else value
    if isinstance(value, dict):
        rendered: dict[Any, Any] = {}
        for key, item in value.items():
            if is_template(key):
                with _template_errors(key):
                    rendered[_text_template(key).render(dict(namespace))] = render(item, namespace)
            else:
                rendered[key] = render(item, namespace)
        return rendered
    if isinstance(value, list | tuple):
        items = [render(item, namespace) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def evaluate(expression: str, namespace: Mapping[str, Any], *,
             max_steps: int = DEFAULT_MAX_STEPS) -> Any:
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
    return _plain_result(_run(source, "eval", namespace, max_steps)[0], source,
                         f"condition {source!r}")


def run_compute(code: str, namespace: Mapping[str, Any], *,
                max_steps: int = DEFAULT_MAX_STEPS) -> Any:
    """Run a compute block and return what it bound to ``result``.

    The block is dedented, checked against the whitelist, then run statement by statement
    in a fresh local scope over (deep copies of) the namespace, which is never mutated.
    Raises ExpressionError when refused, failing, out of budget, or if ``result`` is unset.
    """
    source = _compute_source(code)
    scope = _run(source, "exec", namespace, max_steps)[1]
    if "result" not in scope:
        raise ExpressionError("compute block did not assign 'result'", source)
    return _plain_result(scope["result"], source, "the compute block's result")


def references(value: Any) -> set[str]:
    """Root names the templates in ``value`` read (recursing into dicts, keys and lists)."""
    names: set[str] = set()
    for source in _template_strings(value):
        with _template_errors(source):
            names |= meta.find_undeclared_variables(_ENV.parse(source))
    return names - set(_ENV.globals)


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
            tree = _ENV.parse(source)
        except TemplateSyntaxError as exc:
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
