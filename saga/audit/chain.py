"""Audit integrity: verify each run's hash chain on the raw store, export it, apply retention.

Every stored ``Run`` event carries ``prev_hash`` (its predecessor's link), ``payload_hash``
(sha256 of its payload's canonical JSON), ``actor`` and, when ``SAGA_AUDIT_KEY`` was set as
it was written, ``mac`` = HMAC-SHA256(key, link) (see :mod:`saga.domain`). The link of an
event is ``event_hash(type, version, timestamp, actor, payload_hash, prev_hash)``.

Verification reads RAW stored records (topic, version, state JSON), never domain objects,
so an edited payload that no longer fits its event class is still reported, not a crash.
For each event, in version order, it checks (first failure wins, reported as ``broken_at``
and one of :data:`REASONS`):

- ``not a chain``: the first event is not ``RunStarted`` or its ``prev_hash`` is not empty;
- ``event deleted``: a version is missing, or an event's ``prev_hash`` names a predecessor
  that is nowhere in the run (deleted and the rest renumbered; see the note below);
- ``event inserted or reordered``: versions out of order, a second first event, an event
  of another run, or an event whose ``prev_hash`` names an event stored elsewhere in the
  run (swapped versions), or which a later event skips over (inserted, versions shifted);
- ``payload edited``: the payload's sha256 differs from the ``payload_hash`` recorded
  (or the stored state is not a JSON object at all);
- ``forged``: with a key, the ``mac`` is missing or wrong (in an export, also an event
  whose recorded ``hash`` does not match its fields).

What the chain alone cannot prove:

- **A re-forged chain.** Someone who edits an event and recomputes every hash after it
  produces a consistent chain; only the ``mac`` (which needs the key) catches that. So
  verify with the key wherever the key is configured.
- **A deleted tail.** Removing the LAST events leaves a shorter, consistent chain whose
  macs are all still valid. What closes this gap is a head known from outside the store:
  the ``head`` of an earlier export, of an earlier ``saga audit verify``, or shipped to a
  log or a ticket (with a key, that head is itself authenticated by the last event's
  mac). Pass it as ``expected_head``: the chain must still contain it (as its head, or —
  because a run may legitimately go on, e.g. a completed run compensated later — as an
  earlier event's link); if it is nowhere, the tail was deleted (``event deleted``,
  ``broken_at`` = the first missing version).
- **Which event changed, without a key.** If an event's time, actor or type is
  edited (or its payload with ``payload_hash`` updated), the break shows at its successor,
  whose recorded predecessor no longer exists: reported as ``event deleted`` there, with
  a message that says either is possible. With the key it is ``forged`` at the event.

Retention (:func:`apply_retention`) rewrites, for finished runs older than N days, the
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
:func:`verify_records`).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

from saga.config import Settings
from saga.database import Database
from saga.domain import CHAIN_FIELDS, GENESIS, event_hash, payload_hash, payload_of, sign
from saga.errors import RunNotFoundError, StoreUnavailableError, first_line

log = logging.getLogger(__name__)

PAYLOAD_EDITED = "payload edited"
EVENT_DELETED = "event deleted"
INSERTED_OR_REORDERED = "event inserted or reordered"
FORGED = "forged"
NOT_A_CHAIN = "not a chain"
#: Every reason a verification can fail with.
REASONS = (PAYLOAD_EDITED, EVENT_DELETED, INSERTED_OR_REORDERED, FORGED, NOT_A_CHAIN)

#: The value a removed payload field is replaced with.
REDACTED: dict[str, Any] = {"_redacted": True}
#: Per event type, the payload fields that carry user data (removed by retention).
REDACTABLE: dict[str, tuple[str, ...]] = {
    "RunStarted": ("inputs",),
    "StepStarted": ("parameters",),
    "StepCompleted": ("output",),
    "StepCompensated": ("output",),
    "RunCompleted": ("outputs",),
    "RunFailed": ("outputs",),
    "RunCompensated": ("outputs",),
}
#: Event types that end a run.
TERMINAL_TYPES = frozenset({"RunCompleted", "RunFailed", "RunCompensated", "RunCancelled"})
FIRST_TYPE = "RunStarted"
TOPIC_PREFIX = "saga."

# The library's table names: SQLite always uses stored_*; PostgreSQL uses <app name>_*.
_SQLITE_TABLES = ("stored_events", "stored_snapshots")
_POSTGRES_TABLES = ("saga_events", "saga_snapshots")
# How many alternative (event, version) links a failed verification may compute to tell
# a reordering from a deletion (diagnosis only: the break itself is found exactly).
_SEARCH_BUDGET = 200_000
# The state of a record whose stored bytes are not a JSON object.
_UNREADABLE = "_unreadable_"


# -- records ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    """One stored event as it is in the store: no domain class involved."""

    run_id: str
    version: int
    topic: str
    state: dict[str, Any]

    @property
    def type_name(self) -> str:
        """The event's class name (``saga.StepStarted`` -> ``StepStarted``)."""
        return self.topic.rsplit(":", 1)[-1].rsplit(".", 1)[-1]

    @property
    def timestamp(self) -> str:
        """The event's time as stored: the ISO text its link covers."""
        value = self.state.get("timestamp")
        if isinstance(value, dict) and "_data_" in value:
            return str(value["_data_"])
        return "" if value is None else str(value)

    @property
    def actor(self) -> str | None:
        value = self.state.get("actor")
        return None if value is None else str(value)

    @property
    def prev_hash(self) -> str:
        value = self.state.get("prev_hash")
        return GENESIS if value is None else str(value)

    @property
    def payload_hash(self) -> str:
        value = self.state.get("payload_hash")
        return "" if value is None else str(value)

    @property
    def mac(self) -> str | None:
        value = self.state.get("mac")
        return None if value is None else str(value)

    @property
    def payload(self) -> dict[str, Any]:
        """The payload as stored (custom types still in their ``_type_`` wrapping)."""
        return payload_of(self.state)


