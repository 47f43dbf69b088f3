"""A graph-form task's ``task_template``, filled as seed 004 fills it:
``task_template.format(input=..., **input_data)``.

``{input}`` is the node's whole input as text; any other ``{field}`` is a field of the
node's input data (``{field[key]}`` and ``{items[0]}`` index into it; a conversion or a
format spec, ``{n:>5}``, works as in :meth:`str.format`). A dict, list, boolean or null
value is written as JSON, like ``{input}``. Two things :meth:`str.format` allows are
refused, at validation: positional fields (``{}``, ``{0}``: there are no positional
arguments) and attribute access (``{x.y}``: nothing in the input has attributes to read,
and reading Python attributes of values is not something a composition may do).
"""

from __future__ import annotations

import _string  # type: ignore[import-not-found]  # str.format's own field-name parser
import json
import string
from collections.abc import Mapping, Sequence
from typing import Any


class TemplateFieldError(Exception):
    """A field the template names is not in the node's input data."""


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(
        value, sort_keys=True, ensure_ascii=False, default=str)


class _Formatter(string.Formatter):
    def get_field(self, field_name: str, args: Sequence[Any],
                  kwargs: Mapping[str, Any]) -> tuple[Any, str]:
        first, rest = _string.formatter_field_name_split(field_name)
        if first not in kwargs:
            known = ", ".join(sorted(k for k in kwargs if k != "input")) or "none"
            raise TemplateFieldError(f"no field {first!r} in the node's input "
                                     f"(fields: {known})")
        value = kwargs[first]
        for is_attribute, key in rest:
            if is_attribute:  # refused at validation; never read an attribute
                raise TemplateFieldError(f"{{{field_name}}}: attribute access is not allowed")
            try:
                value = value[key]
            except (KeyError, IndexError, TypeError):
                raise TemplateFieldError(f"{{{field_name}}}: nothing at [{key!r}] in the "
                                         f"node's input") from None
        return value, first

    def format_field(self, value: Any, format_spec: str) -> str:
        if isinstance(value, dict | list | bool) or value is None:
            value = _as_text(value)
        try:
            return str(format(value, format_spec))
        except (ValueError, TypeError) as e:
            raise TemplateFieldError(f"cannot format {value!r:.80} with {format_spec!r}: "
                                     f"{e}") from None


def problems(template: str) -> list[str]:
    """What is wrong with a template before any run: bad braces, positional fields,
    attribute access, nested fields in a format spec."""
    found: list[str] = []
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        return [f"{e} (write a literal brace as {{{{ or }}}})"]
    for _, name, spec, _ in parts:
        if name is None:
            continue
        first, rest = _string.formatter_field_name_split(name)
        if first == "" or isinstance(first, int):
            found.append(f"{{{name}}}: positional fields are not allowed; name a field of "
                         "the node's input, or {input}")
        elif any(is_attribute for is_attribute, _ in rest):
            found.append(f"{{{name}}}: attribute access is not allowed; index with "
                         f"{{{first}[key]}}")
        if spec and ("{" in spec or "}" in spec):
            found.append(f"{{{name}:{spec}}}: nested fields in a format spec are not allowed")
    return found


def fields(template: str) -> list[str]:
    """The top-level names a (valid) template reads, ``input`` included."""
    names = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None:
            first = _string.formatter_field_name_split(name)[0]
            if isinstance(first, str) and first and first not in names:
                names.append(first)
    return names


def render(template: str, text: str, data: Mapping[str, Any]) -> str:
    """The task text: ``{input}`` is ``text``, other fields come from ``data``; raises
    :class:`TemplateFieldError` naming a missing field."""
    return _Formatter().vformat(template, (), {**data, "input": text})
