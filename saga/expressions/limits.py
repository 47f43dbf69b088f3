"""The sandbox's limits: how much an evaluation may compute and allocate, and the guarded
operations that check a size before they allocate it."""

from __future__ import annotations

import contextlib
import functools
import re
import string
import sys
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, TypeVar

from saga.errors import ExpressionLimit
from saga.lazy import lazy

if TYPE_CHECKING:
    import jinja2
else:
    jinja2 = lazy("jinja2")  # a value that is not plain data may be Jinja's Undefined

#: Seconds one template, condition or compute block may take (wall clock, checked from
#: inside: a CPU-bound block is stopped, never killed from outside).
DEFAULT_SECONDS = 2.0
DEFAULT_MAX_STEPS = 1_000_000  # nodes a condition or compute block may visit
#: Bytes one evaluation may hold (``[limits] max_memory``): see :class:`Meter`.
DEFAULT_MAX_MEMORY = 64 * 2**20


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


class _TooLarge(_Refusal):
    """A refusal because a value or an operation would pass a size limit (reported as
    :class:`ExpressionLimit`, saying what was exceeded)."""


def _limit(size: int, limit: int, what: str) -> None:
    if size > limit:
        raise _TooLarge(f"{what} would be too large ({size} > {limit})")


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
            if plain and not isinstance(item, _PLAIN):
                if isinstance(item, jinja2.Undefined):
                    raise _Refusal(item._undefined_message.rstrip("."))
                raise _Refusal(f"evaluated to a {type(item).__name__}, which is not plain data "
                               "(wrap iterators in list(...))")
            continue
        count += len(children)
        if count > _MAX_REPEAT:
            raise _TooLarge(f"value has more than {_MAX_REPEAT} nested items")
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
        raise _TooLarge(f"exponent {b} is too large (limit {_MAX_EXPONENT})")
    if isinstance(a, int) and isinstance(b, int) and b > 0:
        _limit(a.bit_length() * b, _MAX_INT_BITS, "power (bits)")
    return a**b


def _lshift(a: Any, b: Any) -> Any:
    if isinstance(b, int) and b > _MAX_SHIFT:
        raise _TooLarge(f"shift by {b} is too large (limit {_MAX_SHIFT})")
    if isinstance(a, int) and isinstance(b, int):
        _limit(a.bit_length() + b, _MAX_INT_BITS, "shifted integer (bits)")
    return a << b


def _mod(a: Any, b: Any) -> Any:
    if isinstance(a, str):
        raise _Refusal("%-formatting of strings is not allowed; use an f-string")
    return a % b


def _range(*args: int) -> range:
    """``range`` refusing more than _MAX_RANGE items."""
    result = range(*args)
    try:
        size = len(result)
    except OverflowError:
        size = _MAX_RANGE + 1
    if size > _MAX_RANGE:
        raise _TooLarge(f"range longer than {_MAX_RANGE} items is not allowed")
    return result


def _round(number: Any, ndigits: Any = None) -> Any:
    """``round``, refusing a precision past _MAX_EXPONENT digits (an integer rounded to
    ``-10**9`` digits computes ``10**10**9`` first)."""
    if isinstance(ndigits, int) and abs(ndigits) > _MAX_EXPONENT:
        raise _TooLarge(f"round() to {ndigits} digits (limit {_MAX_EXPONENT})")
    return round(number) if ndigits is None else round(number, ndigits)


