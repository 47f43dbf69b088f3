"""The notification outbox: webhooks owed, derived from the log, and their attempts.

``saga_notifications`` holds one row per (event, target): a notification is derived from
one event of a run for one webhook URL, and its id is a digest of the two, so deriving
it again (a second worker, a restart, a crash before the position moved) finds it there
and adds nothing: only a delivery is ever repeated, never a notification. The rows of a
page of the log are written in the same transaction as the outbox's position in it
(``saga_outbox_position``, compare-and-set as the read model's), so a follower resumes
where its last commit left off.

Delivery: a worker claims due rows with a lease (``FOR UPDATE SKIP LOCKED`` on
PostgreSQL, under SQLite's ``BEGIN IMMEDIATE``), so two workers never send one
notification at once; the claim counts the attempt and records it in
``saga_notification_attempts`` before anything is sent, and the result is written only
while the lease is still the claimer's. A worker that dies mid-send leaves its attempt
``sending``; the row is claimed again once the lease lapses, or at once when that worker
registered its liveness and its lock is gone (its process died), and that attempt is then
recorded ``interrupted``. The claim keeps the claimer's lock key on the row
(``leased_key``, from ``saga_workers``): another worker's clean stop forgets the
registrations of dead workers that hold no run's lease, and a delivery leased to one of
those must not wait out its lease for that (:func:`~saga.store.liveness.dead_sql` covers a
claimer that registered only after it claimed).

The tables live beside the other side tables (the first partition, when partitioned).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from saga.config import Settings
from saga.errors import InputError, NotificationNotFoundError, Problem
from saga.store.liveness import WORKERS_DDL, dead_holder_sql, lock_folder, register_sqlite
from saga.store.side_tables import Database, Row

DDL = (
    """CREATE TABLE IF NOT EXISTS saga_notifications (
        id TEXT PRIMARY KEY, event_id TEXT NOT NULL, target TEXT NOT NULL,
        run_id TEXT NOT NULL, type TEXT NOT NULL, body TEXT NOT NULL,
        secret_env TEXT NOT NULL, allow_insecure INTEGER NOT NULL,
        status TEXT NOT NULL, attempts INTEGER NOT NULL, created_at TEXT NOT NULL,
        next_at TEXT NOT NULL, deadline TEXT NOT NULL, lease_until TEXT, leased_by TEXT,
        delivered_at TEXT, last_error TEXT, leased_key BIGINT, UNIQUE (event_id, target))""",
    """CREATE TABLE IF NOT EXISTS saga_notification_attempts (
        notification_id TEXT NOT NULL, attempt INTEGER NOT NULL, worker TEXT NOT NULL,
        started_at TEXT NOT NULL, finished_at TEXT, outcome TEXT NOT NULL,
        status_code INTEGER, error TEXT, PRIMARY KEY (notification_id, attempt))""",
    """CREATE TABLE IF NOT EXISTS saga_outbox_position (
        name TEXT PRIMARY KEY, position BIGINT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS saga_notifications_due ON saga_notifications "
    "(status, next_at)",
    "CREATE INDEX IF NOT EXISTS saga_notifications_run ON saga_notifications (run_id)",
)
COLUMNS = ("id", "event_id", "target", "run_id", "type", "body", "secret_env",
           "allow_insecure", "status", "attempts", "created_at", "next_at", "deadline",
           "lease_until", "leased_by", "delivered_at", "last_error")
ATTEMPT_COLUMNS = ("notification_id", "attempt", "worker", "started_at", "finished_at",
                   "outcome", "status_code", "error")
STATUSES = ("pending", "delivered", "failed")
INTERRUPTED = "its worker stopped before it recorded the answer (it may have been received)"
_ID = re.compile(r"[0-9a-f]{4,16}")  # a notification's id, or a prefix of one
_INSERT = (f"INSERT INTO saga_notifications ({', '.join(COLUMNS)}) VALUES "
           f"({', '.join('?' for _ in COLUMNS)}) ON CONFLICT DO NOTHING")
#: Columns added since the table's first version (a store made before has them added).
ADDED = {"saga_notifications": {"leased_key": "BIGINT"}}
#: The due rows a claim takes: pending, their time come, and nobody sending them now (no
#: lease, a lapsed one, or ``{dead}``: its worker's process gone).
_DUE = ("SELECT id FROM saga_notifications WHERE status = 'pending' AND next_at <= ? "
        "AND (lease_until IS NULL OR lease_until < ? OR {dead}) ORDER BY next_at, id LIMIT ?")


