"""Reading a run's raw events for the auditor: the one place that knows the library's table
names and stored formats (SQLite ``stored_*``, PostgreSQL ``saga_*``)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any
from uuid import UUID

from saga.audit.chain import (
    _UNREADABLE,
    SNAPSHOT_DOCTORED,
    Record,
    Result,
    verify_records,
)
from saga.chain import canonical
from saga.config import Settings
from saga.domain import TOPIC_PREFIX, run_uuid
from saga.domain.steps import DERIVED
from saga.errors import (
    DoctoredSnapshotError,
    EncryptionKeyError,
    RunNotFoundError,
    StoreUnavailableError,
    first_line,
)
from saga.store.application import SagaApplication
from saga.store.partitions import partition_of, partition_settings
from saga.store.side_tables import Database

_SQLITE_TABLES = ("stored_events", "stored_snapshots")


_POSTGRES_TABLES = ("saga_events", "saga_snapshots")
# How many alternative (event, version) links a failed verification may compute to tell
# a reordering from a deletion (diagnosis only: the break itself is found exactly).


def _tables(settings: Settings) -> tuple[str, str]:
    return _POSTGRES_TABLES if settings.is_postgres else _SQLITE_TABLES


@contextlib.contextmanager
def _store_errors() -> Iterator[None]:
    driver_errors: tuple[type[BaseException], ...] = (sqlite3.Error,)
    with contextlib.suppress(ImportError):
        import psycopg

        driver_errors += (psycopg.Error,)
    try:
        yield
    except driver_errors as e:
        raise StoreUnavailableError(f"cannot read the event store: {first_line(e)}") from e


@contextlib.contextmanager
def _open(settings: Settings) -> Iterator[Database | None]:
    """A side connection to the store, or None when there is no store yet."""
    if not settings.is_postgres and not (settings.home / "saga.db").is_file():
        yield None
        return
    db = Database(settings)
    try:
        with _store_errors():
            yield db if _has_table(db, _tables(settings)[0]) else None
    finally:
        db.close()


def _has_table(db: Database, name: str) -> bool:
    if db.pg:
        sql = ("SELECT 1 AS x FROM information_schema.tables "
               "WHERE table_schema = current_schema() AND table_name = ?")
    else:
        sql = "SELECT 1 AS x FROM sqlite_master WHERE type = 'table' AND name = ?"
    return bool(db.query(sql, (name,)))


def _uuid(run_id: str) -> UUID:
    return run_uuid(run_id)


def _id_args(db: Database, run_id: str) -> tuple[Any, ...]:
    uid = _uuid(run_id)
    # SQLite stores the id as 32 hex digits (the library's default); accept dashed text too.
    return (uid,) if db.pg else (uid.hex, str(uid))


def _id_where(db: Database) -> str:
    return "originator_id = ?" if db.pg else "originator_id IN (?, ?)"


def _decode_state(raw: Any) -> dict[str, Any]:
    data = bytes(raw) if not isinstance(raw, str) else raw.encode()
    try:
        state = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {_UNREADABLE: data.decode("utf-8", "replace")}
    return state if isinstance(state, dict) else {_UNREADABLE: state}


def _encode_state(state: Mapping[str, Any]) -> bytes:
    # The library's own encoding: compact, UTF-8, keys in their stored order.
    return json.dumps(state, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _read(db: Database, settings: Settings, run_id: str, cur: Any = None) -> list[Record]:
    events = _tables(settings)[0]
    sql = (f"SELECT originator_version, topic, state FROM {events} WHERE {_id_where(db)} "
           "ORDER BY originator_version")
    args = _id_args(db, run_id)
    if cur is None:
        rows = [tuple(row.values()) for row in db.query(sql, args)]
    else:
        cur.execute(db.sql(sql + (" FOR UPDATE" if db.pg else "")), args)
        rows = cur.fetchall()
    rid = str(_uuid(run_id))
    return [Record(rid, int(version), str(topic), _decode_state(state))
            for version, topic, state in rows]


def _run_ids(db: Database, settings: Settings) -> list[str]:
    events = _tables(settings)[0]
    order = "notification_id" if db.pg else "rowid"
    rows = db.query(f"SELECT originator_id AS id FROM {events} WHERE topic LIKE ? "
                    f"GROUP BY originator_id ORDER BY MIN({order})", (TOPIC_PREFIX + "%",))
    return [str(_uuid(str(row["id"]))) for row in rows]


def _partition(settings: Settings, run_id: str) -> Settings:
    """The settings of the partition that holds ``run_id`` (``settings`` unpartitioned)."""
    parts = partition_settings(settings)
    return parts[partition_of(run_id, len(parts))]


def read_records(settings: Settings, run_id: str) -> list[Record]:
    """A run's raw stored events, by version ([] when the store has none for it)."""
    _uuid(run_id)
    settings = _partition(settings, run_id)
    with _open(settings) as db:
        return [] if db is None else _read(db, settings, run_id)


