"""Schedules: compositions started on a cron expression or every N seconds (seed 002's
daemon and cron), fired by workers.

A schedule is a row of ``saga_schedules``: its name, the composition as it was when the
schedule was added (so editing the file later changes nothing already scheduled), its
inputs, a cron expression (with a time zone) or an interval, a catch-up policy, whether it
is paused, and ``next_due``, the next time it fires. Every worker, on every machine, looks
at the due schedules each time it polls. Firing a due time starts the run whose id is
derived from the schedule and the due time (``nightly@2026-11-22T02:00:00+00:00``), so two
workers firing the same time start one run: the second start finds the first (run ids are
idempotent, see :meth:`saga.api.Saga.start`). ``next_due`` then moves on by compare and
set. The run sees the due time as ``context.scheduled_at``.

Missed times (no worker was running) follow the schedule's ``catch_up``: ``skip`` (the
default) fires only the latest missed time, ``all`` fires each of them (at most
:data:`MAX_CATCH_UP` at once).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from saga.composition.definition import parse_duration
from saga.errors import ConfigError, InputError, Problem, RunNotFoundError
from saga.lazy import lazy
from saga.store.side_tables import Database

if TYPE_CHECKING:
    import croniter as cron_  # type: ignore[import-untyped]
else:
    # Only a cron schedule needs it: a worker with none (most) does not load it, and
    # its import runs the `file` command (croniter asks platform.architecture()).
    cron_ = lazy("croniter")

DDL = ("""CREATE TABLE IF NOT EXISTS saga_schedules (
    name TEXT PRIMARY KEY, source TEXT NOT NULL, definition TEXT NOT NULL,
    inputs TEXT NOT NULL, cron TEXT, every_seconds DOUBLE PRECISION, timezone TEXT NOT NULL,
    catch_up TEXT NOT NULL, paused INTEGER NOT NULL, next_due TEXT NOT NULL,
    created_at TEXT NOT NULL)""",)
COLUMNS = ("name", "source", "definition", "inputs", "cron", "every_seconds", "timezone",
           "catch_up", "paused", "next_due", "created_at")
#: The most missed times one look fires for a schedule with ``catch_up: all``.
MAX_CATCH_UP = 100

#: ``start(definition, inputs, run_id, scheduled_at)``: starts (or finds) one run.
Starter = Callable[[dict[str, Any], dict[str, Any], str, str], Any]


@dataclass(frozen=True)
class Schedule:
    """One schedule, as stored."""

    name: str
    source: str
    definition: dict[str, Any]
    inputs: dict[str, Any] = field(default_factory=dict)
    cron: str | None = None
    every_seconds: float | None = None
    timezone: str = "UTC"
    catch_up: str = "skip"
    paused: bool = False
    next_due: str = ""
    created_at: str = ""

    def after(self, moment: datetime) -> datetime:
        """The first due time strictly after ``moment``."""
        if self.every_seconds:
            return moment + timedelta(seconds=self.every_seconds)
        zone = ZoneInfo(self.timezone)
        nxt: datetime = cron_.croniter(self.cron, moment.astimezone(zone)).get_next(datetime)
        return nxt.astimezone(UTC)

    def to_json(self) -> dict[str, Any]:
        """The schedule as plain JSON (without its definition's body)."""
        return {"name": self.name, "source": self.source,
                "definition": self.definition.get("name"), "inputs": self.inputs,
                "cron": self.cron, "every_seconds": self.every_seconds,
                "timezone": self.timezone, "catch_up": self.catch_up, "paused": self.paused,
                "next_due": self.next_due}


def check(name: str, cron: str | None, every: str | float | None, timezone: str,
          catch_up: str) -> float | None:
    """Every problem with a schedule's settings at once; the interval in seconds."""
    problems = []
    if not name or len(name) > 100 or not all(c.isalnum() or c in "._-" for c in name):
        problems.append(Problem("name", "1-100 letters, digits and ._-"))
    if (cron is None) == (every is None):
        problems.append(Problem("schedule", "give exactly one of --cron and --every"))
    if cron is not None and not cron_.croniter.is_valid(cron):
        problems.append(Problem("--cron", f"{cron!r} is not a cron expression"))
    seconds = parse_duration(every) if every is not None else None
    if every is not None and not seconds:
        problems.append(Problem("--every", f"{every!r} is not a duration such as 30s or 5m"))
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        problems.append(Problem("--timezone", f"unknown time zone {timezone!r}"))
    if catch_up not in ("skip", "all"):
        problems.append(Problem("--catch-up", "skip or all"))
    if problems:
        raise InputError(problems)
    return seconds


class Schedules:
    """The ``saga_schedules`` table of one store."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
                 ) -> None:
        self.db = db
        self.clock = clock
        db.create(DDL)

    def add(self, name: str, source: str, definition: dict[str, Any],
            inputs: Mapping[str, Any] | None = None, *, cron: str | None = None,
            every: str | float | None = None, timezone: str = "UTC",
            catch_up: str = "skip", replace: bool = False) -> Schedule:
        """Add (or, with ``replace``, change) a schedule; its first due time is the first
        one after now."""
        seconds = check(name, cron, every, timezone, catch_up)
        now = self.clock()
        draft = Schedule(name, source, definition, dict(inputs or {}), cron, seconds, timezone,
                         catch_up, False, "", now.isoformat())
        schedule = Schedule(**{**draft.__dict__, "next_due": draft.after(now).isoformat()})
        if not replace and self.get(name, missing_ok=True) is not None:
            raise InputError([Problem("name", f"a schedule named {name!r} exists (remove it "
                                              "first, or replace it)")])
        row = _row(schedule)
        self.db.execute("DELETE FROM saga_schedules WHERE name = ?", (name,))
        self.db.execute(f"INSERT INTO saga_schedules ({', '.join(COLUMNS)}) "
                        f"VALUES ({', '.join('?' for _ in COLUMNS)})", row)
        return schedule

    def get(self, name: str, missing_ok: bool = False) -> Schedule | None:
        """One schedule by name."""
        rows = self.db.query(f"SELECT {', '.join(COLUMNS)} FROM saga_schedules "
                             "WHERE name = ?", (name,))
        if not rows:
            if missing_ok:
                return None
            raise RunNotFoundError(f"schedule {name}")
        return _schedule(rows[0])

    def all(self) -> list[Schedule]:
        """Every schedule, by name."""
        rows = self.db.query(f"SELECT {', '.join(COLUMNS)} FROM saga_schedules ORDER BY name")
        return [_schedule(r) for r in rows]

    def sync(self, declared: Mapping[str, dict[str, Any]],
             load: Callable[[str], dict[str, Any]]) -> None:
        """Add or change the schedules saga.toml declares (see :func:`from_config`),
        ``load(file)`` giving a file's recorded definition; unchanged ones stay as they are
        (their next due time too)."""
        for name, table in declared.items():
            source = str(table.get("file", ""))
            definition = load(source)
            current = self.get(name, missing_ok=True)
            wanted = (source, definition, dict(table.get("inputs") or {}), table.get("cron"),
                      table.get("timezone", "UTC"), table.get("catch_up", "skip"))
            if current is not None and (current.source, current.definition, current.inputs,
                                        current.cron, current.timezone,
                                        current.catch_up) == wanted \
                    and current.every_seconds == (parse_duration(table["every"])
                                                  if table.get("every") else None):
                continue
            self.add(name, source, definition, wanted[2], cron=wanted[3],
                     every=table.get("every"), timezone=wanted[4], catch_up=wanted[5],
                     replace=True)

    def remove(self, name: str) -> None:
        """Remove a schedule (runs it started are kept)."""
        if not self.db.execute("DELETE FROM saga_schedules WHERE name = ?", (name,)):
            raise RunNotFoundError(f"schedule {name}")

    def set_paused(self, name: str, paused: bool) -> Schedule:
        """Pause or resume a schedule; resuming skips the times missed while paused."""
        schedule = self.get(name)
        assert schedule is not None
        nxt = schedule.next_due if paused else schedule.after(self.clock()).isoformat()
        self.db.execute("UPDATE saga_schedules SET paused = ?, next_due = ? WHERE name = ?",
                        (int(paused), nxt, name))
        return self.get(name)  # type: ignore[return-value]

    def fire_due(self, start: Starter) -> list[str]:
        """Start the runs of every due time of every schedule; the run ids started."""
        now = self.clock()
        started = []
        rows = self.db.query(f"SELECT {', '.join(COLUMNS)} FROM saga_schedules "
                             "WHERE paused = 0 AND next_due <= ?", (now.isoformat(),))
        for schedule in map(_schedule, rows):
            times = _due_times(schedule, now)
            for due in times:
                run_id = f"{schedule.name}@{due.isoformat()}"
                start(schedule.definition, schedule.inputs, run_id, due.isoformat())
                started.append(run_id)
            nxt = schedule.after(times[-1] if times else now).isoformat()
            # Compare and set: of workers firing at once, one moves the schedule on; the
            # others' starts found the same runs.
            self.db.execute("UPDATE saga_schedules SET next_due = ? WHERE name = ? "
                            "AND next_due = ?", (nxt, schedule.name, schedule.next_due))
        return started


def _due_times(schedule: Schedule, now: datetime) -> list[datetime]:
    """The due times to fire now: every missed one for ``catch_up: all``, else the
    latest."""
    due = datetime.fromisoformat(schedule.next_due)
    times: list[datetime] = []
    while due <= now and len(times) < MAX_CATCH_UP:
        times.append(due)
        due = schedule.after(due)
    if schedule.catch_up == "skip":
        times = times[-1:]
    return times


def from_config(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Schedules declared in saga.toml (``[schedules.NAME]`` with ``file``, ``cron`` or
    ``every``, ``inputs``, ``timezone``, ``catch_up``), by name."""
    declared = config.get("schedules") or {}
    if not isinstance(declared, dict) or not all(isinstance(v, dict) for v in declared.values()):
        raise ConfigError("saga.toml [schedules.NAME] tables must each have file and cron or "
                          "every")
    return {name: dict(table) for name, table in declared.items()}


def _row(s: Schedule) -> tuple[Any, ...]:
    return (s.name, s.source, json.dumps(s.definition), json.dumps(s.inputs), s.cron,
            s.every_seconds, s.timezone, s.catch_up, int(s.paused), s.next_due, s.created_at)


def _schedule(row: Mapping[str, Any]) -> Schedule:
    return Schedule(name=row["name"], source=row["source"],
                    definition=json.loads(row["definition"]), inputs=json.loads(row["inputs"]),
                    cron=row["cron"], every_seconds=row["every_seconds"],
                    timezone=row["timezone"], catch_up=row["catch_up"],
                    paused=bool(row["paused"]), next_due=row["next_due"],
                    created_at=row["created_at"])
