"""Payloads encrypted at rest, with a data key per run and crypto-shredding.

With an encryption key configured (``[encryption] key_env`` or ``key_file`` in
``saga.toml``, or ``SAGA_ENCRYPTION_KEY_ENV`` naming the variable that holds it), every
run gets its own random 256-bit *data key*. The fields of its events that carry user data
(the ones retention redacts: RunStarted ``inputs``, StepStarted ``parameters``,
StepCompleted / StepCompensated ``output``, RunCompleted / RunFailed / RunCompensated
``outputs``) and the whole state of its snapshots are sealed with that key (AES-256-GCM,
``cryptography``), each value as ``{"_sealed_": base64(nonce | ciphertext | tag)}`` with
the run id, version and field name as associated data (a value moved to another event or
run fails its tag). The data key is stored *wrapped* (AES-GCM) by the key-encryption key
(KEK) in a key table, with the KEK's id: on SQLite in ``keys.db`` beside ``saga.db`` (not
in the event database file), on PostgreSQL in ``saga_data_keys``.

The chain (see :mod:`saga.audit.chain`) keeps its fields in clear text: ``prev_hash``,
``payload_hash`` (of the plaintext payload, computed by the aggregate as before) and
``mac``. A sealed event adds ``sealed_hash``, the sha256 of its payload as stored (the
sealed values included), and with an audit key ``sealed_mac``, an HMAC binding that hash
to the event's run, version and ``payload_hash``. So ``saga audit verify`` reads and
checks every chain link and every stored payload without the encryption key: an edited
ciphertext no longer matches its ``sealed_hash`` (and, with the audit key, a rewritten
``sealed_hash`` no longer matches its ``sealed_mac``).

Shredding a run deletes its data key row: the run's sealed values then read as
``{"_redacted": true, "_shredded": true}`` in every copy of the event store, including
backups taken before, as long as the key table (and its backups) no longer hold the key.

Key rotation (:func:`rotate`) unwraps every data key with the current KEK and wraps it
with the new one in one transaction; no event is rewritten.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, cast
from uuid import UUID

from eventsourcing.persistence import Mapper, StoredEvent, Transcoder, find_id_convertor
from eventsourcing.utils import get_topic, resolve_topic

from saga.chain import SEAL_FIELDS, USER_DATA, payload_hash, payload_of, sign
from saga.config import Settings
from saga.domain import run_uuid
from saga.errors import ConfigError, DoctoredSnapshotError, EncryptionKeyError
from saga.lazy import lazy
from saga.store.side_tables import Database

aead = lazy("cryptography.hazmat.primitives.ciphers.aead")

#: Per event type, the fields sealed with the run's data key (the user data: the same
#: fields retention redacts, :data:`saga.chain.USER_DATA`); a snapshot seals ``state``.
SEALED: dict[str, tuple[str, ...]] = {**USER_DATA, "Snapshot": ("state",)}
SEALED_KEY = "_sealed_"
#: What a sealed value reads as once its run's data key was shredded.
SHREDDED: dict[str, Any] = {"_redacted": True, "_shredded": True}
#: Seconds a process keeps a run's unwrapped data key before it reads the key table again:
#: a shred by another process reaches a long-running one (a server, a worker) within it.
KEY_CACHE_SECONDS = 30.0
KEY_TABLE = "saga_data_keys"
KEY_DDL = (f"""CREATE TABLE IF NOT EXISTS {KEY_TABLE} (
    run_uuid TEXT PRIMARY KEY, wrapped TEXT NOT NULL, kek_id TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL)""",)
KEY_HINT = ("generate one with: python -c 'import base64, os; "
            "print(base64.urlsafe_b64encode(os.urandom(32)).decode())'")


def kek_of(text: str, where: str = "the encryption key") -> bytes:
    """The 32-byte key-encryption key in ``text`` (base64, standard or URL-safe)."""
    try:
        key = base64.urlsafe_b64decode(text.strip().replace("+", "-").replace("/", "_")
                                       .encode() + b"==")
    except (ValueError, binascii.Error):
        key = b""
    if len(key) != 32:
        raise ConfigError(f"{where} must be 32 bytes in base64; {KEY_HINT}")
    return key


def kek_id(kek: bytes) -> str:
    """A short public name of a KEK (recorded beside each data key it wraps)."""
    return hashlib.sha256(b"saga-kek:" + kek).hexdigest()[:16]


def _wrap(kek: bytes, uid: str, data_key: bytes) -> str:
    nonce = os.urandom(12)
    sealed = aead.AESGCM(kek).encrypt(nonce, data_key, b"saga-data-key:" + uid.encode())
    return base64.b64encode(nonce + sealed).decode("ascii")


def _unwrap(kek: bytes, uid: str, wrapped: str) -> bytes:
    raw = base64.b64decode(wrapped)
    return cast(bytes, aead.AESGCM(kek).decrypt(raw[:12], raw[12:],
                                                b"saga-data-key:" + uid.encode()))


class KeyStore:
    """The table of wrapped data keys, one row per run: ``keys.db`` beside a SQLite
    store (so a copy of ``saga.db`` holds no key), ``saga_data_keys`` on PostgreSQL."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.RLock()
        self._db: Any = None
        self._sqlite: sqlite3.Connection | None = None

    @property
    def path(self) -> str:
        """Where the keys are, for messages."""
        return KEY_TABLE if self.settings.is_postgres else str(self.settings.home / "keys.db")

    def _open(self) -> None:
        if self._db is not None or self._sqlite is not None:
            return
        if self.settings.is_postgres:
            self._db = Database(self.settings)
            self._db.create(KEY_DDL)
            return
        self.settings.home.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.settings.home / "keys.db", check_same_thread=False,
                               isolation_level=None)
        # A deleted key's bytes are overwritten, not left in a free page.
        conn.execute("PRAGMA secure_delete = ON")
        conn.execute(KEY_DDL[0])
        self._sqlite = conn

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        """A transaction on the key table: a cursor whose ``execute`` takes ``?``."""
        with self._lock:
            self._open()
            if self._db is not None:
                with self._db.tx() as cur:
                    yield _Cursor(cur, self._db.sql)
                return
            assert self._sqlite is not None
            cur = self._sqlite.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield _Cursor(cur, lambda s: s)
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            cur.execute("COMMIT")

    def get(self, uid: str) -> tuple[str, str] | None:
        """(wrapped key, KEK id) of a run, or None when it has none (shredded)."""
        with self._tx() as cur:
            cur.execute(f"SELECT wrapped, kek_id FROM {KEY_TABLE} WHERE run_uuid = ?", (uid,))
            row = cur.fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    def add(self, uid: str, wrapped: str, kek: str, now: float) -> tuple[str, str]:
        """Store a run's wrapped key unless it has one; returns the one it has."""
        with self._tx() as cur:
            cur.execute(f"INSERT INTO {KEY_TABLE} (run_uuid, wrapped, kek_id, created_at) "
                        "VALUES (?, ?, ?, ?) ON CONFLICT (run_uuid) DO NOTHING",
                        (uid, wrapped, kek, now))
            cur.execute(f"SELECT wrapped, kek_id FROM {KEY_TABLE} WHERE run_uuid = ?", (uid,))
            row = cur.fetchone()
        return str(row[0]), str(row[1])

    def delete(self, uids: Sequence[str]) -> int:
        """Delete these runs' keys (crypto-shredding); returns how many went."""
        gone = 0
        with self._tx() as cur:
            for uid in uids:
                cur.execute(f"DELETE FROM {KEY_TABLE} WHERE run_uuid = ?", (uid,))
                gone += max(cur.rowcount, 0)
        return gone

    def rewrap(self, old: bytes, new: bytes) -> int:
        """Wrap every data key with ``new`` instead of ``old``, in one transaction."""
        old_id, new_id = kek_id(old), kek_id(new)
        with self._tx() as cur:
            cur.execute(f"SELECT run_uuid, wrapped, kek_id FROM {KEY_TABLE}")
            rows = cur.fetchall()
            for uid, wrapped, kid in rows:
                if kid == new_id:
                    continue
                if kid != old_id:
                    raise EncryptionKeyError(
                        f"the data key of run {uid} is wrapped by key {kid}, not by the "
                        f"configured key {old_id}: nothing was rotated")
                cur.execute(f"UPDATE {KEY_TABLE} SET wrapped = ?, kek_id = ? "
                            "WHERE run_uuid = ?",
                            (_wrap(new, uid, _unwrap(old, uid, wrapped)), new_id, uid))
        return len(rows)

    def close(self) -> None:
        """Release the key table's connection."""
        with self._lock:
            if self._db is not None:
                self._db.close()
            if self._sqlite is not None:
                self._sqlite.close()
            self._db = self._sqlite = None


