"""Templates: ``{{ ... }}`` rendered by Jinja2's immutable sandbox, with strict undefined
names, almost no globals, and size-checked ``*``/``**``/``%``."""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from jinja2 import StrictUndefined, Template, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.environment import TemplateExpression
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from saga.errors import ExpressionError, ExpressionLimit
from saga.expressions import limits
from saga.expressions.interpreter import (
    _finalize,
)
from saga.expressions.limits import (
    _DEADLINE,
    _METER,
    _PY_ERRORS,
    Meter,
    _add,
    _limit,
    _method_args,
    _mod,
    _mul,
    _pow,
    _Refusal,
    _str,
    _TooLarge,
    _walk,
    budget,
    charge,
    check_time,
    format_widths,
    guarded,
    held_bytes,
)
from saga.expressions.markers import _whole_template


class _CheckedCodeGenerator(CodeGenerator):
    """Compiles ``~`` to the sandbox's size-checked join (Jinja's own joins unchecked: a
    macro calling itself with ``x ~ x`` doubles a string per call)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _Sandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, reading dict keys before attributes, checking sizes, and
    charging what its operators make to the template's memory meter."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})
    code_generator_class = _CheckedCodeGenerator

    def call(__self, __context: Context, __obj: Any, *args: Any,
             **kwargs: Any) -> Any:
        # every call (a macro, a loop(...) of a recursive for, a filter, a method) looks
        # at the clock: a macro calling itself twice per call never reaches a loop check
        check_time(_DEADLINE.get())
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, dict) and attribute in obj:
            return obj[attribute]
        return _sized(obj, attribute, super().getattr(obj, attribute))

    def getitem(self, obj: Any, argument: Any) -> Any:
        value = super().getitem(obj, argument)
        return _sized(obj, argument, value) if isinstance(argument, str) else value

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        template, mapping = value.__self__, value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            # '{0:>1000000000}'.format(1) is refused before it allocates a gigabyte
            format_widths(template, () if mapping else args,
                          (args[0] if args else {}) if mapping else kwargs)
            return charge(wrapped(*args, **kwargs))
        return checked

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        return charge({"+": _add, "*": _mul, "**": _pow, "%": _mod}[operator](left, right))

    def checked_concat(self, values: tuple[Any, ...]) -> str:
        """``a ~ b ~ ...``: the values as text, joined within the size limit."""
        parts = [_str(value) for value in values]
        _limit(sum(map(len, parts)), limits._MAX_SIZE, "concatenation (~)")
        return charge("".join(parts))


#: String methods whose size argument is checked before they run.
_SIZED_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs", "replace",
                            "join"})


def _sized(obj: Any, name: Any, value: Any) -> Any:
    """A string's method that could allocate without bound, checked (as the interpreter
    checks it) before it runs; anything else as it is."""
    if not isinstance(obj, str) or name not in _SIZED_METHODS or not callable(value):
        return value

    def checked(*args: Any, **kwargs: Any) -> Any:
        listed = _method_args(obj, name, list(args), kwargs)
        return charge(value(*listed, **kwargs))
    return checked


class _CheckedRange(Sequence[int]):
    """``range`` for templates, looking at the clock as it is iterated: a loop over it
    with an empty body calls nothing else the sandbox could check."""

    def __init__(self, *args: int) -> None:
        self._range: range = safe_range(*args)

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, index: Any) -> Any:
        return self._range[index]

    def __iter__(self) -> Iterator[int]:
        deadline = _DEADLINE.get()
        for count, item in enumerate(self._range):
            if not count & 1023:
                check_time(deadline)
            yield item


# optimized=False: Jinja would otherwise fold constant expressions (``10 ** 10 ** 6``) at
# compile time, past the sandbox's checked operators.
_ENV = _Sandbox(undefined=StrictUndefined, keep_trailing_newline=True, finalize=_finalize,
                optimized=False)
_ENV.globals.clear()  # cycler, joiner, lipsum and namespace are not needed
_ENV.globals.update(range=_CheckedRange, dict=dict)
_ENV.filters.update(
    json=lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False),
    fromjson=json.loads,
)
# Compiled templates call filters directly, past the sandbox: each one is checked itself
# (center(10**9) is refused before it allocates a gigabyte).
_ENV.filters.update({name: guarded(f) for name, f in _ENV.filters.items()})
_JINJA_ROUND = _ENV.filters["round"]


@functools.wraps(_JINJA_ROUND)
def _round_filter(value: Any, precision: int = 0, method: str = "common") -> Any:
    """Jinja's ``round``, refusing a precision past _MAX_EXPONENT digits (it would raise
    10 to that power first)."""
    if isinstance(precision, int) and abs(precision) > limits._MAX_EXPONENT:
        raise _TooLarge(f"round() to {precision} digits (limit {limits._MAX_EXPONENT})")
    return _JINJA_ROUND(value, precision, method)


_ENV.filters["round"] = _round_filter


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
    except _TooLarge as exc:
        raise ExpressionLimit(f"expression limit: {str(exc).rstrip('.')} in template "
                              f"{source!r}", source) from None
    except (TemplateError, _Refusal) as exc:
        raise ExpressionError(f"{str(exc).rstrip('.')} in template {source!r}", source) from None
    except RecursionError:
        raise ExpressionError(f"template {source!r} is nested too deeply", source) from None
    except MemoryError:  # whatever allocated it, the step fails, not the process
        raise ExpressionLimit(f"expression limit: memory: template {source!r} ran out of "
                              "memory ([limits] max_memory)", source) from None
    except _PY_ERRORS as exc:
        raise ExpressionError(f"{type(exc).__name__}: {exc} in template {source!r}",
                              source) from None


def _held_by_frames(entry: Any, namespace: Mapping[str, Any]) -> Callable[[Any], int]:
    """What a template holds: the locals of every frame between ``entry`` (where the
    rendering started) and the caller (a compiled template keeps its variables, and each
    macro call its arguments, in frame locals), less the namespace it was given."""
    given = (namespace, *namespace.values())

    def held(made: Any) -> int:
        frame, roots = inspect.currentframe(), [made]
        frame = frame.f_back if frame is not None else None  # not this function's locals
        while frame is not None and frame is not entry:
            roots.append(frame.f_locals)
            frame = frame.f_back
        return held_bytes(*roots, ignore=given, deadline=_DEADLINE.get())

    return held


def _render_string(source: str, namespace: Mapping[str, Any]) -> Any:
    deadline = budget()
    token = _DEADLINE.set(deadline)
    meter = _METER.set(Meter(_held_by_frames(inspect.currentframe(), namespace), source))
    try:
        with _template_errors(source):
            expression = _native_expression(source)
            if expression is None:
                return _bounded_text(source, namespace, deadline)
            return _plain_template_value(expression(dict(namespace)))
    finally:
        _METER.reset(meter)
        _DEADLINE.reset(token)


def _bounded_text(source: str, namespace: Mapping[str, Any], deadline: float) -> str:
    """A text template rendered piece by piece, stopped when it runs past its deadline or
    past the size limit (a loop in a loop makes text faster than it can be checked
    after)."""
    parts: list[str] = []
    size = 0
    for part in _text_template(source).generate(dict(namespace)):
        size += len(part)
        if size > limits._MAX_SIZE:
            raise ExpressionLimit(f"expression limit: the template makes more than "
                                  f"{limits._MAX_SIZE} characters (max_value_size)", source)
        check_time(deadline, source)
        parts.append(charge(part))
    return "".join(parts)


def _plain_template_value(value: Any) -> Any:
    _walk(value, plain=True)
    return str(value) if isinstance(value, str) else value  # Markup -> str