def link_of(record: Record, version: int | None = None) -> str:
    """The record's link in its run's chain (at ``version``, default its stored one)."""
    return event_hash(record.type_name, record.version if version is None else version,
                      record.timestamp, record.actor, record.payload_hash, record.prev_hash)


def payload_digest(state: Mapping[str, Any]) -> str:
    """sha256 of a raw stored state's payload, as :func:`saga.domain.payload_hash` computed
    it at write time (custom values such as datetimes are unwrapped first, so they hash as
    the original objects did)."""
    return payload_hash(payload_of(_unwrap(dict(state))))


_WRAPPED = {"datetime_iso": datetime.fromisoformat, "uuid_hex": UUID, "decimal_str": Decimal}


def _unwrap(value: Any) -> Any:
    """Turn the library's ``{"_type_", "_data_"}`` wrappings back into the objects."""
    if isinstance(value, dict):
        if len(value) == 2 and value.get("_type_") in _WRAPPED and "_data_" in value:
            with contextlib.suppress(Exception):  # a doctored value: hash it as it is
                return _WRAPPED[value["_type_"]](value["_data_"])
            return value
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _is_redacted(record: Record) -> bool:
    return any(record.state.get(f) == REDACTED for f in REDACTABLE.get(record.type_name, ()))


# -- the verdict -----------------------------------------------------------------------

@dataclass(frozen=True)
class Result:
    """The verdict on one run's chain."""

    ok: bool
    run_id: str
    events: int
    head: str
    redacted: int = 0
    broken_at: int | None = None
    reason: str | None = None
    message: str = ""
    keyed: bool = False  # True when every mac was checked with a key

    def to_json(self) -> dict[str, Any]:
        """The verdict as a JSON object."""
        return asdict(self)

    def __str__(self) -> str:
        if self.ok:
            extra = f", {self.redacted} redacted" if self.redacted else ""
            keyed = ", macs verified" if self.keyed else ", no key: macs not checked"
            return (f"run {self.run_id}: ok ({self.events} events{extra}{keyed}), "
                    f"head {self.head}")
        return f"run {self.run_id}: BROKEN at event {self.broken_at}: {self.message}"