def run_ids(settings: Settings) -> list[str]:
    """The id of every run in the store, in the order they were first recorded (partition
    after partition)."""
    if settings.partitions:
        return [r for part in partition_settings(settings) for r in run_ids(part)]
    with _open(settings) as db:
        return [] if db is None else _run_ids(db, settings)


def audit_key(settings: Settings) -> bytes | None:
    """The configured audit key (``SAGA_AUDIT_KEY``) as bytes, or None."""
    return settings.audit_key.encode() if settings.audit_key else None


def verify_store(settings: Settings, run_ids: Iterable[str] | None = None,
                 key: bytes | str | None = None,
                 expected_heads: Mapping[str, str] | None = None) -> list[Result]:
    """Verify the named runs (every run when None); an unknown named run raises
    :class:`RunNotFoundError`. ``expected_heads``: run id -> a head known from elsewhere."""
    heads = {str(_uuid(k)): v for k, v in (expected_heads or {}).items()}
    wanted = None if run_ids is None else [str(_uuid(r)) for r in run_ids]
    if settings.partitions:  # each partition verifies its own runs
        parts = partition_settings(settings)
        mine = [None if wanted is None else [r for r in wanted
                                             if partition_of(r, len(parts)) == i]
                for i in range(len(parts))]
        return [result for i, (part, ids) in enumerate(zip(parts, mine, strict=True))
                if ids != [] for result in _verify(part, ids, key, heads, (i, len(parts)))]
    return _verify(settings, wanted, key, heads, None)


def _verify(settings: Settings, wanted: list[str] | None, key: bytes | str | None,
            heads: Mapping[str, str], place: tuple[int, int] | None) -> list[Result]:
    """:func:`verify_store` in one database (``place``: the partition it is, if one)."""
    results = []
    with _open(settings) as db:
        if db is None:
            if wanted:
                raise RunNotFoundError(wanted[0])
            return []
        snapshots = _has_table(db, _tables(settings)[1])
        for run_id in _run_ids(db, settings) if wanted is None else wanted:
            records = _read(db, settings, run_id)
            if not records:
                raise RunNotFoundError(run_id)
            result = verify_records(records, key, heads.get(run_id))
            if result.ok and snapshots:
                result = _check_snapshot(settings, result, key, place)
            results.append(result)
    return results


def _check_snapshot(settings: Settings, result: Result, key: bytes | str | None,
                    place: tuple[int, int] | None = None) -> Result:
    """A run's latest snapshot against the state its (verified) events produce: an edited
    snapshot is reported, key or no key, because the state is rebuilt to compare."""
    if key:
        settings = replace(settings, audit_key=key.decode() if isinstance(key, bytes) else key)
    app = SagaApplication(settings, place)
    try:
        if app.snapshots is None:
            return result
        uid = _uuid(result.run_id)
        try:
            latest = list(app.snapshots.get(uid, desc=True, limit=1))
        except (EncryptionKeyError, DoctoredSnapshotError):
            # Sealed at rest, and the key is not here (or the run's was shredded): a
            # snapshot is a cache that no run is folded from without the key either.
            return result
        if not latest:
            return result
        snapshot: Any = latest[0]
        version = snapshot.originator_version
        try:
            claimed = snapshot.mutate(None)
        except DoctoredSnapshotError as e:
            why = str(e)
        else:
            rebuilt = app.rebuild(uid, version)
            if _comparable(claimed) == _comparable(rebuilt):
                return result
            why = (f"the snapshot of run {result.run_id} at version {version} is not the "
                   "state its events produce")
    finally:
        app.close()
    return replace(result, ok=False, broken_at=version, reason=SNAPSHOT_DOCTORED,
                   message=f"{SNAPSHOT_DOCTORED}: {why}")


def _comparable(run: Any) -> bytes:
    """A run's state, as canonical JSON, without what a snapshot adds or what is derived
    from the rest (which one object may have worked out and the other not yet)."""
    state = {k: v for k, v in vars(run).items()
             if k not in ("_pending_events", "seal") and k not in DERIVED}
    return canonical(state)


# -- export ----------------------------------------------------------------------------
