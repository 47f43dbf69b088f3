"""saga.toml's notification settings: its ``[[notify]]`` targets (for every run of the
store) and the ``[notifications]`` table that delivery follows (see
:mod:`saga.worker.notify`)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from saga.composition.definition import parse_duration
from saga.composition.notify import NotifyTarget
from saga.config import Settings
from saga.errors import ConfigError


@dataclass(frozen=True)
class NotifySettings:
    """saga.toml's ``[notifications]``: how long a notification is retried (``horizon``,
    from its event's time), the longest wait between attempts (``backoff_max``), one
    request's ``timeout``, and the viewer's address (``url_of_runs``) that bodies link
    runs to (``<url_of_runs>/runs/<run id>``)."""

    horizon: float = 86400.0
    backoff_max: float = 600.0
    timeout: float = 10.0
    url_of_runs: str | None = None


def notify_settings(settings: Settings) -> NotifySettings:
    """The ``[notifications]`` settings (ConfigError when one is not a duration)."""
    table = settings.file.get("notifications") or {}
    if not isinstance(table, dict):
        raise ConfigError('[notifications] must be a table: horizon = "24h"')
    unknown = set(table) - {"horizon", "backoff_max", "timeout", "url_of_runs"}
    if unknown:
        raise ConfigError(f"[notifications] takes horizon, backoff_max, timeout and "
                          f"url_of_runs, not {', '.join(sorted(unknown))}")
    times: dict[str, float] = {}
    for name in ("horizon", "backoff_max", "timeout"):
        if name in table:
            try:
                seconds = parse_duration(table[name])
            except (TypeError, ValueError):
                seconds = None
            if not seconds:
                raise ConfigError(f"[notifications] {name} must be a duration such as "
                                  f"'90s', '10m' or '24h', not {table[name]!r}")
            times[name] = seconds
    base = table.get("url_of_runs")
    return NotifySettings(**times, url_of_runs=str(base).rstrip("/") if base else None)


def config_targets(settings: Settings) -> list[NotifyTarget]:
    """saga.toml's ``[[notify]]`` entries, every problem reported at once."""
    entries = settings.file.get("notify") or []
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list):
        raise ConfigError('[[notify]] must be a list of tables: url = "https://...", '
                          'events = ["run.failed"], secret_env = "HOOK_SECRET"')
    targets, problems = [], []
    for index, entry in enumerate(entries):
        try:
            targets.append(NotifyTarget.model_validate(entry))
        except ValidationError as e:
            for err in e.errors():
                where = ".".join(str(p) for p in err["loc"])
                problems.append(f"[[notify]] #{index + 1}{' ' + where if where else ''}: "
                                f"{err['msg'].removeprefix('Value error, ')}")
    if problems:
        raise ConfigError("; ".join(problems))
    return targets