class _Cursor:
    """A driver cursor whose statements are written with ``?`` placeholders."""

    def __init__(self, cur: Any, sql: Any) -> None:
        self.cur, self.sql = cur, sql

    def execute(self, text: str, args: Sequence[Any] = ()) -> None:
        self.cur.execute(self.sql(text), tuple(args))

    def fetchone(self) -> Any:
        row = self.cur.fetchone()
        return None if row is None else tuple(row.values()) if isinstance(row, dict) else row

    def fetchall(self) -> list[Any]:
        return [tuple(r.values()) if isinstance(r, dict) else r for r in self.cur.fetchall()]

    @property
    def rowcount(self) -> int:
        return int(self.cur.rowcount)


class Sealer:
    """Seals and opens values with runs' data keys (kept in memory once unwrapped)."""

    def __init__(self, settings: Settings) -> None:
        self.kek = kek_of(settings.encryption_key) if settings.encryption_key else None
        #: A key is configured for the store, though maybe not available in this process.
        self.configured = settings.encryption_key is not None
        self.keys = KeyStore(settings)
        self._cache: dict[str, tuple[Any, float]] = {}  # run -> (cipher, read at)
        self._lock = threading.Lock()

    def _missing(self, uid: str) -> EncryptionKeyError:
        return EncryptionKeyError(
            f"run {uid}'s payloads are encrypted at rest and the encryption key is not "
            "available here (set the variable [encryption] key_env or "
            "SAGA_ENCRYPTION_KEY_ENV names)")

    def data_key(self, uid: str, create: bool = False) -> Any:
        """The run's AESGCM cipher, or None when its key was shredded (or never made)."""
        found = self._cache.get(uid)
        if found is not None and time.monotonic() - found[1] < KEY_CACHE_SECONDS:
            return found[0]
        if self.kek is None:
            raise self._missing(uid)
        row = self.keys.get(uid)
        if row is None and create:
            row = self.keys.add(uid, _wrap(self.kek, uid, os.urandom(32)), kek_id(self.kek),
                                time.time())
        if row is None:
            return None
        wrapped, kid = row
        if kid != kek_id(self.kek):
            raise EncryptionKeyError(f"run {uid}'s data key is wrapped by key {kid}; the "
                                     f"configured encryption key is {kek_id(self.kek)} (was "
                                     "the key rotated? set the new one)")
        try:
            cipher = aead.AESGCM(_unwrap(self.kek, uid, wrapped))
        except Exception as e:  # InvalidTag: the row was changed
            raise EncryptionKeyError(f"run {uid}'s wrapped data key does not open with the "
                                     f"configured key ({type(e).__name__})") from None
        with self._lock:
            self._cache[uid] = (cipher, time.monotonic())
        return cipher

    def seal(self, cipher: Any, aad: bytes, plain: bytes) -> dict[str, str]:
        """A sealed value: ``{"_sealed_": base64(nonce | ciphertext | tag)}``."""
        nonce = os.urandom(12)
        return {SEALED_KEY: base64.b64encode(nonce + cipher.encrypt(nonce, plain, aad))
                .decode("ascii")}

    def open(self, uid: str, aad: bytes, sealed: str) -> bytes | None:
        """The plaintext of a sealed value; None when the run's key was shredded."""
        cipher = self.data_key(uid)
        if cipher is None:
            return None
        raw = base64.b64decode(sealed)
        try:
            return cast(bytes, cipher.decrypt(raw[:12], raw[12:], aad))
        except Exception:
            raise EncryptionKeyError(f"a sealed value of run {uid} ({aad.decode()}) fails "
                                     "its authentication: it was changed") from None

    def forget(self, uids: Sequence[str]) -> None:
        """Drop these runs' keys from memory."""
        with self._lock:
            for uid in uids:
                self._cache.pop(uid, None)


