"""Conditions and compute blocks: parsed with :func:`ast.parse`, checked against a
whitelist of syntax, and run by :class:`_Interpreter`, which walks the tree itself (no
``eval``/``exec`` of user text, ever)."""

from __future__ import annotations

import ast
import copy
import operator
import sys
import types
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from functools import lru_cache
from typing import Any

from saga.errors import ExpressionError, ExpressionLimit
from saga.expressions.limits import (
    _PLAIN,
    _PY_ERRORS,
    Meter,
    _add,
    _format,
    _keyless,
    _lshift,
    _method_args,
    _mod,
    _mul,
    _pow,
    _range,
    _Refusal,
    _round,
    _sampled_size,
    _str,
    _sum,
    _TooLarge,
    _walk,
    budget,
    check_time,
    held_bytes,
)
from saga.expressions.modules import CALLABLES, MODULES, VALUE_MEMBERS, SafeModule, import_problem


class _Break(Exception):
    """``break`` unwinding to its loop."""


class _Continue(Exception):
    """``continue`` unwinding to its loop."""


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


_SAFE_BUILTINS: dict[str, Any] = {
    "len": len, "str": _str, "int": int, "float": float, "bool": bool, "list": list,
    "dict": dict, "tuple": tuple, "set": set, "min": _keyless(min), "max": _keyless(max),
    "sum": _sum, "any": any, "all": all, "sorted": _keyless(sorted), "reversed": reversed,
    "enumerate": enumerate, "zip": zip, "range": _range, "abs": abs, "round": _round,
}


_SAFE_CALLABLES = frozenset(id(f) for f in _SAFE_BUILTINS.values())
#: Builtins that fill a new container from an iterable: given an iterator, the interpreter
#: fills the list itself, where the memory meter sees it grow.
_FILLING = frozenset(id(_SAFE_BUILTINS[name]) for name in ("list", "tuple", "set", "dict",
                                                           "sorted"))
#: Calls whose result is (usually) a value that already existed: not charged as new.
_FINDING = frozenset(id(_SAFE_BUILTINS[name]) for name in ("min", "max"))
_FINDING_METHODS = frozenset({"get", "pop", "index", "count", "find", "rfind"})
#: Nodes whose value is newly made (a name or an item read is not, a slice is): charged
#: to the meter.
_SIZED = frozenset({str, bytes, list, tuple, dict, set, frozenset})
_MAKING: frozenset[type[ast.AST]] = frozenset({
    ast.BinOp, ast.Call, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.JoinedStr,
    ast.FormattedValue, ast.Subscript})  # comprehensions are charged as they fill
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
    **VALUE_MEMBERS,
}


