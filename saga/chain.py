"""Canonical JSON and the hash chain every run's events form.

Every hash in saga covers canonical JSON (sorted keys, no whitespace, UTF-8), so the same
value hashes the same in any process and any language. Each event of a run records the
hash of its own payload and the link of its predecessor; its own link covers its type,
version, time, actor, payload hash and predecessor (see :func:`event_hash`), and with an
audit key, an HMAC of that link. This module is pure: the aggregate writes the chain
(:mod:`saga.domain`, whose new events :func:`new_event` makes with their chain fields)
and the auditor reads it back (:mod:`saga.audit`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import re
from typing import Any

#: Fields every event carries for the audit chain, apart from its payload.
CHAIN_FIELDS = ("actor", "prev_hash", "payload_hash", "mac")
#: Per event type, the fields that hold users' data (inputs, parameters, outputs):
#: what retention redacts (``saga.audit.chain.REDACTABLE``) and encryption at rest seals
#: (``saga.store.encryption.SEALED``), so the two can never disagree.
USER_DATA: dict[str, tuple[str, ...]] = {
    "RunStarted": ("inputs",),
    "StepStarted": ("parameters",),
    "StepCompleted": ("output",),
    "StepCompensated": ("output",),
    "StepCompensationStarted": ("parameters",),
    "RunCompleted": ("outputs",),
    "RunFailed": ("outputs",),
    "RunCompensated": ("outputs",),
    "HeartbeatRecorded": ("details",),
}

#: Fields an event sealed at rest adds as it is stored (:mod:`saga.store.encryption`): the
#: hash of its payload as stored, and with an audit key an HMAC binding it to the chain.
SEAL_FIELDS = ("sealed_hash", "sealed_mac")
#: The predecessor link of a run's first event in logs written before runs were bound to
#: their ids (still accepted; see :func:`genesis`).
GENESIS = ""
_SURROGATE = re.compile("[\ud800-\udfff]")
_ENVELOPE = ("originator_id", "originator_version", "timestamp", "originator_topic")
_DEFAULTS: dict[type, tuple[tuple[str, Any, Any], ...]] = {}
_FIELDS: dict[type, frozenset[str]] = {}
# One encoder for every hash: json.dumps with options builds a new one at each call.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              default=str)


def json_safe(value: Any) -> Any:
    """The value with every lone surrogate (text no UTF-8 can hold, such as a JSON
    ``"\\ud800"`` escape decodes to) replaced by U+FFFD, in strings and keys alike: what a
    tool answers or a user sends must be recordable, or the step could never be recorded
    as finished and would run again and again."""
    if isinstance(value, str):
        return value if _SURROGATE.search(value) is None else _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def canonical(value: Any) -> bytes:
    """Canonical JSON, the form every hash covers: sorted keys, no whitespace, UTF-8."""
    return _CANONICAL.encode(value).encode()


def definition_hash(data: dict[str, Any]) -> str:
    """sha256 hex digest of canonical JSON (sorted keys, no whitespace)."""
    return hashlib.sha256(canonical(data)).hexdigest()


def genesis(run_id: str) -> str:
    """The predecessor link of a run's first event: it binds the whole chain (and, through
    each link, every HMAC) to the run's id, so a history copied under another run id no
    longer verifies."""
    return hashlib.sha256(f"saga-run:{run_id}".encode()).hexdigest()


def payload_of(fields: dict[str, Any]) -> dict[str, Any]:
    """An event's payload: its fields without the envelope and the chain fields."""
    return {k: v for k, v in fields.items()
            if k not in _ENVELOPE and k not in CHAIN_FIELDS and k not in SEAL_FIELDS}


def payload_hash(payload: dict[str, Any]) -> str:
    """sha256 of the payload's canonical JSON."""
    return hashlib.sha256(canonical(payload)).hexdigest()


def event_hash(event_type: str, version: int, timestamp: str, actor: str | None,
               payload_digest: str, prev_hash: str) -> str:
    """An event's link in its run's chain: covers its type, version, time, actor, the hash
    of its payload (so a payload can later be removed) and its predecessor's hash."""
    text = "|".join([event_type, str(version), timestamp, actor or "", payload_digest,
                     prev_hash])
    return hashlib.sha256(text.encode()).hexdigest()


def sign(key: bytes, digest: str) -> str:
    """HMAC-SHA256 of a chain link."""
    return hmac.new(key, digest.encode(), hashlib.sha256).hexdigest()


def seal(state: dict[str, Any], key: bytes | None) -> str:
    """The seal of a snapshot's state (every field but the seal itself): an HMAC with the
    audit key, else a sha256 (which catches a careless edit; only the key, or rebuilding
    the state from the events as ``saga audit verify`` does, catches a careful one)."""
    body = canonical({k: v for k, v in state.items() if k != "seal"})
    return hmac.new(key, body, hashlib.sha256).hexdigest() if key else \
        hashlib.sha256(body).hexdigest()


def link_fields(event_type: str, version: int, timestamp: str, actor: str | None,
                payload: dict[str, Any], prev: str, key: bytes | None
                ) -> tuple[dict[str, Any], str]:
    """The chain fields of a new event (its actor, predecessor link, payload hash and,
    with an audit key, the HMAC of its own link), and that link. ``payload``: the
    event's fields but the envelope and the chain fields (:func:`payload_of`)."""
    digest = payload_hash(payload)
    link = event_hash(event_type, version, timestamp, actor, digest, prev)
    return {"actor": actor, "prev_hash": prev, "payload_hash": digest,
            "mac": sign(key, link) if key else None}, link


def payload_defaults(event_class: type) -> tuple[tuple[str, Any, Any], ...]:
    """The payload fields of an event class that have a default, ``(name, default,
    factory)``, looked up once per class: a new event spells them out so its payload hash
    covers exactly what is stored."""
    found = _DEFAULTS.get(event_class)
    if found is None:
        found = _DEFAULTS[event_class] = tuple(
            (f.name, f.default, None if f.default_factory is dataclasses.MISSING
             else f.default_factory)
            for f in dataclasses.fields(event_class)
            if f.name not in CHAIN_FIELDS and f.name not in _ENVELOPE
            and (f.default is not dataclasses.MISSING
                 or f.default_factory is not dataclasses.MISSING))
    return found


def new_event(event_class: Any, originator_id: Any, version: int, timestamp: Any,
              payload: dict[str, Any], chain: dict[str, Any]) -> Any:
    """An event of a run, made as the library's mapper makes one it reads back: its fields
    become its ``__dict__``. A frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, which cost more than the rest of making the event; what it
    checked, that every field and no other is given, is checked here."""
    state = {"originator_id": originator_id, "originator_version": version,
             "timestamp": timestamp, **payload, **chain}
    names = _FIELDS.get(event_class)
    if names is None:
        names = _FIELDS[event_class] = frozenset(f.name for f in dataclasses.fields(event_class))
    if state.keys() != names:
        raise TypeError(f"{event_class.__name__} takes the fields {sorted(names)}, "
                        f"not {sorted(state)}")
    event = object.__new__(event_class)
    object.__setattr__(event, "__dict__", state)
    return event