def _broken(run_id: str, records: Sequence[Record], at: int, reason: str, message: str,
            redacted: int, keyed: bool) -> Result:
    head = link_of(records[-1]) if records else GENESIS
    return Result(ok=False, run_id=run_id, events=len(records), head=head, redacted=redacted,
                  broken_at=at, reason=reason, message=f"{reason}: {message}", keyed=keyed)


# -- verification ----------------------------------------------------------------------

def verify_records(records: Sequence[Record], key: bytes | str | None = None,
                   expected_head: str | None = None) -> Result:
    """Verify one run's raw records, in the order given (the store's is by version).

    ``key``: the audit key; when given, every event must carry the right ``mac``.
    ``expected_head``: a head known from outside the store (an earlier export or verify);
    the chain must still contain it, which is what detects a deleted last event.

    An event whose payload hash no longer matches but whose user-data fields (see
    :data:`REDACTABLE`) hold the redaction marker is accepted on its recorded
    ``payload_hash`` alone and counted in ``redacted``, provided a terminal event follows
    it (retention only touches finished runs). Its payload cannot be re-checked: the
    removed values are gone, so the hash of the original payload cannot be recomputed.
    That is acceptable because the link still covers the ``payload_hash`` recorded at
    write time: the event's existence, type, time, actor, place in the chain and (with a
    key) authenticity stay proven, and anyone holding the original payload (an export
    taken before retention) can still prove it is the one that was recorded. What is lost
    is proof of the event's remaining payload fields.
    """
    key_bytes = key.encode() if isinstance(key, str) else key
    keyed = bool(key_bytes)
    if not records:
        return Result(ok=False, run_id="", events=0, head=GENESIS, broken_at=1,
                      reason=NOT_A_CHAIN, message=f"{NOT_A_CHAIN}: no events", keyed=keyed)
    run_id = records[0].run_id
    links = [link_of(r) for r in records]
    last_terminal = max((i for i, r in enumerate(records) if r.type_name in TERMINAL_TYPES),
                        default=-1)
    redacted = 0

    def broken(at: int, reason: str, message: str) -> Result:
        return _broken(run_id, records, at, reason, message, redacted, keyed)

    for i, r in enumerate(records):
        v, kind = r.version, r.type_name
        if r.run_id != run_id:
            return broken(v, INSERTED_OR_REORDERED,
                          f"event {v} ({kind}) belongs to run {r.run_id}, not {run_id}")
        if _UNREADABLE in r.state and v == (1 if i == 0 else records[i - 1].version + 1):
            return broken(v, PAYLOAD_EDITED, f"event {v} ({kind}) is not a JSON object: its "
                          "stored state was overwritten")
        if i == 0:
            if v > 1 and any(x.version == 1 for x in records[1:]):
                return broken(1, INSERTED_OR_REORDERED,
                              f"event {v} ({kind}) comes before event 1: events were reordered")
            if v > 1:
                missing = "event 1 is" if v == 2 else f"events 1..{v - 1} are"
                return broken(1, EVENT_DELETED, f"the run's {missing} missing")
            if v < 1 or kind != FIRST_TYPE or r.prev_hash != GENESIS:
                return broken(v, NOT_A_CHAIN,
                              f"the first event is {kind} version {v} with prev_hash "
                              f"{r.prev_hash!r}; a chain starts with {FIRST_TYPE} version 1 "
                              "with an empty prev_hash")
        else:
            before = records[i - 1].version
            if v <= before:
                return broken(v, INSERTED_OR_REORDERED,
                              f"event {v} ({kind}) comes after event {before}")
            if v > before + 1 and any(x.version == before + 1 for x in records[i + 1:]):
                return broken(before + 1, INSERTED_OR_REORDERED,
                              f"event {v} ({kind}) comes before event {before + 1}: events "
                              "were reordered")
            if v > before + 1:
                missing = (f"event {before + 1} is" if v == before + 2
                           else f"events {before + 1}..{v - 1} are")
                return broken(before + 1, EVENT_DELETED, f"{missing} missing")
            if kind == FIRST_TYPE or r.prev_hash == GENESIS:
                return broken(v, INSERTED_OR_REORDERED,
                              f"event {v} ({kind}) claims to start the run")
            if r.prev_hash != links[i - 1]:
                at, reason, message = _diagnose(records, links, i)
                return broken(at, reason, message)
        if payload_digest(r.state) != r.payload_hash:
            if _is_redacted(r) and i <= last_terminal:
                redacted += 1
            else:
                return broken(v, PAYLOAD_EDITED,
                              f"the payload of event {v} ({kind}) does not match the "
                              "payload_hash recorded when it was written")
        if key_bytes:
            if r.mac is None:
                return broken(v, FORGED, f"event {v} ({kind}) carries no mac")
            if not hmac.compare_digest(r.mac.encode(), sign(key_bytes, links[i]).encode()):
                return broken(v, FORGED, f"the mac of event {v} ({kind}) is wrong: its fields "
                              "were changed, or it was not written with this key")
    head = links[-1]
    message = f"{len(records)} events verify"
    if expected_head and expected_head != head:
        if expected_head not in links:
            last = records[-1].version
            return broken(last + 1, EVENT_DELETED,
                          f"the known head {expected_head} is not in the chain: event "
                          f"{last + 1} and any after it were deleted (or the history was "
                          "rewritten)")
        at = records[links.index(expected_head)].version
        message += f"; the known head is event {at}, {records[-1].version - at} recorded since"
    return Result(ok=True, run_id=run_id, events=len(records), head=head, redacted=redacted,
                  message=message, keyed=keyed)