def format_widths(fmt: str, args: Any = (), kwargs: Any = None) -> None:
    """Refuse a ``str.format`` template whose widths or precisions pass _MAX_WIDTH, or
    that takes them from an argument past it (``'{0:>{1}}'``), before it allocates."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # format itself reports the malformed template
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if any(int(n) > _MAX_WIDTH for n in re.findall(r"\d+", spec)):
            raise _TooLarge(f"format spec {spec!r} is too wide (limit {_MAX_WIDTH})")
        if "{" in spec:  # a nested field: its value becomes a width
            values = [*args, *(kwargs or {}).values()]
            if any(isinstance(v, int) and abs(v) > _MAX_WIDTH for v in values):
                raise _TooLarge(f"a width past {_MAX_WIDTH} in format spec {spec!r}")


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


def _method_args(owner: Any, name: str, args: list[Any], kwargs: dict[str, Any]) -> list[Any]:
    """Refuse method calls that could allocate without bound; returns the (listed) args."""
    if name in {"center", "ljust", "rjust", "zfill"} and args and isinstance(args[0], int):
        _limit(args[0], _MAX_SIZE, f"str.{name}() result")
    elif name == "expandtabs" and args and isinstance(args[0], int):
        _limit(len(owner) + owner.count("\t") * args[0], _MAX_SIZE, "str.expandtabs() result")
    elif name in {"format", "format_map"} and isinstance(owner, str):
        format_widths(owner, args, kwargs if name == "format" else (args[0] if args else {}))
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
        raise _TooLarge(f"format spec {spec!r} is too wide")
    return format(value, spec)


# -- the interpreter ------------------------------------------------------------------------


#: The evaluation's deadline (a ``time.monotonic()`` value), for what runs inside it.
_DEADLINE: ContextVar[float | None] = ContextVar("saga_expression_deadline", default=None)
_SECONDS = [DEFAULT_SECONDS]
_MAX_MEMORY = [DEFAULT_MAX_MEMORY]


def configure(seconds: float | None = None, *, max_value_size: int | None = None,
              max_items: int | None = None, max_memory: int | None = None) -> None:
    """Set the limits of every evaluation in this process (saga.toml ``[limits]``): the
    wall-clock budget (``expression_seconds``), the largest string or collection an
    operation may make (``max_value_size``), how many items one value may nest or a
    repetition may make (``max_items``), and the bytes one evaluation may hold
    (``max_memory``)."""
    global _MAX_SIZE, _MAX_REPEAT
    if seconds is not None:
        if seconds <= 0:
            raise ValueError("expression_seconds must be positive")
        _SECONDS[0] = float(seconds)
    if max_memory is not None:
        if max_memory < 2**20:
            raise ValueError("max_memory must be at least 1 MiB (1048576 bytes)")
        _MAX_MEMORY[0] = max_memory
    for name, value in (("max_value_size", max_value_size), ("max_items", max_items)):
        if value is not None and value < 1_000:
            raise ValueError(f"{name} must be at least 1000")
    if max_value_size is not None:
        _MAX_SIZE = max_value_size
    if max_items is not None:
        _MAX_REPEAT = max_items


def budget(seconds: float | None = None) -> float:
    """The deadline of an evaluation starting now: the configured budget, or ``seconds``
    when shorter (a step's timeout), or the deadline of an evaluation it runs inside."""
    limit = _SECONDS[0] if seconds is None else min(seconds, _SECONDS[0])
    own = time.monotonic() + limit
    outer = _DEADLINE.get()
    return own if outer is None else min(own, outer)


def check_time(deadline: float | None, source: str | None = None) -> None:
    """ExpressionLimit once the deadline passed."""
    if deadline is not None and time.monotonic() > deadline:
        raise ExpressionLimit(f"expression limit: took longer than its {_SECONDS[0]:g}s "
                              "budget ([limits] expression_seconds)", source)


def guarded(func: Callable[..., Any]) -> Callable[..., Any]:
    """A template filter or function checked like the interpreter's operations: not past
    the deadline, no size argument past the limits, no result past them."""
    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        check_time(_DEADLINE.get())
        for arg in (*args, *kwargs.values()):
            if isinstance(arg, int) and not isinstance(arg, bool) and abs(arg) > _MAX_SIZE:
                raise ExpressionLimit(f"expression limit: {func.__name__}() given {arg} "
                                      f"(max_value_size {_MAX_SIZE})")
        result = func(*args, **kwargs)
        if isinstance(result, str | list | dict) and len(result) > _MAX_SIZE:
            raise ExpressionLimit(f"expression limit: {func.__name__}() made a value of "
                                  f"{len(result)} (max_value_size {_MAX_SIZE})")
        return charge(result)
    return call


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Every evaluation inside finishes within ``seconds`` too (a step's timeout covers
    the templates and conditions evaluated for it), besides its own budget."""
    if seconds is None:
        yield
        return
    token = _DEADLINE.set(budget(seconds))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


# -- the memory ceiling ---------------------------------------------------------------------


_CONTAINERS = (list, tuple, dict, set, frozenset)
_CONTAINER_TYPES = frozenset(_CONTAINERS)


def _sampled_size(value: Any) -> int:
    """Roughly the bytes ``value`` and its items take, in constant time: its own size, plus
    its length times the mean size of its first few items (a list a C function filled, such
    as ``s.split()``, holds new strings the interpreter never saw being made)."""
    size = sys.getsizeof(value)
    if isinstance(value, _CONTAINERS) and value:
        if isinstance(value, list | tuple):  # spread out: the first ones may be shared
            items = [value[i * len(value) // 8] for i in range(min(8, len(value)))]
        else:
            items = list(islice(value.items() if isinstance(value, dict) else value, 8))
        sample = sum(_flat_size(item) for item in items)
        size += sample * len(value) // len(items)
    return size


def _flat_size(item: Any) -> int:
    if isinstance(item, tuple) and len(item) == 2:  # a dict's (key, value)
        return _own_size(item[0]) + _own_size(item[1])
    return _own_size(item)


def _own_size(item: Any) -> int:
    """``item``'s size, but 0 for what Python shares (None, booleans, small integers)."""
    kind = type(item)
    if (kind is int and -5 <= item <= 256) or item is None or kind is bool:
        return 0
    return sys.getsizeof(item)


def held_bytes(*roots: Any, ignore: tuple[Any, ...] = (),
               deadline: float | None = None) -> int:
    """About the bytes held by ``roots`` and everything they reach, but what is reachable
    only through ``ignore``.

    Everything is counted once however often it is referred to; a number or a short
    string referred to only once is counted without remembering its id (a set of every
    object's id would cost more memory than what it measures). None, booleans and the
    small integers Python shares count nothing.
    """
    seen = {id(item) for item in ignore}
    pending, total, getsizeof = list(roots), 0, sys.getsizeof
    while pending:
        if not len(seen) & 4095:  # walking much held data takes a while
            check_time(deadline)
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        total += getsizeof(item)
        if isinstance(item, dict):
            children: Any = chain(item.keys(), item.values())
        elif isinstance(item, _CONTAINERS):
            children = item
        else:
            continue
        for child in children:
            kind = type(child)
            if (kind is int and -5 <= child <= 256) or child is None or kind is bool:
                continue
            if (kind is int or kind is float or (kind is str and len(child) <= 64)) \
                    and sys.getrefcount(child) <= 3:  # this container's, child's, the call's
                total += getsizeof(child)
            else:
                pending.append(child)
    return total


class Meter:
    """One evaluation's memory account, against ``[limits] max_memory``.

    What the evaluation makes is charged as it is made (an estimate, in constant time per
    value). When what was held at the last measurement plus what was charged since could
    pass the ceiling, ``held`` (when given) measures what the evaluation really still holds
    (freed values do not count), and the evaluation goes on if that is under the ceiling;
    without it, the charges are the measure. A measurement walks what is held, so it
    waits for at least a quarter of the ceiling to be charged: its cost is spread over
    the charges, and what an evaluation holds may pass the ceiling by that much before
    it is stopped.
    """

    def __init__(self, held: Callable[[Any], int] | None = None,
                 source: str | None = None) -> None:
        self.ceiling = _MAX_MEMORY[0]
        self.held, self.source = held, source
        self.last = 0  # bytes held at the last measurement
        self.charged = 0  # bytes charged since
        self.threshold = self.ceiling  # measure once more than this is charged

    def charge(self, nbytes: int, made: Any = None) -> None:
        """Count ``nbytes`` just made (``made``: the value, held by nobody yet)."""
        self.charged += nbytes
        if self.charged > self.threshold:
            self.measure(made)

    def charge_value(self, value: Any) -> None:
        """Charge a value just made (a string, a container), by its estimated size."""
        kind = type(value)
        if kind is str or kind is bytes:
            self.charge(sys.getsizeof(value), value)
        elif kind in _CONTAINER_TYPES:
            self.charge(_sampled_size(value), value)

    def measure(self, made: Any = None) -> None:
        """ExpressionLimit if the evaluation holds more than the ceiling."""
        used = self.last + self.charged if self.held is None else self.held(made)
        if used > self.ceiling:
            raise ExpressionLimit(
                f"expression limit: memory: holds {used / 2**20:.1f} MiB, past its ceiling of "
                f"{self.ceiling / 2**20:g} MiB ([limits] max_memory)", self.source)
        self.last, self.charged = used, 0
        self.threshold = max(self.ceiling - used, self.ceiling >> 2)


#: The meter of the template being rendered, for the operators and filters it calls.
_METER: ContextVar[Meter | None] = ContextVar("saga_expression_meter", default=None)


_T = TypeVar("_T")


def charge(value: _T) -> _T:
    """``value``, charged to the template being rendered (if any)."""
    meter = _METER.get()
    if meter is not None:
        meter.charge_value(value)
    return value
