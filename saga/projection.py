"""The read model: ``saga_runs`` and ``saga_steps`` tables maintained from the event log.

A :class:`Projection` reads the application's notification log in pages, folds each page
into rows, and writes the rows together with the last applied notification id (table
``saga_projection_position``) in ONE transaction of its own connection. A projection that
is stopped or killed therefore resumes exactly where its last commit left off: no event is
missed and none is applied twice. Two further guards make concurrent projectors safe: the
position is advanced with a compare-and-set (a loser re-reads and retries), and a run row
remembers the last event ``version`` folded into it (an older event is ignored).

The same SQL serves SQLite (the file ``saga.db`` the events live in; WAL) and PostgreSQL
(the configured schema): only the placeholder differs. Timestamps are ISO-8601 UTC text
with microseconds in both (so they sort as text, and rows compare equal across stores);
``error`` columns hold the error object as JSON text (``{"message": ..., "type": ...}``).
The tables are shared by every projection name in one database: run one projection
(``name``) per database; the name only keys its position.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from eventsourcing.persistence import Notification

from saga.domain import (
    DECISIONS,
    EVENT_TYPES,
    TOPIC_PREFIX,
    Run,
    event_name,
    ms_between,
    status_after,
)
from saga.errors import StoreUnavailableError
from saga.store.application import SagaApplication
from saga.store.encryption import unopened
from saga.store.partitions import partition_of, parts_of
from saga.store.reconnect import backoff
from saga.store.side_tables import Database

RUN_COLUMNS = ("run_id", "definition_name", "definition_version", "definition_hash", "status",
               "actor", "started_at", "finished_at", "duration_ms", "failed_step", "error",
               "version", "run_name", "labels")
#: Columns added since the first release (added to older tables when they open).
_ADDED_RUN_COLUMNS = {"run_name": "TEXT", "labels": "TEXT"}
STEP_COLUMNS = ("run_id", "step_id", "iteration", "status", "attempts", "started_at",
                "finished_at", "duration_ms", "error", "compensated_at", "running_since")
_ADDED_STEP_COLUMNS = {"running_since": "TEXT"}

# Valid in both dialects: TEXT/BIGINT/INTEGER exist in both, IF NOT EXISTS in both.
DDL = (
    """CREATE TABLE IF NOT EXISTS saga_runs (
        run_id TEXT PRIMARY KEY, definition_name TEXT, definition_version TEXT,
        definition_hash TEXT, status TEXT NOT NULL, actor TEXT, started_at TEXT,
        finished_at TEXT, duration_ms BIGINT, failed_step TEXT, error TEXT,
        version BIGINT NOT NULL, run_name TEXT, labels TEXT)""",
    """CREATE TABLE IF NOT EXISTS saga_steps (
        run_id TEXT NOT NULL, step_id TEXT NOT NULL, iteration INTEGER NOT NULL,
        status TEXT NOT NULL, attempts INTEGER NOT NULL, started_at TEXT, finished_at TEXT,
        duration_ms BIGINT, error TEXT, compensated_at TEXT, running_since TEXT,
        PRIMARY KEY (run_id, step_id, iteration))""",
    """CREATE TABLE IF NOT EXISTS saga_projection_position (
        name TEXT PRIMARY KEY, position BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS saga_runs_started_at ON saga_runs (started_at)",
    "CREATE INDEX IF NOT EXISTS saga_runs_status ON saga_runs (status, started_at)",
)
log = logging.getLogger("saga.projection")
_FOLLOW_CHUNK = 500  # follow() checks stop() at least every this many events

_RUN_TOPICS = frozenset(TOPIC_PREFIX + name for name in EVENT_TYPES)
_DECISIONS = frozenset(TOPIC_PREFIX + name for name in DECISIONS)
Row = dict[str, Any]
StepKey = tuple[str, str, int]  # (run_id, step_id, iteration)