class _Interpreter:
    """Runs a pre-checked tree against a namespace, one counted node at a time."""

    def __init__(self, source: str, namespace: Mapping[str, Any], max_steps: int,
                 deadline: float | None = None) -> None:
        self.source, self.namespace, self.max_steps = source, namespace, max_steps
        self.deadline = deadline
        self.steps = 0
        self.meter = Meter(self.held, source)
        self.fresh = True  # whether the last call made its result (see _FINDING)
        self.pending: list[Any] = []  # containers being filled, held by no name yet
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
            ast.Import: self._import,
            ast.ImportFrom: self._import,
        }

    @property
    def locals(self) -> dict[str, Any]:
        return self.scopes[0]

    def held(self, made: Any) -> int:
        """Bytes the evaluation holds: its names, what it is filling, and ``made`` (a value
        just made, held by nobody yet); not the namespace values it read (its inputs,
        copied as given, whatever names it binds them to)."""
        return held_bytes(self.scopes, self.pending, made, deadline=self.deadline,
                          ignore=(*self.copies.values(),))

    def grown(self, container: Any, before: int) -> None:
        """Charge what ``container`` grew by since it measured ``before`` bytes."""
        self.meter.charge(sys.getsizeof(container) - before)

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        # Checked statically (see _node_problem): only MODULES and their members.
        for alias in node.names:
            if isinstance(node, ast.ImportFrom):
                value = MODULES[node.module or ""].member(alias.name)
            else:
                value = MODULES[alias.name]
            self.locals[alias.asname or alias.name] = value

    def visit(self, node: ast.AST) -> Any:
        """Evaluate one node, counting it against the budget and locating any error."""
        self.steps += 1
        if self.steps > self.max_steps:
            raise ExpressionLimit("expression limit: more than its step budget of "
                                  f"{self.max_steps} evaluated nodes", self.source)
        if not self.steps & 1023:  # the clock, every 1,024 nodes: cheap, and soon enough
            check_time(self.deadline, self.source)
        kind = type(node)
        handler = self.handlers.get(kind)
        if handler is None:
            raise self.error(node, f"{_describe(node)} is not allowed")
        try:
            value = handler(node)
        except RecursionError:
            raise
        except _TooLarge as exc:
            error = self.error(node, f"expression limit: {exc}")
            raise ExpressionLimit(str(error), self.source) from None
        except _Refusal as exc:
            raise self.error(node, str(exc)) from None
        except _PY_ERRORS as exc:
            segment = ast.get_source_segment(self.source, node) or _describe(node)
            at = "" if segment == self.source else f" at {segment!r}"
            raise self.error(node, f"{type(exc).__name__}: {exc}{at}") from None
        if kind in _MAKING and type(value) in _SIZED and (
                self.fresh if kind is ast.Call else kind is not ast.Subscript
                or type(node.slice) is ast.Slice):  # type: ignore[attr-defined]
            meter = self.meter
            meter.charged += sys.getsizeof(value) if type(value) is str else _sampled_size(value)
            if meter.charged > meter.threshold:
                meter.measure(value)
        return value

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
            value = self.locals[target.id] = op(self.visit(target), self.visit(node.value))
            self.meter.charge_value(value)
        elif isinstance(target, ast.Subscript):
            container, key = self.container(target)
            value = container[key] = op(container[key], self.visit(node.value))
            self.meter.charge_value(value)
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
            before = sys.getsizeof(container)
            container[key] = value
            self.grown(container, before)
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
            conversions: dict[int, Callable[[Any], str]] = {
                ord("s"): str, ord("r"): repr, ord("a"): ascii}
            value = conversions[node.conversion](value)
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
        if isinstance(obj, SafeModule):
            return obj.member(name)
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
            if func.__name__ in {"join", "extend"} and args:
                args[0] = self.fill(args[0])
            args = _method_args(owner, func.__name__, args, kwargs)
            if type(owner) is list:  # append, extend, insert grow it in place
                before = sys.getsizeof(owner)
                result = func(*args, **kwargs)
                self.meter.charge(sys.getsizeof(owner) - before)
                self.fresh = func.__name__ not in _FINDING_METHODS
                return result
            fresh = func.__name__ not in _FINDING_METHODS
        elif id(func) not in _SAFE_CALLABLES and id(func) not in CALLABLES \
                and not isinstance(func, SafeModule):
            raise _Refusal(f"calling a {type(func).__name__} is not allowed")
        else:
            if id(func) in _FILLING and args:
                args[0] = self.fill(args[0])
            fresh = id(func) not in _FINDING
        result = func(*args, **kwargs)
        self.fresh = fresh
        return result

    def fill(self, iterable: Any) -> Any:
        """``iterable`` as a list filled here, when it is an iterator (a C function filling
        a list from a generator would hold what it made where the meter cannot see it)."""
        if isinstance(iterable, Sized):
            return iterable
        items: list[Any] = []
        self.pending.append(items)
        try:
            for item in iterable:
                before = sys.getsizeof(items)
                items.append(item)
                self.grown(items, before)
        finally:
            self.pending.pop()
        return items

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
        result: Any = {} if isinstance(node, ast.DictComp) else set() if isinstance(
            node, ast.SetComp) else []
        self.pending.append(result)  # what it holds so far counts against max_memory
        try:
            for _ in self.bindings(node.generators, scope):
                before = sys.getsizeof(result)
                if isinstance(node, ast.DictComp):
                    result[self.visit(node.key)] = self.visit(node.value)
                elif isinstance(node, ast.SetComp):
                    result.add(self.visit(node.elt))
                else:
                    result.append(self.visit(node.elt))
                self.grown(result, before)
            return result
        finally:
            self.pending.pop()
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
    _UNARY) | frozenset(_COMPARE) | {ast.And, ast.Or, ast.Load, ast.Store, ast.keyword, ast.alias,
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
    if isinstance(node, ast.Import):
        return next(filter(None, (import_problem(a.name, None) for a in node.names)), None)
    if isinstance(node, ast.ImportFrom):
        if node.level or any(a.name == "*" for a in node.names):
            return "only 'from MODULE import NAME' imports are allowed"
        return import_problem(node.module or "", [a.name for a in node.names])
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
            pending.extend(ast.iter_child_nodes(node))  # type: ignore[arg-type]
    return tree, tuple(problems)


def _prepare(source: str, mode: str, kind: str) -> ast.AST:
    tree, problems = _parse(source, mode)
    if problems or tree is None:
        raise ExpressionError(f"invalid {kind}: {'; '.join(problems)}", source)
    return tree


def _run(source: str, mode: str, namespace: Mapping[str, Any],
         max_steps: int, seconds: float | None = None) -> tuple[Any, dict[str, Any]]:
    """Check and interpret ``source``: its value (conditions) and its locals (compute)."""
    kind = "condition" if mode == "eval" else "compute block"
    tree = _prepare(source, mode, kind)
    interpreter = _Interpreter(source, namespace, max_steps, budget(seconds))
    try:
        return interpreter.visit(tree), interpreter.locals
    except RecursionError:
        raise ExpressionError(f"{kind} {source!r} is nested too deeply", source) from None
    except MemoryError:  # whatever allocated it, the step fails, not the process
        raise ExpressionLimit(f"expression limit: memory: {kind} {source!r} ran out of "
                              "memory ([limits] max_memory)", source) from None
    except (_Break, _Continue):
        raise ExpressionError(f"break/continue outside a loop in {kind}", source) from None


def _plain_result(value: Any, source: str, where: str) -> Any:
    try:
        _walk(value, plain=True)
    except _Refusal as exc:
        raise ExpressionError(f"{where} {exc}", source) from None
    return value


# -- the Jinja sandbox ----------------------------------------------------------------------


def _finalize(value: Any) -> Any:
    _walk(value, plain=True)
    return value
