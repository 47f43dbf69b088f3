"""Retention (:func:`apply_retention`) rewrites, for finished runs older than N days, the
payload fields that carry user data (RunStarted ``inputs``, StepStarted ``parameters``,
StepCompleted / StepCompensated ``output``, RunCompleted / RunFailed / RunCompensated
``outputs``) to ``{"_redacted": true}``, keeping type, timestamp, actor, prev_hash,
payload_hash and mac as they are, and deletes the run's snapshots (which hold that data
too). We prefer this rewrite to crypto-shredding (encrypting each run's payloads with a
per-run key and destroying the key) because: the log promises plain JSON payloads that SQL
and other languages read directly, which encryption at write time would break for every
reader; shredding needs a key store that is itself durable, backed up and access
controlled, and loses every run whose key is lost; and it would not apply to the events
already recorded. The rewrite works on existing stores and keeps the chain verifiable,
because a link covers the payload's *hash* recorded at write time, not the payload. Its
costs, stated plainly: backups and replicas taken before retention still hold the data
until they age out; the unsalted ``payload_hash`` of a redacted event lets someone who can
guess the removed values exactly (a short PIN, a yes/no) confirm a guess; and the
non-redacted fields of a redacted event can no longer be re-checked against its hash (see
:func:`verify_records`). The run's rows in the undo store (``saga_undo``: a file's previous
bytes, captured rows, secret outputs) are deleted in the same transaction (on SQLite with
``secure_delete``, so the freed pages are zeroed); the salted hashes the log keeps of them
cannot be checked against a guess once the salts are gone.

With payloads encrypted at rest (:mod:`saga.store.encryption`), ``shred=True`` is the
other way: each due run's data key is deleted (with its snapshots and undo rows), no event
is rewritten, and the sealed payloads become unreadable in every copy of the event store.
"""


from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from saga.audit.chain import (
    REDACTABLE,
    REDACTED,
    RETENTION_TYPE,
    TERMINAL_TYPES,
    Record,
    _retained,
    log,
    payload_digest,
    verify_records,
)
from saga.audit.store import (
    _encode_state,
    _has_table,
    _id_args,
    _id_where,
    _open,
    _read,
    _run_ids,
    _tables,
    _uuid,
)
from saga.config import Settings
from saga.errors import ConfigError
from saga.store.application import open_app
from saga.store.encryption import shred as shred_keys
from saga.store.heartbeats import TABLE as HEARTBEATS
from saga.store.side_tables import Database
from saga.store.undo import UNDO_TABLE


@dataclass
class _Plan:
    updates: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    snapshots: int = 0
    undo: int = 0

    def __bool__(self) -> bool:
        return bool(self.updates or self.snapshots or self.undo)


def _finished_before(records: Sequence[Record], cutoff: datetime) -> bool:
    ending = [r for r in records if r.type_name != RETENTION_TYPE]
    if not ending or ending[-1].type_name not in TERMINAL_TYPES:
        return False
    try:
        when = datetime.fromisoformat(ending[-1].timestamp)
    except ValueError:
        return False
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    return when < cutoff


def _plan(records: Sequence[Record], cutoff: datetime, key: bytes | str | None) -> _Plan | None:
    """What retention rewrites in a run, or None when the run is not due (or is broken)."""
    if not _finished_before(records, cutoff):
        return None
    verdict = verify_records(records, key)
    if not verdict.ok:  # keep the evidence: a broken run is left for an investigation
        log.warning("retention skips run %s: %s", verdict.run_id, verdict.message)
        return None
    plan = _Plan()
    for r in records:
        state = dict(r.state)
        for name in REDACTABLE.get(r.type_name, ()):
            if name in state and state[name] != REDACTED:
                state[name] = dict(REDACTED)
        if state != r.state:
            plan.updates.append((r.version, state))
    return plan


def _record_retention(settings: Settings, run_id: str, plan: _Plan,
                      records: Sequence[Record], key: bytes | str | None) -> None:
    """Append ``RetentionApplied`` (what will be rewritten, and each payload's hash after)
    unless the run already records exactly that: a rerun after a crash adds nothing."""
    versions = {str(v): payload_digest(state) for v, state in plan.updates}
    if all(_retained(records).get(k) == h for k, h in versions.items()):
        return
    if key:  # sign it with the key the run is verified with
        settings = replace(settings, audit_key=key.decode() if isinstance(key, bytes) else key)
    app = open_app(settings)
    try:
        run = app.get_run(run_id)
        run.record_retention(versions)
        app.save_run(run)
    finally:
        app.close()