def _upsert(table: str, columns: Sequence[str], key: Sequence[str]) -> str:
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in key)
    return (f"INSERT INTO {table} ({', '.join(columns)}) "
            f"VALUES ({', '.join('?' for _ in columns)}) "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {updates}")


_UPSERT_RUN = _upsert("saga_runs", RUN_COLUMNS, ("run_id",))
_UPSERT_STEP = _upsert("saga_steps", STEP_COLUMNS, ("run_id", "step_id", "iteration"))


def _ts(value: datetime) -> str:
    # Fixed-width UTC text: isoformat() drops microseconds when they are 0, which would
    # break ordering as text.
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def _text(value: Any) -> Any:
    # PostgreSQL text holds no NUL: one run's odd name must not stop the read model.
    return value.replace("\x00", "\ufffd") if isinstance(value, str) else value


class _Fold:
    """Rows of one page's runs, and the pure fold of events into them."""

    def __init__(self, runs: dict[str, Row], steps: dict[StepKey, Row]) -> None:
        self.runs, self.steps = runs, steps
        self.dirty_runs: set[str] = set()
        self.dirty_steps: set[StepKey] = set()

    def step(self, run_id: str, step_id: str, iteration: int) -> Row:
        key = (run_id, step_id, iteration)
        if key not in self.steps:
            self.steps[key] = {c: None for c in STEP_COLUMNS} | {
                "run_id": run_id, "step_id": step_id, "iteration": iteration,
                "status": "pending", "attempts": 0}
        self.dirty_steps.add(key)
        return self.steps[key]

    def apply(self, run_id: str, topic: str, e: Any, waiting: bool = False) -> None:
        """Fold one event (``waiting``: approvals still pending after a decision)."""
        run = self.runs.get(run_id)
        if run is None:
            if event_name(topic) != "RunStarted":
                return  # its start could not be read (and was reported): no half a row
            run = self.runs[run_id] = {c: None for c in RUN_COLUMNS} | {
                "run_id": run_id, "status": "running", "version": 0}
        if e.originator_version <= run["version"]:
            return  # already folded into this row: never apply an event twice
        run["version"] = e.originator_version
        self.dirty_runs.add(run_id)
        ts = _ts(e.timestamp)
        kind = event_name(topic)
        run["status"] = status_after(kind, run["status"], still_waiting=waiting)
        match kind:
            case "RunStarted":
                d = e.definition
                run.update(definition_name=str(d.get("name", "")),
                           definition_version=str(d.get("version", "1")),
                           definition_hash=e.definition_hash, actor=e.context.get("actor"),
                           started_at=ts, run_name=e.context.get("run_id"),
                           labels=_json(e.context.get("labels") or {}))
            case "StepStarted":
                s = self.step(run_id, e.step_id, e.iteration)
                # A retry clears the previous attempt's end; started_at stays the first
                # attempt's start, running_since is this attempt's (as in the Run fold).
                s.update(status="running", attempts=max(s["attempts"], e.attempt), error=None,
                         started_at=s["started_at"] or ts, finished_at=None, duration_ms=None,
                         running_since=ts)
            case "StepCompleted" | "StepFailed":
                s = self.step(run_id, e.step_id, e.iteration)
                failed = kind == "StepFailed"
                # duration_ms is the last attempt's own, as the Run fold has it
                if not failed:
                    s["duration_ms"] = e.duration_ms or ms_between(s["running_since"], ts)
                elif s["running_since"] is not None:
                    s["duration_ms"] = ms_between(s["running_since"], ts)
                s.update(status="failed" if failed else "completed", finished_at=ts,
                         running_since=None,
                         error=_json({"type": e.error_type, "message": e.message})
                         if failed else None)
            case "StepSkipped":
                self.step(run_id, e.step_id, e.iteration).update(status="skipped",
                                                                 finished_at=ts)
            case "StepCompensated":
                self.step(run_id, e.step_id, e.iteration).update(status="compensated",
                                                                 compensated_at=ts)
            case "RunCompleted":
                self._finish(run, ts)
            case "RunFailed" | "RunCompensated":
                self._finish(run, ts, e.error)
                run["failed_step"] = e.failed_step
            case "RunRetried":
                # The run is live again: its last outcome no longer describes it.
                run.update(finished_at=None, duration_ms=None, failed_step=None, error=None)
                for key in getattr(e, "asked_again", ()):  # a rejected step is asked again
                    self.step(run_id, key, 0).update(status="pending", finished_at=None,
                                                     error=None)
            case "RunCancelled":
                self._finish(run, ts, {"type": "cancelled", "message": e.reason or "cancelled"})
            case "DefinitionMigrated":
                run.update(definition_hash=e.to_hash,
                           definition_version=str(e.definition.get("version", "1")))
            case "RunLabelled":
                labels = json.loads(run["labels"] or "{}")
                for key, value in e.changes.items():  # an empty value removes the label
                    if value:
                        labels[key] = value
                    else:
                        labels.pop(key, None)
                run["labels"] = _json(labels)
            case "RunReset":
                run.update(finished_at=None, duration_ms=None, failed_step=None, error=None)
            case "StepsReopened":
                for key in e.steps:  # as never started (the Run fold drops them)
                    step_id, _, rest = key.partition("[")
                    self.step(run_id, step_id, int(rest[:-1] or 0)).update(
                        status="pending", attempts=0, started_at=None, finished_at=None,
                        running_since=None, duration_ms=None, error=None, compensated_at=None)
            # CompensationFailed changes no column: the step stays "completed".

    @staticmethod
    def _finish(run: Row, ts: str, error: Any = None) -> None:
        run.update(finished_at=ts, duration_ms=ms_between(run["started_at"], ts),
                   error=_json(error))


class Projection:
    """Maintains ``saga_runs``/``saga_steps`` from ``app``'s event log; resumable.

    One instance per thread (it owns one connection); many instances or processes may
    run at once, each page is still applied exactly once.
    """

    def __init__(self, app: SagaApplication, name: str = "status") -> None:
        """Open a connection of its own to the app's database (tables made on first use)."""
        self.app = app
        self.name = name
        self._db = Database(app.settings, adopt=app.take_connection())
        self._ready = False

    def create_tables(self) -> None:
        """Create the tables and this projection's position row; idempotent, and safe
        when many processes call it at once."""
        self._db.create(DDL, {"saga_runs": _ADDED_RUN_COLUMNS,
                              "saga_steps": _ADDED_STEP_COLUMNS})
        self._db.execute("INSERT INTO saga_projection_position (name, position) "
                         "VALUES (?, 0) ON CONFLICT (name) DO NOTHING", (self.name,))
        self._ready = True

    def _ensure(self) -> None:
        if not self._ready:
            self.create_tables()

    def position(self) -> int:
        """The id of the last notification applied (0 if none)."""
        self._ensure()
        rows = self._db.query("SELECT position FROM saga_projection_position WHERE name = ?",
                              (self.name,))
        return int(rows[0]["position"]) if rows else 0

    def head(self) -> int:
        """The highest notification id in the log (0 if the log is empty)."""
        return self.app.head()

    def lag(self) -> int:
        """How many notifications are not applied yet (ids need not be contiguous)."""
        position, head = self.position(), self.head()
        if head <= position:
            return 0
        count = getattr(self.app.recorder, "count_notifications", None)
        return int(count(position, head)) if count is not None else head - position

    def catch_up(self, limit: int | None = None, page: int = 500) -> int:
        """Apply up to ``limit`` notifications (all up to the current head if None), in
        pages of ``page``, one transaction per page; return how many were applied."""
        self._ensure()
        target, position, applied = self.head(), self.position(), 0
        while position < target and (limit is None or applied < limit):
            size = page if limit is None else min(page, limit - applied)
            # Read outside our transaction: no I/O to the event store while we hold locks.
            notes = self.app.notifications(position + 1, size, stop=target)
            if not notes:
                break
            if self._apply_page(position, notes):
                applied += len(notes)
                position = notes[-1].id
            else:
                position = self.position()  # another projector moved it: start from there
        return applied

    def follow(self, poll_interval: float = 0.5,
               stop: Callable[[], bool] | None = None) -> None:
        """Keep catching up until ``stop()`` returns true (forever if no ``stop``),
        sleeping ``poll_interval`` seconds whenever there is nothing new. An unreachable
        store is waited out with backoff; other errors propagate: run it under a
        supervisor that restarts it."""
        failures = 0
        while not (stop is not None and stop()):
            try:
                applied = self.catch_up(limit=_FOLLOW_CHUNK)
            except StoreUnavailableError as e:
                failures += 1
                if failures == 1:
                    log.warning("read model: %s; retrying with backoff", e)
                time.sleep(backoff(failures))
                continue
            failures = 0
            if applied == 0:
                time.sleep(poll_interval)

    def rebuild(self) -> int:
        """Delete every row and reset the position in one transaction, then catch up
        from the start of the log; return how many notifications were applied."""
        self._ensure()
        with self._db.tx() as cur:
            # Position first: it locks the row a concurrent projector compares-and-sets.
            cur.execute(self._db.sql("UPDATE saga_projection_position SET position = 0 "
                                     "WHERE name = ?"), (self.name,))
            cur.execute("DELETE FROM saga_steps")
            cur.execute("DELETE FROM saga_runs")
        return self.catch_up()

    def runs(self, status: str | None = None, limit: int | None = 50,
             since: str | None = None, definition: str | None = None,
             actor: str | None = None, labels: dict[str, str] | None = None,
             until: str | None = None, prefix: str | None = None,
             offset: int = 0) -> list[dict[str, Any]]:
        """Runs newest first; dicts of the saga_runs columns. Filters: one ``status``, a
        ``definition`` name, an ``actor``, runs carrying every one of ``labels``, started
        at or after ``since`` and before ``until`` (ISO-8601; a naive time is UTC), and an
        id (or chosen name) starting with ``prefix``; the first ``offset`` are passed over."""
        self._ensure()
        where: list[str] = []
        args: list[Any] = []
        if prefix:
            # escaped: a run id's "_" or "%" is itself, not a wildcard
            like = "".join("\\" + c if c in "\\%_" else c for c in prefix) + "%"
            where.append("(run_id LIKE ? ESCAPE '\\' OR run_name LIKE ? ESCAPE '\\')")
            args += [like, like]
        for column, value in (("status", status), ("definition_name", definition),
                              ("actor", actor)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        for key, value in (labels or {}).items():
            # labels is canonical JSON (sorted keys, no spaces): one pair is a substring
            where.append("labels LIKE ?")
            pair = json.dumps({key: value}, sort_keys=True, separators=(",", ":"))[1:-1]
            args.append("%" + pair.replace("%", "_") + "%")
        if until is not None:
            where.append("started_at < ?")
            args.append(_ts(datetime.fromisoformat(until)))
        if since is not None:
            where.append("started_at >= ?")
            args.append(_ts(datetime.fromisoformat(since)))
        text = f"SELECT {', '.join(RUN_COLUMNS)} FROM saga_runs"
        text += f" WHERE {' AND '.join(where)}" if where else ""
        text += " ORDER BY started_at DESC, run_id DESC"
        if limit is not None:
            text += " LIMIT ? OFFSET ?"
            args += [limit, offset]
            return self._db.query(text, args)
        return self._db.query(text, args)[offset:]

    def ids_starting(self, prefix: str, limit: int = 4) -> list[str]:
        """Run ids (or the names callers chose) that start with ``prefix``."""
        self._ensure()
        like = prefix.replace("%", "_") + "%"
        rows = self._db.query("SELECT run_id, run_name FROM saga_runs WHERE run_id LIKE ? "
                              "OR run_name LIKE ? ORDER BY run_id LIMIT ?", (like, like, limit))
        return [r["run_name"] or r["run_id"] for r in rows]

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        """The run's step executions in the order they started (never-started last)."""
        self._ensure()
        return self._db.query(
            f"SELECT {', '.join(STEP_COLUMNS)} FROM saga_steps WHERE run_id = ? "
            "ORDER BY started_at IS NULL, started_at, step_id, iteration", (str(run_id),))

    def close(self) -> None:
        """Close the projection's connection (the app is the caller's to close)."""
        self._db.close()

    # -- applying a page ---------------------------------------------------------------

    def _read_page(self, notes: Sequence[Notification]) -> list[tuple[str, str, Any, bool]]:
        """The run events of a page, decoded (outside any transaction of ours)."""
        events = []
        for n in notes:
            if n.topic not in _RUN_TOPICS:
                continue  # e.g. another app sharing the SQLite file: skip, but move past
            try:
                waiting = n.topic in _DECISIONS and self._still_waiting(n)
                event = unopened(self.app.mapper, n)  # no sealed value is projected
            except StoreUnavailableError:
                raise
            except Exception as e:  # one unreadable event must not stop the read model
                log.error("read model: skipping unreadable event %s of run %s: %s", n.id,
                          n.originator_id, e)
                continue
            events.append((str(n.originator_id), n.topic, event, waiting))
        return events

    def _apply_page(self, position: int, notes: Sequence[Notification]) -> bool:
        """Fold ``notes`` (read after ``position``) and commit rows + new position at
        once; False (nothing written) if the stored position is no longer ``position``.
        The compare-and-set makes a page whose commit a lost connection hid safe to
        write again, so it is retried across reconnects."""
        events = self._read_page(notes)
        return self._db.retrying("updating the read model",
                                 lambda: self._commit_page(position, notes[-1].id, events))

    def _commit_page(self, position: int, last: int,
                     events: list[tuple[str, str, Any, bool]]) -> bool:
        run_ids = sorted({e[0] for e in events})
        with self._db.tx() as cur:
            # Compare-and-set before any write: in PostgreSQL this row lock makes a
            # concurrent projector wait, then see 0 rows and back off.
            cur.execute(self._db.sql("UPDATE saga_projection_position SET position = ? "
                                     "WHERE name = ? AND position = ?"),
                        (last, self.name, position))
            if cur.rowcount != 1:
                return False
            fold = _Fold(*self._load(cur, run_ids))
            for run_id, topic, event, waiting in events:
                fold.apply(run_id, topic, event, waiting)
            self._write(cur, fold)
        return True

    def _still_waiting(self, n: Notification) -> bool:
        """True if approvals are still pending after the decision ``n`` (which needs the
        run's earlier requests; read from the log, outside any transaction)."""
        pending: set[str] = set()
        for e in self.app.events_of(UUID(str(n.originator_id)), lte=n.originator_version):
            if isinstance(e, Run.ApprovalRequested):
                pending.add(e.step_id)
            elif isinstance(e, Run.ApprovalGranted | Run.ApprovalRejected):
                pending.discard(e.step_id)
        return bool(pending)

    def _load(self, cur: Any, run_ids: list[str]) -> tuple[dict[str, Row], dict[StepKey, Row]]:
        """The stored rows of these runs (read inside the page's transaction)."""
        runs: dict[str, Row] = {}
        steps: dict[StepKey, Row] = {}
        if not run_ids:
            return runs, steps
        marks = ", ".join("?" for _ in run_ids)
        cur.execute(self._db.sql(f"SELECT {', '.join(RUN_COLUMNS)} FROM saga_runs "
                                 f"WHERE run_id IN ({marks})"), run_ids)
        for row in cur.fetchall():
            runs[row[0]] = dict(zip(RUN_COLUMNS, row, strict=True))
        cur.execute(self._db.sql(f"SELECT {', '.join(STEP_COLUMNS)} FROM saga_steps "
                                 f"WHERE run_id IN ({marks})"), run_ids)
        for row in cur.fetchall():
            steps[(row[0], row[1], row[2])] = dict(zip(STEP_COLUMNS, row, strict=True))
        return runs, steps

    def _write(self, cur: Any, fold: _Fold) -> None:
        run_rows = [tuple(_text(fold.runs[k][c]) for c in RUN_COLUMNS)
                    for k in sorted(fold.dirty_runs)]
        step_rows = [tuple(_text(fold.steps[k][c]) for c in STEP_COLUMNS)
                     for k in sorted(fold.dirty_steps)]
        if run_rows:
            cur.executemany(self._db.sql(_UPSERT_RUN), run_rows)
        if step_rows:
            cur.executemany(self._db.sql(_UPSERT_STEP), step_rows)


class Projections(Projection):
    """The read model of a partitioned store: one :class:`Projection` per partition (its
    rows and position beside that partition's log), read together. ``position()`` is
    the sum of the partitions' positions; :meth:`positions` gives each."""

    def __init__(self, app: SagaApplication, name: str = "status") -> None:
        """One projection per partition of ``app``."""
        self.app, self.name = app, name
        self.parts = [Projection(part, name) for part in parts_of(app)]

    def create_tables(self) -> None:
        """Create the tables in every partition."""
        for p in self.parts:
            p.create_tables()

    def positions(self) -> list[int]:
        """Each partition's position, in partition order."""
        return [p.position() for p in self.parts]

    def position(self) -> int:
        """The sum of the partitions' positions (each log numbers its own events)."""
        return sum(self.positions())

    def head(self) -> int:
        """The sum of the partitions' heads."""
        return sum(p.head() for p in self.parts)

    def lag(self) -> int:
        """Notifications not applied yet, in every partition together."""
        return sum(p.lag() for p in self.parts)

    def catch_up(self, limit: int | None = None, page: int = 500) -> int:
        """Catch every partition up (``limit`` shared out evenly: a busy partition does
        not hold the others' events back in :meth:`follow`)."""
        share = None if limit is None else max(-(-limit // len(self.parts)), 1)
        return sum(p.catch_up(share, page) for p in self.parts)

    def rebuild(self) -> int:
        """Rebuild every partition's rows."""
        return sum(p.rebuild() for p in self.parts)

    def runs(self, status: str | None = None, limit: int | None = 50,
             since: str | None = None, definition: str | None = None,
             actor: str | None = None, labels: dict[str, str] | None = None,
             until: str | None = None, prefix: str | None = None,
             offset: int = 0) -> list[dict[str, Any]]:
        """Runs newest first across the partitions (as :meth:`Projection.runs`)."""
        # a page of the merge needs each partition's first offset + limit
        each = None if limit is None else offset + limit
        rows = [r for p in self.parts for r in p.runs(status, each, since, definition,
                                                      actor, labels, until, prefix)]
        rows.sort(key=lambda r: (r["started_at"] or "", r["run_id"]), reverse=True)
        return rows[offset:] if limit is None else rows[offset:offset + limit]

    def ids_starting(self, prefix: str, limit: int = 4) -> list[str]:
        """Ids (or chosen names) starting with ``prefix``, in every partition."""
        return sorted(i for p in self.parts for i in p.ids_starting(prefix, limit))[:limit]

    def steps(self, run_id: str) -> list[dict[str, Any]]:
        """The run's step executions, from its partition."""
        return self.parts[partition_of(run_id, len(self.parts))].steps(run_id)

    def close(self) -> None:
        """Close every partition's connection."""
        for p in self.parts:
            p.close()


def open_projection(app: SagaApplication, name: str = "status") -> Projection:
    """The read model of ``app``'s store: merged over the partitions of a partitioned
    one."""
    return Projections(app, name) if len(parts_of(app)) > 1 else Projection(app, name)


def snapshot_tables(p: Projection) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every row of saga_runs and saga_steps, sorted, for equality checks."""
    runs = p._db.query(f"SELECT {', '.join(RUN_COLUMNS)} FROM saga_runs ORDER BY run_id")
    steps = p._db.query(f"SELECT {', '.join(STEP_COLUMNS)} FROM saga_steps "
                        "ORDER BY run_id, step_id, iteration")
    return ([tuple(r[c] for c in RUN_COLUMNS) for r in runs],
            [tuple(s[c] for c in STEP_COLUMNS) for s in steps])
