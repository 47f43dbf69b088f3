"""What makes a value a template: the ``{{``/``{%`` markers, found without Jinja2.

Kept apart from :mod:`saga.expressions.jinja` so that checking a composition, or running
one whose parameters are plain values, does not import Jinja2 at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def is_template(value: str) -> bool:
    """Whether ``value`` is a string containing Jinja markers (``{{`` or ``{%``)."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _whole_template(text: str) -> bool:
    text = text.strip()
    return text.startswith("{{") and text.endswith("}}")


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
