"""Secrets never enter the log.

A template reads a secret as ``{{ secret.NAME }}``; an input declared ``secret: true`` is
one too. What the scheduler renders, and so what ``StepStarted`` records, is a marker
(``«secret:NAME»``), never the value. The executor swaps markers for values just before a
tool is called, and swaps any value a tool echoes back for its marker again before the
output or error is recorded. Values come from this process (secret inputs given to the
run that started here) or from the environment, and only from an allowlist:
``SAGA_SECRET_NAME`` (the name as written, or upper-cased), or ``NAME`` itself when
saga.toml declares it (``[secrets] allow = ["GITHUB_TOKEN"]``). saga's own settings
(``SAGA_AUDIT_KEY``, ``SAGA_DATABASE_URL``, every ``SAGA_*`` that is not
``SAGA_SECRET_*``) are never readable, declared or not: a composition must not be able
to send the audit key to a server of its choosing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from typing import Any

from saga.errors import ToolError

_MARK = re.compile(r"«secret:([A-Za-z_][A-Za-z0-9_]*)»")


def marker(name: str) -> str:
    """The text that stands for a secret in everything recorded."""
    return f"«secret:{name}»"


class SecretNames(dict[str, str]):
    """The ``secret`` name templates see: any attribute is that secret's marker."""

    def __missing__(self, key: str) -> str:
        return marker(key)


#: Values of secret inputs of runs started in this process, by run id (never stored).
_PROCESS: dict[str, dict[str, str]] = {}


def remember(run_id: str, values: Mapping[str, str]) -> None:
    """Keep a run's secret input values in this process only."""
    if values:
        _PROCESS.setdefault(run_id, {}).update(values)


def share(parent_run_id: str, child_run_id: str) -> None:
    """Let a nested run see its parent's secret inputs (they reach it as markers)."""
    if parent_run_id in _PROCESS:
        _PROCESS.setdefault(child_run_id, {}).update(_PROCESS[parent_run_id])


def names_in(value: Any) -> set[str]:
    """The secrets a (rendered) value refers to."""
    if isinstance(value, str):
        return set(_MARK.findall(value))
    if isinstance(value, dict):
        return set().union(*(names_in(k) | names_in(v) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return set().union(*(names_in(v) for v in value))
    return set()


def forbidden(name: str) -> bool:
    """saga's own settings are never secrets a composition may read."""
    upper = name.upper()
    return upper.startswith("SAGA_") and not upper.startswith("SAGA_SECRET_")


def lookup(run_id: str, names: set[str], env: Mapping[str, str] | None = None,
           allow: Collection[str] = ()) -> dict[str, str]:
    """The values of these secrets, or a ToolError naming the first one that is refused or
    missing. ``allow``: environment variables saga.toml lets compositions read by name."""
    env = os.environ if env is None else env
    found = {}
    for name in sorted(names):
        if forbidden(name):
            raise ToolError(f"secret {name!r} is one of saga's own settings and is never "
                            "readable", error_type="SecretRefused", retryable=False)
        value = _PROCESS.get(run_id, {}).get(name)
        for candidate in (f"SAGA_SECRET_{name}", f"SAGA_SECRET_{name.upper()}"):
            value = env.get(candidate) if value is None else value
        if value is None and name in allow:
            value = env.get(name)
        if value is None:
            hint = f"SAGA_SECRET_{name.upper()}" + (f" or {name}" if name in allow else
                                                    f" (or allow {name} in saga.toml "
                                                    "[secrets] allow)")
            raise ToolError(f"secret {name!r} is not available: set {hint}",
                            error_type="SecretMissing", retryable=False)
        found[name] = value
    return found


def reveal(value: Any, values: Mapping[str, str]) -> Any:
    """Replace markers by secret values (just before a call)."""
    if not values:
        return value
    if isinstance(value, str):
        return _MARK.sub(lambda m: values.get(m.group(1), m.group(0)), value)
    if isinstance(value, dict):
        return {reveal(k, values): reveal(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [reveal(v, values) for v in value]
    return value


def conceal(value: Any, values: Mapping[str, str]) -> Any:
    """Replace every occurrence of a secret value by its marker (before recording)."""
    if not values:
        return value
    if isinstance(value, str):
        for name, secret in sorted(values.items(), key=lambda kv: -len(kv[1])):
            if secret:
                value = value.replace(secret, marker(name))
        return value
    if isinstance(value, dict):
        return {conceal(k, values): conceal(v, values) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [conceal(v, values) for v in value]
    return value