def _retain(db: Database, settings: Settings, run_id: str, cutoff: datetime, dry_run: bool,
            key: bytes | str | None, shred: bool = False) -> bool:
    events, snapshots = _tables(settings)
    has_snapshots = _has_table(db, snapshots)
    has_undo = _has_table(db, UNDO_TABLE)
    undo_where = (f"FROM {UNDO_TABLE} WHERE run_uuid = ?", (str(_uuid(run_id)),))
    args = _id_args(db, run_id)
    # A first look outside any transaction skips runs that are not due cheaply.
    plan = _plan(_read(db, settings, run_id), cutoff, key)
    if plan is None:
        return False
    if shred:  # the events stay as they are: their payloads' key goes (see _shred)
        plan.updates = []
        if dry_run:
            return True
    if dry_run:
        if has_snapshots:
            rows = db.query(f"SELECT COUNT(*) AS n FROM {snapshots} WHERE {_id_where(db)}",
                            args)
            plan.snapshots = int(rows[0]["n"])
        if has_undo:
            plan.undo = int(db.query(f"SELECT COUNT(*) AS n {undo_where[0]}",
                                     undo_where[1])[0]["n"])
        return bool(plan)
    if shred:
        return _shred(db, settings, run_id) or bool(plan)
    if plan.updates:  # the evidence first, through the store's own writer (chained, signed)
        _record_retention(settings, run_id, plan, _read(db, settings, run_id), key)
    with db.tx() as cur:  # decided again under lock: a writer may have appended meanwhile
        plan = _plan(_read(db, settings, run_id, cur), cutoff, key)
        if plan is None:
            return False
        for version, state in plan.updates:
            cur.execute(db.sql(f"UPDATE {events} SET state = ? WHERE {_id_where(db)} AND "
                               "originator_version = ?"),
                        (_encode_state(state), *args, version))
        if has_snapshots:
            cur.execute(db.sql(f"DELETE FROM {snapshots} WHERE {_id_where(db)}"), args)
            plan.snapshots = max(cur.rowcount, 0)
        if has_undo:
            if not db.pg:  # overwrite the deleted rows' pages instead of leaving them free
                cur.execute("PRAGMA secure_delete = ON")
            cur.execute(db.sql(f"DELETE {undo_where[0]}"), undo_where[1])
            plan.undo = max(cur.rowcount, 0)
        _forget_heartbeats(db, cur, run_id)
    return bool(plan)


def _shred(db: Database, settings: Settings, run_id: str) -> bool:
    """Crypto-shred a run: delete its data key (its sealed payloads become unreadable in
    every copy of the event store), its snapshots and its undo state; its events, and so
    its chain and report rows, stay as they are. True when anything was deleted."""
    snapshots = _tables(settings)[1]
    args = _id_args(db, run_id)
    gone = shred_keys(settings, [run_id])
    with db.tx() as cur:
        if _has_table(db, snapshots):
            cur.execute(db.sql(f"DELETE FROM {snapshots} WHERE {_id_where(db)}"), args)
            gone += max(cur.rowcount, 0)
        if _has_table(db, UNDO_TABLE):
            if not db.pg:
                cur.execute("PRAGMA secure_delete = ON")
            cur.execute(db.sql(f"DELETE FROM {UNDO_TABLE} WHERE run_uuid = ?"),
                        (str(_uuid(run_id)),))
            gone += max(cur.rowcount, 0)
        _forget_heartbeats(db, cur, run_id)
    return gone > 0


def _forget_heartbeats(db: Database, cur: Any, run_id: str) -> None:
    """Delete a run's last heartbeats (``saga_heartbeats``): tools' progress details,
    user data like its undo state; its ``HeartbeatRecorded`` events are redacted."""
    if _has_table(db, HEARTBEATS):
        cur.execute(db.sql(f"DELETE FROM {HEARTBEATS} WHERE run_uuid = ?"),
                    (str(_uuid(run_id)),))


def apply_retention(settings: Settings, older_than_days: float, dry_run: bool = False,
                    now: datetime | None = None, key: bytes | str | None = None,
                    shred: bool = False) -> list[str]:
    """Remove user data from finished runs whose last event is older than
    ``older_than_days`` (relative to ``now``, default the current time); returns the ids of
    the runs changed (with ``dry_run``, that would be changed; nothing is written).

    Each run is rewritten in one transaction: the fields in :data:`REDACTABLE` become
    ``{"_redacted": true}``, every other field (type, timestamp, actor, prev_hash,
    payload_hash, mac) stays, and the run's snapshots and undo state are deleted. A run
    whose chain does not verify (with ``key`` when given) is skipped and logged, so
    evidence of tampering is never overwritten. Unfinished runs are never touched.

    ``shred``: instead of rewriting events, delete each due run's data key (payloads
    sealed at rest, :mod:`saga.store.encryption`), snapshots and undo state.
    """
    if shred and not settings.encryption_key:
        raise ConfigError("retention apply --shred needs the encryption key configured: "
                          "shredding deletes the data keys that seal payloads at rest")
    if older_than_days < 0:
        raise ValueError("older_than_days must be >= 0")
    if settings.partitions:  # the undo state is in the first partition, the runs in any
        raise ConfigError("retention over a partitioned store is not supported yet")
    moment = now or datetime.now(UTC)
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    cutoff = moment - timedelta(days=older_than_days)
    changed = []
    with _open(settings) as db:
        if db is None:
            return []
        for run_id in _run_ids(db, settings):
            if _retain(db, settings, run_id, cutoff, dry_run, key, shred):
                changed.append(run_id)
    return changed