def _diagnose(records: Sequence[Record], links: Sequence[str],
              i: int) -> tuple[int, str, str]:
    """Why event ``i``'s prev_hash is not its predecessor's link: (broken_at, reason, why)."""
    r = records[i]
    v, kind = r.version, r.type_name
    found = _locate(records, links, r.prev_hash)
    if found is not None:
        j, original = found
        if j < i - 1:
            first, last = records[j + 1].version, records[i - 1].version
            span = f"event {first} was" if first == last else f"events {first}..{last} were"
            return first, INSERTED_OR_REORDERED, (
                f"event {v} ({kind}) was recorded right after event {records[j].version}: "
                f"{span} inserted")
        moved = "" if original == records[j].version else f" (recorded as version {original})"
        return v, INSERTED_OR_REORDERED, (
            f"event {v} ({kind}) was recorded right after the event now stored as version "
            f"{records[j].version}{moved}: events were reordered")
    later = next((m for m in range(i + 1, len(records))
                  if records[m].prev_hash == links[i - 1]), None)
    if later is not None:
        last = records[later - 1].version
        span = f"event {v} was" if last == v else f"events {v}..{last} were"
        return v, INSERTED_OR_REORDERED, (
            f"event {records[later].version} was recorded right after event "
            f"{records[i - 1].version}: {span} inserted")
    return v, EVENT_DELETED, (
        f"event {v} ({kind}) was recorded after an event that is no longer in the run: an "
        f"event before it was deleted (and the rest renumbered), or the time, actor, type "
        f"or payload_hash of event {records[i - 1].version} was changed")


