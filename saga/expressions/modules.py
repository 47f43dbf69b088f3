"""The modules a compute block may import (seed 002): ``json``, ``math``, ``re`` and
``datetime``, each a fixed set of functions that stay within the sandbox's limits.

Only compute blocks import: a compute step's result is recorded, so reading the clock
there (``datetime.now()``) is fine; conditions and templates cannot import and stay pure.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Callable
from typing import Any

from saga.expressions import limits
from saga.expressions.limits import _limit, _Refusal, _walk

#: Longest text a regular expression may search (characters).
MAX_REGEX_TEXT = 1_000_000
_NESTED_REPEAT = re.compile(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)\s*[+*{]")


class SafeModule:
    """A module (or class) as a compute block sees it: named members only; calling it
    calls ``constructor`` when it has one (``datetime(2026, 1, 1)``)."""

    def __init__(self, name: str, members: dict[str, Any],
                 constructor: Callable[..., Any] | None = None) -> None:
        self.name, self.members, self.constructor = name, members, constructor

    def member(self, attribute: str) -> Any:
        """A member, or a refusal naming what there is."""
        if attribute not in self.members:
            raise _Refusal(f"{self.name}.{attribute} is not available (there is: "
                           f"{', '.join(sorted(self.members))})")
        return self.members[attribute]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.constructor is None:
            raise _Refusal(f"{self.name} cannot be called")
        return self.constructor(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<module {self.name}>"


def _dumps(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> str:
    _walk(value, plain=True)
    if indent is not None:
        _limit(indent, 16, "json.dumps indent")
    return json.dumps(value, indent=indent, sort_keys=sort_keys, ensure_ascii=False)


def _loads(text: str) -> Any:
    if not isinstance(text, str):
        raise _Refusal("json.loads takes a string")
    _limit(len(text), limits._MAX_SIZE, "json.loads text")
    return json.loads(text)


def _pattern(pattern: Any) -> str:
    if not isinstance(pattern, str):
        raise _Refusal("a regular expression is a string")
    if _NESTED_REPEAT.search(pattern):
        raise _Refusal(f"pattern {pattern!r} repeats a group that itself repeats: matching "
                       "it can take exponential time")
    return pattern


def _regex(func: Callable[..., Any]) -> Callable[..., Any]:
    """``re.func`` with its pattern checked and its text bounded."""
    def call(pattern: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(text, str):
            raise _Refusal(f"re.{func.__name__} searches a string")
        _limit(len(text), MAX_REGEX_TEXT, f"re.{func.__name__} text")
        result = func(_pattern(pattern), text, *args, **kwargs)
        if isinstance(result, re.Match):  # a match object: its groups, as plain data
            return {"match": result.group(0), "groups": list(result.groups()),
                    "named": result.groupdict(), "start": result.start(), "end": result.end()}
        return result
    call.__name__ = func.__name__
    return call


def _sub(pattern: Any, replacement: Any, text: Any, count: int = 0) -> str:
    if not isinstance(text, str) or not isinstance(replacement, str):
        raise _Refusal("re.sub replaces strings in a string")
    _limit(len(text), MAX_REGEX_TEXT, "re.sub text")
    result = re.sub(_pattern(pattern), replacement, text, count=count)
    _limit(len(result), limits._MAX_SIZE, "re.sub result")
    return result


_MATH = ("sqrt", "floor", "ceil", "trunc", "fabs", "log", "log2", "log10", "exp", "sin",
         "cos", "tan", "asin", "acos", "atan", "atan2", "hypot", "degrees", "radians",
         "isclose", "isfinite", "isinf", "isnan", "gcd", "copysign", "fsum", "prod")

_DATETIME = SafeModule("datetime", {
    "now": _dt.datetime.now, "utcnow": lambda: _dt.datetime.now(_dt.UTC),
    "fromisoformat": _dt.datetime.fromisoformat, "strptime": _dt.datetime.strptime,
    "fromtimestamp": _dt.datetime.fromtimestamp, "combine": _dt.datetime.combine,
}, _dt.datetime)
_DATE = SafeModule("date", {"today": _dt.date.today, "fromisoformat": _dt.date.fromisoformat},
                   _dt.date)
_TIMEDELTA = SafeModule("timedelta", {}, _dt.timedelta)
_TIMEZONE = SafeModule("timezone", {"utc": _dt.UTC}, _dt.timezone)

#: What ``import NAME`` / ``from NAME import MEMBER`` may name.
MODULES: dict[str, SafeModule] = {
    "json": SafeModule("json", {"dumps": _dumps, "loads": _loads}),
    "math": SafeModule("math", {**{name: getattr(math, name) for name in _MATH},
                                "pi": math.pi, "e": math.e, "inf": math.inf, "nan": math.nan}),
    "re": SafeModule("re", {
        "search": _regex(re.search), "match": _regex(re.match),
        "fullmatch": _regex(re.fullmatch), "findall": _regex(re.findall),
        "split": _regex(re.split), "sub": _sub, "escape": re.escape,
        "IGNORECASE": re.IGNORECASE, "I": re.IGNORECASE, "MULTILINE": re.MULTILINE,
        "M": re.MULTILINE, "DOTALL": re.DOTALL, "S": re.DOTALL}),
    "datetime": SafeModule("datetime", {"datetime": _DATETIME, "date": _DATE,
                                        "timedelta": _TIMEDELTA, "timezone": _TIMEZONE}),
}

#: Functions a compute block may call once it imported them.
CALLABLES = frozenset(id(member) for module in (*MODULES.values(), _DATETIME, _DATE)
                      for member in module.members.values() if callable(member))

#: Methods and attributes of the values those functions return.
VALUE_MEMBERS: dict[type, frozenset[str]] = {
    _dt.datetime: frozenset({
        "isoformat", "strftime", "timestamp", "date", "time", "replace", "weekday",
        "isoweekday", "astimezone", "year", "month", "day", "hour", "minute", "second",
        "microsecond"}),
    _dt.date: frozenset({"isoformat", "strftime", "weekday", "isoweekday", "replace", "year",
                         "month", "day"}),
    _dt.timedelta: frozenset({"total_seconds", "days", "seconds", "microseconds"}),
}


def import_problem(module: str, names: list[str] | None) -> str | None:
    """Why ``import module`` (``names`` None) or ``from module import names`` is refused;
    None when it is allowed."""
    found = MODULES.get(module)
    if found is None:
        return (f"import of {module!r} is not allowed (a compute block may import "
                f"{', '.join(sorted(MODULES))})")
    missing = [n for n in names or () if n not in found.members]
    if missing:
        return f"{module} has no {', '.join(repr(n) for n in missing)} a compute block may use"
    return None