def notification_id(event_id: str, target: str) -> str:
    """The id of the notification of one event to one target: the same wherever and
    however often it is derived."""
    return hashlib.sha256(f"{event_id}\n{target}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Claimed:
    """A notification a worker is to send now: its row, and the number of this attempt."""

    row: Row
    attempt: int


class Outbox:
    """The outbox tables on a connection of their own."""

    def __init__(self, settings: Settings) -> None:
        """Open a connection to the store's side tables (made on first use)."""
        self._db = Database(settings)
        self._ready = False
        self._due = _DUE.format(dead=dead_holder_sql(
            "saga_notifications", "leased_key", "leased_by", self._db.pg))

    def _ensure(self) -> None:
        if not self._ready:
            if not self._db.pg:  # saga_alive(worker), which a claim's liveness check calls
                register_sqlite(self._db.conn, lock_folder(self._db))
            self._db.create(DDL + WORKERS_DDL, ADDED)
            self._ready = True

    # -- following the log --------------------------------------------------------------

    def position(self, name: str) -> int:
        """Where the follower ``name`` (one per partition's log) has derived up to."""
        self._ensure()
        select = "SELECT position FROM saga_outbox_position WHERE name = ?"
        rows = self._db.query(select, (name,))
        if not rows:  # its first look (a write only then: this is read every round)
            self._db.execute("INSERT INTO saga_outbox_position (name, position) VALUES (?, 0) "
                             "ON CONFLICT (name) DO NOTHING", (name,))
            rows = self._db.query(select, (name,))
        return int(rows[0]["position"])

    def derive(self, name: str, position: int, last: int, rows: Sequence[Row]) -> bool:
        """Add the notifications derived from the log after ``position`` up to ``last``
        and move the position there, in one transaction; False (nothing written) when
        another follower moved it first. A row already there stays as it is."""
        self._ensure()

        def once() -> bool:
            with self._db.tx() as cur:
                cur.execute(self._db.sql("UPDATE saga_outbox_position SET position = ? "
                                         "WHERE name = ? AND position = ?"),
                            (last, name, position))
                if cur.rowcount != 1:
                    return False
                if rows:
                    cur.executemany(self._db.sql(_INSERT),
                                    [tuple(r[c] for c in COLUMNS) for r in rows])
            return True
        return self._db.retrying("deriving notifications", once)

    # -- delivering ---------------------------------------------------------------------

    def claim(self, worker: str, now: str, lease_until: str, limit: int) -> list[Claimed]:
        """Take up to ``limit`` due notifications to send, each leased to ``worker``
        until ``lease_until`` (ISO), its attempt counted and recorded as ``sending``."""
        self._ensure()
        due = self._due + (" FOR UPDATE SKIP LOCKED" if self._db.pg else "")
        # the claimer's lock key, when it registered: its death frees the row even after
        # its registration is forgotten
        update = (f"UPDATE saga_notifications SET lease_until = ?, leased_by = ?, "
                  f"leased_key = (SELECT lock_key FROM saga_workers WHERE worker = ?), "
                  f"attempts = attempts + 1 WHERE id IN ({due}) RETURNING {', '.join(COLUMNS)}")

        if not self._db.query(self._due, (now, now, 1)):
            return []  # nothing due: no write transaction (a worker looks every round)

        def once() -> list[Claimed]:
            with self._db.tx() as cur:
                cur.execute(self._db.sql(update), (lease_until, worker, worker, now, now,
                                                   limit))
                rows = [dict(zip(COLUMNS, r, strict=True)) for r in cur.fetchall()]
                # an earlier attempt still "sending" was cut short: its lease lapsed
                cut = [(now, INTERRUPTED, r["id"], r["attempts"]) for r in rows
                       if r["attempts"] > 1]
                if rows:
                    cur.executemany(self._db.sql(
                        "INSERT INTO saga_notification_attempts (notification_id, attempt, "
                        "worker, started_at, outcome) VALUES (?, ?, ?, ?, 'sending') "
                        "ON CONFLICT DO NOTHING"),
                        [(r["id"], r["attempts"], worker, now) for r in rows])
                if cut:
                    cur.executemany(self._db.sql(
                        "UPDATE saga_notification_attempts SET outcome = 'interrupted', "
                        "finished_at = ?, error = ? WHERE notification_id = ? "
                        "AND outcome = 'sending' AND attempt < ?"), cut)
            return [Claimed(r, int(r["attempts"])) for r in rows]
        return self._db.retrying("claiming notifications", once)

    def finish(self, claimed: Claimed, worker: str, now: str, *, delivered: bool,
               status_code: int | None, error: str | None, next_at: str | None) -> bool:
        """Record how an attempt ended, and the notification's state after it:
        delivered, pending again from ``next_at``, or failed for good (``next_at``
        None). False when the lease was lost meanwhile (the attempt is recorded; the
        notification is left to its new holder)."""
        row_id = claimed.row["id"]
        status = "delivered" if delivered else ("pending" if next_at else "failed")

        def once() -> bool:
            with self._db.tx() as cur:
                cur.execute(self._db.sql(
                    "UPDATE saga_notification_attempts SET finished_at = ?, outcome = ?, "
                    "status_code = ?, error = ? WHERE notification_id = ? AND attempt = ?"),
                    (now, "delivered" if delivered else "failed", status_code, error,
                     row_id, claimed.attempt))
                cur.execute(self._db.sql(
                    "UPDATE saga_notifications SET status = ?, next_at = ?, lease_until = NULL, "
                    "leased_by = NULL, leased_key = NULL, delivered_at = ?, last_error = ? "
                    "WHERE id = ? AND leased_by = ? AND attempts = ?"),
                    (status, next_at or now, now if delivered else None, error, row_id,
                     worker, claimed.attempt))
                return bool(cur.rowcount == 1)
        return self._db.retrying("recording a delivery", once)

    # -- reading and redelivering --------------------------------------------------------

    def listing(self, status: str | None = None, run_id: str | None = None,
             limit: int | None = 100) -> list[Row]:
        """Notifications newest first (their bodies and attempts left out), optionally
        of one ``status`` and one run."""
        self._ensure()
        if status is not None and status not in STATUSES:
            raise InputError([Problem("status", f"must be one of {', '.join(STATUSES)}, "
                                                f"not {status!r}")])
        where: list[str] = []
        args: list[Any] = []
        for column, value in (("status", status), ("run_id", run_id)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        shown = [c for c in COLUMNS if c != "body"]
        text = f"SELECT {', '.join(shown)} FROM saga_notifications"
        text += f" WHERE {' AND '.join(where)}" if where else ""
        text += " ORDER BY created_at DESC, id"
        if limit is not None:
            text += " LIMIT ?"
            args.append(limit)
        return self._db.query(text, args)

    def get(self, ident: str) -> Row:
        """One notification by its id (or a unique prefix of it, 4 characters or more),
        with its body and its ``attempts_log``; NotificationNotFoundError when none or several."""
        self._ensure()
        rows = self._db.query(f"SELECT {', '.join(COLUMNS)} FROM saga_notifications "
                              "WHERE id LIKE ? ORDER BY id LIMIT 2", (ident + "%",)) \
            if _ID.fullmatch(ident) else []
        if not rows or (len(rows) > 1 and rows[0]["id"] != ident):
            raise NotificationNotFoundError(
                f"no notification {ident!r}" if not rows
                else f"{ident!r} names more than one notification: give more of its id")
        row = rows[0]
        row["attempts_log"] = self._db.query(
            f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM saga_notification_attempts "
            "WHERE notification_id = ? ORDER BY attempt", (row["id"],))
        return row

    def attempts_of(self, ids: Sequence[str]) -> dict[str, list[Row]]:
        """The attempts of these notifications, in order, by notification id."""
        if not ids:
            return {}
        rows = self._db.query(
            f"SELECT {', '.join(ATTEMPT_COLUMNS)} FROM saga_notification_attempts "
            f"WHERE notification_id IN ({', '.join('?' for _ in ids)}) "
            "ORDER BY notification_id, attempt", list(ids))
        found: dict[str, list[Row]] = {i: [] for i in ids}
        for row in rows:
            found[row["notification_id"]].append(row)
        return found

    def retry(self, ident: str, now: str, deadline: str) -> Row:
        """Send a notification again as soon as a worker can (delivered, failed or
        pending alike), retried until ``deadline`` at least. InputError while a worker
        is sending it."""
        row = self.get(ident)
        changed = self._db.execute(
            "UPDATE saga_notifications SET status = 'pending', next_at = ?, "
            "deadline = CASE WHEN deadline > ? THEN deadline ELSE ? END, "
            "lease_until = NULL, leased_by = NULL, leased_key = NULL WHERE id = ? "
            "AND (lease_until IS NULL OR lease_until < ?)",
            (now, deadline, deadline, row["id"], now))
        if changed != 1:
            raise InputError([Problem("notification", f"{row['id']} is being sent now: "
                                      "retry it after this attempt")])
        return self.get(row["id"])

    def counts(self) -> dict[str, Any]:
        """How many notifications there are in each status."""
        self._ensure()
        rows = self._db.query("SELECT status, COUNT(*) AS n FROM saga_notifications "
                              "GROUP BY status")
        return {r["status"]: int(r["n"]) for r in rows}

    def close(self) -> None:
        """Close the connection."""
        self._db.close()