_SEALERS: dict[tuple[str, str | None], Sealer] = {}
_SEALERS_LOCK = threading.Lock()


def sealer_for(settings: Settings) -> Sealer | None:
    """The process's one :class:`Sealer` of this store and key (the events, the undo store
    and the cache share its unwrapped keys), or None when no key is configured. Its key
    table's connection reopens on use after a close."""
    if settings.encryption_key is None:
        return None
    where = (settings.store_description, settings.encryption_key)
    with _SEALERS_LOCK:
        found = _SEALERS.get(where)
        if found is None:
            found = _SEALERS[where] = Sealer(settings)
        return found


def seal_value(sealer: Sealer, run_id: str, label: str, value: bytes) -> str:
    """``value`` (of a side table: the undo store, the cache) sealed with the run's data
    key, as JSON text; ``label`` names where it is kept (its associated data)."""
    uid = str(run_uuid(run_id))
    cipher = sealer.data_key(uid, create=True)
    if cipher is None:
        raise EncryptionKeyError(f"run {uid}'s data key was shredded: nothing more can be "
                                 "recorded for it")
    return json.dumps(sealer.seal(cipher, f"{uid}|{label}".encode(), value))


def open_value(sealer: Sealer, run_id: str, label: str, stored: Any) -> bytes | None:
    """The plaintext of :func:`seal_value`'s text; None when the run's key was shredded."""
    uid = str(run_uuid(run_id))
    sealed = json.loads(stored) if isinstance(stored, str) else stored
    return sealer.open(uid, f"{uid}|{label}".encode(), str(sealed[SEALED_KEY]))


