"""The last heartbeat of each attempt in flight, in ``saga_heartbeats`` beside the events.

A tool's ``ctx.heartbeat(details)`` is not an event: a long call may beat every second
for an hour. The executor upserts the last details of an attempt here, at most about
once a second (:mod:`saga.executor.heartbeats`), so another process (``saga status``,
the API, the worker that takes the run over after this one died) sees them live. The log
stays the record: the details in force when the attempt ends are copied into its
``HeartbeatRecorded`` event, and a row here only matters while its attempt runs (one row
per step execution, overwritten by each attempt, cleared with the run's undo state by
retention). With payloads encrypted at rest the details are sealed with the run's data
key, as the undo store and the cache seal theirs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from saga.domain.vocabulary import run_uuid
from saga.store.encryption import SEALED_KEY, open_value, seal_value, sealer_for
from saga.store.side_tables import Database

log = logging.getLogger("saga.store")
TABLE = "saga_heartbeats"
HEARTBEAT_DDL = (f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    run_uuid TEXT NOT NULL, step_key TEXT NOT NULL, attempt INTEGER NOT NULL,
    details TEXT NOT NULL, beats INTEGER NOT NULL, beat_at TEXT, worker TEXT,
    PRIMARY KEY (run_uuid, step_key))""",)
#: A later attempt's row replaces an earlier one's, never the other way round (a beat
#: of an abandoned attempt, still running in its thread, must not overwrite its retry's).
_UPSERT = (f"INSERT INTO {TABLE} (run_uuid, step_key, attempt, details, beats, beat_at, "
           "worker) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_uuid, step_key) DO UPDATE "
           "SET attempt = excluded.attempt, details = excluded.details, "
           "beats = excluded.beats, beat_at = excluded.beat_at, worker = excluded.worker "
           f"WHERE {TABLE}.attempt <= excluded.attempt")


class Heartbeats:
    """The side table of last heartbeats of one store (the table is made on first use)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._sealer = sealer_for(db.settings)
        self._created = False

    def _table(self) -> None:
        if not self._created:
            self.db.create(HEARTBEAT_DDL)
            self._created = True

    def put(self, run_id: str, step_key: str, attempt: int, details: Any, beats: int,
            at: str | None, worker: str | None = None) -> None:
        """Keep the last heartbeat of an attempt (``at``: when it came, ISO)."""
        self._table()
        text = json.dumps(details)
        if self._sealer is not None:
            text = seal_value(self._sealer, run_id, f"heartbeat|{step_key}", text.encode())
        self.db.execute(_UPSERT, (str(run_uuid(run_id)), step_key, attempt, text, beats,
                                  at, worker))

    def of_run(self, run_id: str) -> dict[str, dict[str, Any]]:
        """The last heartbeat of each step execution of a run that beat, by step key:
        ``{"attempt", "details", "beats", "at", "worker"}``."""
        self._table()
        rows = self.db.query(f"SELECT step_key, attempt, details, beats, beat_at, worker "
                             f"FROM {TABLE} WHERE run_uuid = ?", (str(run_uuid(run_id)),))
        return {row["step_key"]: {"attempt": int(row["attempt"]),
                                  "details": self._open(run_id, row),
                                  "beats": int(row["beats"]), "at": row["beat_at"],
                                  "worker": row["worker"]} for row in rows}

    def _open(self, run_id: str, row: dict[str, Any]) -> Any:
        details = json.loads(row["details"])
        if not (isinstance(details, dict) and SEALED_KEY in details):
            return details
        if self._sealer is None:
            return None  # sealed, and no key here: nothing to show
        plain = open_value(self._sealer, run_id, f"heartbeat|{row['step_key']}", details)
        return None if plain is None else json.loads(plain)

    def forget(self, run_id: str) -> int:
        """Delete a run's rows; returns how many went."""
        self._table()
        return self.db.execute(f"DELETE FROM {TABLE} WHERE run_uuid = ?",
                               (str(run_uuid(run_id)),))



def show_heartbeats(summary: dict[str, Any], steps: dict[str, Any],
                    table: Callable[[], Heartbeats]) -> None:
    """Put into a run's summary (``steps[KEY]["heartbeat"]``) what each step's tool last
    beat: as the log recorded it (``HeartbeatRecorded``), or for an attempt in flight,
    live from the side table (``"live": true``; newer than the log). ``steps``: the
    run's step states; ``table`` opens the side table, only when an attempt is in
    flight. A failure to read it leaves the summary as the log has it."""
    shown: dict[str, Any] = summary.get("steps") or {}
    for key, state in steps.items():
        if state.get("heartbeat") and key in shown:
            shown[key]["heartbeat"] = dict(state["heartbeat"])
    running = {key: s for key, s in steps.items()
               if s["status"] == "running" and not s.get("wait")}
    if not running or not shown:
        return
    try:
        rows = table().of_run(str(summary["run_id"]))
    except Exception as e:  # status still shows what the log recorded
        log.warning("run %s: could not read its heartbeats: %s", summary["run_id"], e)
        return
    for key, state in running.items():
        row = rows.get(key)
        if row is not None and row["attempt"] == state["attempt"] and key in shown:
            live = {k: row[k] for k in ("attempt", "details", "beats", "at")}
            shown[key]["heartbeat"] = {**live, "live": True}