def _locate(records: Sequence[Record], links: Sequence[str],
            target: str) -> tuple[int, int] | None:
    """(index, version) of the event whose link is ``target``: at its stored version, or
    (within a budget) at another version, for an event whose version was changed."""
    if target in links:
        j = links.index(target)
        return j, records[j].version
    top = max(r.version for r in records) + 1
    width = max(1, _SEARCH_BUDGET // (2 * len(records)))
    for j, r in enumerate(records):
        for version in range(max(1, r.version - width), min(top, r.version + width) + 1):
            if version != r.version and link_of(r, version) == target:
                return j, version
    return None


# -- the store -------------------------------------------------------------------------

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
    try:
        return UUID(str(run_id))
    except ValueError:
        raise RunNotFoundError(str(run_id)) from None


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


def read_records(settings: Settings, run_id: str) -> list[Record]:
    """A run's raw stored events, by version ([] when the store has none for it)."""
    _uuid(run_id)
    with _open(settings) as db:
        return [] if db is None else _read(db, settings, run_id)


def run_ids(settings: Settings) -> list[str]:
    """The id of every run in the store, in the order they were first recorded."""
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
    results = []
    with _open(settings) as db:
        if db is None:
            if wanted:
                raise RunNotFoundError(wanted[0])
            return []
        for run_id in _run_ids(db, settings) if wanted is None else wanted:
            records = _read(db, settings, run_id)
            if not records:
                raise RunNotFoundError(run_id)
            results.append(verify_records(records, key, heads.get(run_id)))
    return results


# -- export ----------------------------------------------------------------------------

def export_events(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Records as export events: type, version, timestamp, actor, payload (as stored),
    payload_hash, prev_hash, hash (the link) and mac."""
    return [{"type": r.type_name, "version": r.version, "timestamp": r.timestamp,
             "actor": r.actor, "payload": r.payload, "payload_hash": r.payload_hash,
             "prev_hash": r.prev_hash, "hash": link_of(r), "mac": r.mac} for r in records]


def export_run(settings: Settings, run_id: str, fmt: str = "json") -> str:
    """A run's complete history as text: ``json`` (one object ``{run_id, events, head}``)
    or ``jsonl`` (one event per line, each with its ``run_id``)."""
    if fmt not in ("json", "jsonl"):
        raise ValueError(f"unknown export format {fmt!r} (json or jsonl)")
    records = read_records(settings, run_id)
    if not records:
        raise RunNotFoundError(run_id)
    rid, events = records[0].run_id, export_events(records)
    if fmt == "jsonl":
        return "".join(json.dumps({"run_id": rid, **e}, ensure_ascii=False) + "\n"
                       for e in events)
    return json.dumps({"run_id": rid, "events": events, "head": events[-1]["hash"]},
                      indent=2, ensure_ascii=False) + "\n"


_EXPORT_FIELDS = ("type", "version", "timestamp", "payload", "payload_hash", "prev_hash")


def parse_export(text: str) -> tuple[str, list[dict[str, Any]], str | None]:
    """(run_id, events, head or None) of an export in either format; ValueError if it is
    not one."""
    stripped = text.strip()
    document: Any = None
    with contextlib.suppress(json.JSONDecodeError):
        document = json.loads(stripped)
    if isinstance(document, dict) and isinstance(document.get("events"), list):
        events, head, run_id = document["events"], document.get("head"), document.get("run_id")
    else:
        events, head, run_id = [], None, None
        for n, line in enumerate(stripped.splitlines(), 1):
            if not line.strip():
                continue
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"line {n} is not JSON: {e.msg}") from None
    if not events:
        raise ValueError("not a saga export: no events")
    for n, e in enumerate(events, 1):
        if not isinstance(e, dict):
            raise ValueError(f"event {n} of the export is not an object")
        missing = [f for f in _EXPORT_FIELDS if f not in e]
        if missing:
            raise ValueError(f"event {n} of the export lacks {', '.join(missing)}")
        if not isinstance(e["payload"], dict):
            raise ValueError(f"event {n} of the export has a payload that is not an object")
    run_id = run_id or events[0].get("run_id")
    if not run_id:
        raise ValueError("the export names no run_id")
    return str(run_id), events, head if isinstance(head, str) else None


def _record_of(run_id: str, e: Mapping[str, Any]) -> Record:
    state: dict[str, Any] = {"timestamp": {"_type_": "datetime_iso", "_data_": e["timestamp"]}}
    state.update({f: e.get(f) for f in CHAIN_FIELDS})
    state.update(e["payload"])
    version = e["version"]
    return Record(str(e.get("run_id") or run_id),
                  version if isinstance(version, int) else -1,
                  TOPIC_PREFIX + str(e["type"]), state)


def verify_export(text: str, key: bytes | str | None = None,
                  expected_head: str | None = None) -> Result:
    """Verify an export (json or jsonl) offline: the same checks as on the store, plus
    each event's recorded ``hash`` and the file's ``head`` (json). ValueError when the
    text is not an export at all."""
    run_id, events, head = parse_export(text)
    records = [_record_of(run_id, e) for e in events]
    result = verify_records(records, key, expected_head)
    keyed = result.keyed
    for r, e in zip(records, events, strict=True):
        if result.broken_at is not None and r.version >= result.broken_at:
            break
        if e.get("hash") is not None and e["hash"] != link_of(r):
            return _broken(run_id, records, r.version, FORGED,
                           f"the hash recorded for event {r.version} ({r.type_name}) does not "
                           "match its type, version, time, actor, payload_hash or prev_hash",
                           result.redacted, keyed)
    if not result.ok or head is None or head == result.head:
        return result
    links = [link_of(r) for r in records]
    if head in links:
        at = records[links.index(head)].version
        return _broken(run_id, records, at + 1, INSERTED_OR_REORDERED,
                       f"the export's head is event {at}: the events after it were added",
                       result.redacted, keyed)
    return _broken(run_id, records, records[-1].version + 1, EVENT_DELETED,
                   f"the export's head {head} is not in its chain: event "
                   f"{records[-1].version + 1} and any after it were removed (or the head "
                   "was edited)", result.redacted, keyed)


# -- retention -------------------------------------------------------------------------

@dataclass
class _Plan:
    updates: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    snapshots: int = 0

    def __bool__(self) -> bool:
        return bool(self.updates or self.snapshots)


def _finished_before(records: Sequence[Record], cutoff: datetime) -> bool:
    if not records or records[-1].type_name not in TERMINAL_TYPES:
        return False
    try:
        when = datetime.fromisoformat(records[-1].timestamp)
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


def _retain(db: Database, settings: Settings, run_id: str, cutoff: datetime, dry_run: bool,
            key: bytes | str | None) -> bool:
    events, snapshots = _tables(settings)
    has_snapshots = _has_table(db, snapshots)
    args = _id_args(db, run_id)
    # A first look outside any transaction skips runs that are not due cheaply.
    plan = _plan(_read(db, settings, run_id), cutoff, key)
    if plan is None:
        return False
    if dry_run:
        if has_snapshots:
            rows = db.query(f"SELECT COUNT(*) AS n FROM {snapshots} WHERE {_id_where(db)}",
                            args)
            plan.snapshots = int(rows[0]["n"])
        return bool(plan)
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
    return bool(plan)


def apply_retention(settings: Settings, older_than_days: float, dry_run: bool = False,
                    now: datetime | None = None, key: bytes | str | None = None) -> list[str]:
    """Remove user data from finished runs whose last event is older than
    ``older_than_days`` (relative to ``now``, default the current time); returns the ids of
    the runs changed (with ``dry_run``, that would be changed; nothing is written).

    Each run is rewritten in one transaction: the fields in :data:`REDACTABLE` become
    ``{"_redacted": true}``, every other field (type, timestamp, actor, prev_hash,
    payload_hash, mac) stays, and the run's snapshots are deleted. A run whose chain does
    not verify (with ``key`` when given) is skipped and logged, so evidence of tampering is
    never overwritten. Unfinished runs are never touched.
    """
    if older_than_days < 0:
        raise ValueError("older_than_days must be >= 0")
    moment = now or datetime.now(UTC)
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    cutoff = moment - timedelta(days=older_than_days)
    changed = []
    with _open(settings) as db:
        if db is None:
            return []
        for run_id in _run_ids(db, settings):
            if _retain(db, settings, run_id, cutoff, dry_run, key):
                changed.append(run_id)
    return changed