def _aad(uid: str, version: int, name: str) -> bytes:
    return f"{uid}|{version}|{name}".encode()


def sealed_mac(key: bytes, run_id: str, version: int, plain_hash: str, stored_hash: str) -> str:
    """The HMAC binding a sealed event's stored payload hash to its run, version and
    plaintext payload hash (which its chain link covers)."""
    return sign(key, f"{run_id}|{version}|{plain_hash}|{stored_hash}")


class SealingMapper(Mapper[UUID]):
    """The library's mapper, sealing the user-data fields of a run's events (and its
    snapshots' state) with the run's data key as they are stored, and opening them as
    they are read."""

    def __init__(self, transcoder: Transcoder, sealer: Sealer, audit_key: bytes | None) -> None:
        super().__init__(transcoder=transcoder)
        self.sealer = sealer
        self.audit_key = audit_key

    def close(self) -> None:
        """Release the key table's connection (opened on first use)."""
        self.sealer.keys.close()

    def to_stored_event(self, domain_event: Any) -> StoredEvent:
        """The event as stored, its user-data fields sealed."""
        cls = type(domain_event)
        state = dict(vars(domain_event))
        originator_id = state.pop("originator_id")
        version = state.pop("originator_version")
        class_version = getattr(cls, "class_version", 1)
        if class_version > 1:
            state["class_version"] = class_version
        names = [n for n in SEALED.get(cls.__name__, ()) if n in state] \
            if self.sealer.configured else []
        if names:
            uid = str(originator_id)
            cipher = self.sealer.data_key(uid, create=True)
            if cipher is None:  # shredded: nothing more of this run is kept readable
                raise EncryptionKeyError(f"run {uid}'s data key was shredded: nothing more "
                                         "can be recorded for it")
            for name in names:
                state[name] = self.sealer.seal(cipher, _aad(uid, version, name),
                                               self.transcoder.encode({"v": state[name]}))
            if "payload_hash" in state:  # a chained event: its stored payload's hash
                stored = payload_hash(payload_of(state))
                state["sealed_hash"] = stored
                if self.audit_key:
                    state["sealed_mac"] = sealed_mac(self.audit_key, uid, version,
                                                     str(state["payload_hash"]), stored)
        return StoredEvent(originator_id=originator_id, originator_version=version,
                           topic=get_topic(cls), state=self.transcoder.encode(state))

    def to_domain_event(self, stored_event: StoredEvent, opened: bool = True) -> Any:
        """The event as the aggregate knows it, its sealed fields opened (a shredded
        run's read as :data:`SHREDDED`); ``opened=False``: left sealed, for a reader
        that needs none of them (the read model), which then needs no key."""
        cls = resolve_topic(stored_event.topic)
        state: dict[str, Any] = self.transcoder.decode(stored_event.state)
        uid = str(stored_event.originator_id)
        version = stored_event.originator_version
        for name in SEAL_FIELDS:
            state.pop(name, None)
        for name in SEALED.get(cls.__name__, ()):
            value = state.get(name)
            if opened and isinstance(value, dict) and SEALED_KEY in value:
                plain = self.sealer.open(uid, _aad(uid, version, name), str(value[SEALED_KEY]))
                if plain is None and name == "state":  # a snapshot is a cache: rebuilt
                    raise DoctoredSnapshotError(f"the snapshot of run {uid} at version "
                                                f"{version} is sealed with a shredded key")
                state[name] = dict(SHREDDED) if plain is None else \
                    self.transcoder.decode(plain)["v"]
        convert = find_id_convertor(cls, cast(Hashable, type(stored_event.originator_id)))
        state["originator_id"] = convert(stored_event.originator_id)
        state["originator_version"] = version
        class_version = getattr(cls, "class_version", 1)
        from_version = state.pop("class_version", 1)
        while from_version < class_version:
            getattr(cls, f"upcast_v{from_version}_v{from_version + 1}")(state)
            from_version += 1
        event = object.__new__(cls)
        object.__setattr__(event, "__dict__", state)
        return event


