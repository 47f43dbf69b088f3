"""Exporting a run's events with their chain, and verifying an export away from the store."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from saga.audit.chain import (
    EVENT_DELETED,
    FORGED,
    INSERTED_OR_REORDERED,
    Record,
    Result,
    _broken,
    link_of,
    verify_records,
)
from saga.audit.store import (
    read_records,
)
from saga.chain import CHAIN_FIELDS, SEAL_FIELDS
from saga.config import Settings
from saga.domain import TOPIC_PREFIX
from saga.errors import RunNotFoundError


def export_events(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Records as export events: type, version, timestamp, actor, payload (as stored),
    payload_hash, prev_hash, hash (the link) and mac; an event sealed at rest also its
    ``sealed_hash`` and ``sealed_mac`` (its payload is exported as stored, sealed)."""
    return [{"type": r.type_name, "version": r.version, "timestamp": r.timestamp,
             "actor": r.actor, "payload": r.payload, "payload_hash": r.payload_hash,
             "prev_hash": r.prev_hash, "hash": link_of(r), "mac": r.mac,
             **{f: r.state[f] for f in SEAL_FIELDS if f in r.state}} for r in records]


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
    for n, item in enumerate(events, 1):
        if not isinstance(item, dict):
            raise ValueError(f"event {n} of the export is not an object")
        missing = [f for f in _EXPORT_FIELDS if f not in item]
        if missing:
            raise ValueError(f"event {n} of the export lacks {', '.join(missing)}")
        if not isinstance(item["payload"], dict):
            raise ValueError(f"event {n} of the export has a payload that is not an object")
    run_id = run_id or events[0].get("run_id")
    if not run_id:
        raise ValueError("the export names no run_id")
    return str(run_id), events, head if isinstance(head, str) else None


def _record_of(run_id: str, e: Mapping[str, Any]) -> Record:
    state: dict[str, Any] = {"timestamp": {"_type_": "datetime_iso", "_data_": e["timestamp"]}}
    state.update({f: e.get(f) for f in CHAIN_FIELDS})
    state.update({f: e[f] for f in SEAL_FIELDS if f in e})
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
