"""Verifying a run's hash chain, on raw records: pure (the records come from
:mod:`saga.audit.store` or an export).

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
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from saga.chain import (
    GENESIS,
    USER_DATA,
    event_hash,
    genesis,
    payload_hash,
    payload_of,
    sign,
)
from saga.domain import ENDINGS

log = logging.getLogger(__name__)


PAYLOAD_EDITED = "payload edited"


EVENT_DELETED = "event deleted"


INSERTED_OR_REORDERED = "event inserted or reordered"


FORGED = "forged"


NOT_A_CHAIN = "not a chain"
TRANSPLANTED = "transplanted"
SNAPSHOT_DOCTORED = "snapshot doctored"
#: Every reason a verification can fail with.


REASONS = (PAYLOAD_EDITED, EVENT_DELETED, INSERTED_OR_REORDERED, FORGED, NOT_A_CHAIN,
           TRANSPLANTED, SNAPSHOT_DOCTORED)

#: The value a removed payload field is replaced with.


REDACTED: dict[str, Any] = {"_redacted": True}
#: Per event type, the payload fields that carry user data (removed by retention).


REDACTABLE = USER_DATA
#: Event types that end a run.


TERMINAL_TYPES = frozenset(ENDINGS)


FIRST_TYPE = "RunStarted"
RETENTION_TYPE = "RetentionApplied"



# The library's table names: SQLite always uses stored_*; PostgreSQL uses <app name>_*.


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
                convert: Any = _WRAPPED[value["_type_"]]
                return convert(value["_data_"])
            return value
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _retained(later: Sequence[Record]) -> dict[str, str]:
    """Version -> hash of the redacted payload, from the ``RetentionApplied`` events."""
    found: dict[str, str] = {}
    for r in later:
        if r.type_name == RETENTION_TYPE and isinstance(r.state.get("versions"), dict):
            found.update({str(k): str(v) for k, v in r.state["versions"].items()})
    return found


def redacted(value: Any) -> bool:
    """Whether a payload value is gone: redacted by retention, or unreadable because its
    run's data key was shredded (``{"_redacted": true, "_shredded": true}``)."""
    return isinstance(value, dict) and value.get("_redacted") is True


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

    An event whose payload hash no longer matches is accepted as redacted (and counted
    in ``redacted``) only when a later ``RetentionApplied`` event of the same chain
    records the hash of exactly the payload it now has: retention writes that event (it
    is chained and, with a key, signed like every other) before it rewrites anything. So
    the original payload's hash still proves the event was written as it was, and the
    retention event's hash proves that nothing but the user-data fields (see
    :data:`REDACTABLE`) changed since. An event made to look redacted by hand, or
    changed after retention, is ``payload edited``.
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
    starts = (genesis(run_id), GENESIS)  # GENESIS: a run written before runs were bound

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
            if v == 1 and kind == FIRST_TYPE and r.prev_hash not in starts \
                    and len(r.prev_hash) == 64:
                return broken(v, TRANSPLANTED,
                              f"event 1 was written for another run: its history was copied "
                              f"under run id {run_id}")
            if v < 1 or kind != FIRST_TYPE or r.prev_hash not in starts:
                return broken(v, NOT_A_CHAIN,
                              f"the first event is {kind} version {v} with prev_hash "
                              f"{r.prev_hash!r}; a chain starts with {FIRST_TYPE} version 1 "
                              "whose prev_hash binds it to its run id")
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
            if kind == FIRST_TYPE or r.prev_hash in starts:
                return broken(v, INSERTED_OR_REORDERED,
                              f"event {v} ({kind}) claims to start the run")
            if r.prev_hash != links[i - 1]:
                at, reason, message = _diagnose(records, links, i)
                return broken(at, reason, message)
        # An event sealed at rest (saga.store.encryption) is checked against the hash of
        # its payload as stored; its plaintext payload_hash stays in the link.
        sealed = r.state.get("sealed_hash")
        if payload_digest(r.state) != (r.payload_hash if sealed is None else str(sealed)):
            retained = _retained(records[i + 1:]).get(str(v))
            if _is_redacted(r) and i <= last_terminal and retained == payload_digest(r.state):
                redacted += 1
            else:
                why = "" if not _is_redacted(r) else (
                    " (it looks redacted, but no retention event records it)" if retained is None
                    else " (it changed after retention redacted it)")
                field = "payload_hash" if sealed is None else "sealed_hash"
                return broken(v, PAYLOAD_EDITED,
                              f"the payload of event {v} ({kind}) does not match the "
                              f"{field} recorded when it was written{why}")
        if key_bytes:
            if r.mac is None:
                return broken(v, FORGED, f"event {v} ({kind}) carries no mac")
            if not hmac.compare_digest(r.mac.encode(), sign(key_bytes, links[i]).encode()):
                return broken(v, FORGED, f"the mac of event {v} ({kind}) is wrong: its fields "
                              "were changed, or it was not written with this key")
            if sealed is not None and not hmac.compare_digest(
                    str(r.state.get("sealed_mac")).encode(),
                    sign(key_bytes, f"{run_id}|{v}|{r.payload_hash}|{sealed}").encode()):
                return broken(v, FORGED, f"the sealed payload of event {v} ({kind}) does not "
                              "match its sealed_mac: it was replaced")
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