def unopened(mapper: Any, stored_event: StoredEvent) -> Any:
    """A stored event as a domain event whose sealed values are left sealed: what reads
    only the fields that are never sealed (type, step, status, times) needs no key."""
    if isinstance(mapper, SealingMapper):
        return mapper.to_domain_event(stored_event, opened=False)
    return mapper.to_domain_event(stored_event)


def sealing_mapper(settings: Settings, transcoder: Transcoder) -> SealingMapper | None:
    """The mapper for a store with an encryption key configured, or None without one.

    A store without a key still reads (and opens) sealed events when it is given a key
    later; without it, reading a sealed value is an :class:`EncryptionKeyError`."""
    sealer = sealer_for(settings) or Sealer(settings)
    return SealingMapper(transcoder, sealer,
                         settings.audit_key.encode() if settings.audit_key else None)


def shred(settings: Settings, run_ids: Sequence[str]) -> int:
    """Delete these runs' data keys; returns how many were deleted."""
    uids = [str(run_uuid(r)) for r in run_ids]
    keys = KeyStore(settings)
    try:
        return keys.delete(uids)
    finally:
        keys.close()
        shared = sealer_for(settings)
        if shared is not None:  # nor kept in this process's memory
            shared.forget(uids)


def rotate(settings: Settings, new_key: str) -> int:
    """Rewrap every data key with ``new_key`` (the configured key unwraps them); returns
    how many keys the table holds."""
    if not settings.encryption_key:
        raise ConfigError("saga keys rotate needs the current key configured "
                          "([encryption] key_env or SAGA_ENCRYPTION_KEY_ENV)")
    keys = KeyStore(settings)
    try:
        return keys.rewrap(kek_of(settings.encryption_key),
                           kek_of(new_key, "the new encryption key"))
    finally:
        keys.close()

