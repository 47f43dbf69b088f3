"""The undo store: what a tool records only to be able to undo a step, kept out of the log.

A tool marks such state by returning it under ``"_undo"`` in its output (the file tool's
previous bytes, the sql tool's ``undo_capture`` rows); a step with ``secret_outputs: true``
has its whole output kept here. The executor stores it in ``saga_undo`` (beside the events,
keyed by run, step key and idempotency key) *before* the step's completion is recorded, and
the chained event holds only a reference: ``{"ref": ..., "sha256": ...}``. The digest is
salted (the salt lives in the row), so the log alone cannot be used to confirm a guess of
the state, and it is checked when the state is read back: a compensation refuses state
that is not what the step recorded.

With ``SAGA_UNDO_KEY`` (one or more Fernet keys, comma-separated; the first encrypts, all
decrypt, so a key can be rotated) the state is encrypted with ``cryptography``'s Fernet
(AES-128-CBC with an HMAC-SHA256). Without a key it is stored in plain text, readable by
whoever can read the database, but still never in the chained log, an export or a report.
``saga retention apply`` deletes a run's rows when it redacts the run.

With payloads encrypted at rest (:mod:`saga.store.encryption`) the state is sealed with
the run's own data key instead (``encrypted`` 2), so shredding the run's key makes it
unreadable in every copy of the table too.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import json
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from saga.chain import canonical, json_safe
from saga.domain import run_uuid
from saga.errors import ConfigError, ToolError
from saga.lazy import lazy
from saga.store.encryption import open_value, seal_value, sealer_for
from saga.store.side_tables import Database

if TYPE_CHECKING:
    from cryptography import fernet
else:
    fernet = lazy("cryptography.fernet")  # only with SAGA_UNDO_KEY set

UNDO_TABLE = "saga_undo"
UNDO_DDL = (f"""CREATE TABLE IF NOT EXISTS {UNDO_TABLE} (
    ref TEXT PRIMARY KEY, run_uuid TEXT NOT NULL, step_key TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, attempt INTEGER NOT NULL, salt TEXT NOT NULL,
    encrypted INTEGER NOT NULL, data TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
            f"CREATE INDEX IF NOT EXISTS {UNDO_TABLE}_run ON {UNDO_TABLE} (run_uuid)")

KEY_HINT = ("generate one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())'")


def cipher(key: str | None) -> fernet.MultiFernet | None:
    """The Fernet cipher for ``SAGA_UNDO_KEY`` (None without a key), or ConfigError."""
    if not key:
        return None
    try:
        keys = [fernet.Fernet(part.strip().encode()) for part in key.split(",") if part.strip()]
    except (ValueError, binascii.Error) as e:
        raise ConfigError(f"SAGA_UNDO_KEY must be Fernet keys, comma-separated ({e}); "
                          f"{KEY_HINT}") from e
    return fernet.MultiFernet(keys) if keys else None


def digest(salt: bytes, plain: bytes) -> str:
    """The salted sha256 the log records for a piece of undo state."""
    return hashlib.sha256(salt + plain).hexdigest()


def _refused(message: str, error_type: str) -> ToolError:
    return ToolError(message, error_type=error_type, retryable=False)


class UndoStore:
    """Undo state of steps, in ``saga_undo``, encrypted when a key is configured."""

    def __init__(self, db: Database, key: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.db = db
        self.clock = clock
        self._cipher = cipher(key)  # a bad key is refused now, before anything runs
        self._sealer = sealer_for(db.settings)
        self._created = False

    def _table(self) -> None:
        """Create the table on first use (most runs never need it)."""
        if not self._created:
            self.db.create(UNDO_DDL)
            self._created = True

    @property
    def encrypts(self) -> bool:
        """True when new state is encrypted (``SAGA_UNDO_KEY`` is set)."""
        return self._cipher is not None

    def put(self, run_id: str, step_key: str, idempotency_key: str, attempt: int,
            state: Any) -> dict[str, str]:
        """Keep ``state`` (JSON); returns the reference the log records instead of it."""
        self._table()
        plain = canonical(json_safe(state))
        salt = os.urandom(16)
        ref = f"{idempotency_key}#{attempt}"
        if self._sealer is not None:  # sealed with the run's data key
            data, encrypted = seal_value(self._sealer, run_id, f"undo|{ref}", plain), 2
        else:
            data = self._cipher.encrypt(plain).decode("ascii") if self._cipher else \
                plain.decode("utf-8")
            encrypted = int(self.encrypts)
        self.db.execute(
            f"INSERT INTO {UNDO_TABLE} (ref, run_uuid, step_key, idempotency_key, attempt, "
            "salt, encrypted, data, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (ref) DO UPDATE SET salt = excluded.salt, "
            "encrypted = excluded.encrypted, data = excluded.data, "
            "created_at = excluded.created_at",
            (ref, str(run_uuid(run_id)), step_key, idempotency_key, attempt, salt.hex(),
             encrypted, data, self.clock()))
        return {"ref": ref, "sha256": digest(salt, plain)}

    def get(self, reference: Any) -> Any:
        """The state a reference names, checked against its digest; a ToolError
        (``UndoStateMissing``, ``UndoKeyMissing``, ``UndoStateUnreadable``,
        ``UndoStateTampered``) when it cannot be trusted."""
        if not isinstance(reference, dict) or not isinstance(reference.get("ref"), str):
            raise _refused("the recorded undo reference is malformed", "UndoStateTampered")
        self._table()
        rows = self.db.query(f"SELECT run_uuid, salt, encrypted, data FROM {UNDO_TABLE} "
                             "WHERE ref = ?", (reference["ref"],))
        if not rows:
            raise _refused(f"no undo state {reference['ref']!r} in {UNDO_TABLE} (retention "
                           "clears it from old runs)", "UndoStateMissing")
        row = rows[0]
        plain = str(row["data"]).encode("utf-8")
        if row["encrypted"] == 2:
            plain = self._sealed(str(row["run_uuid"]), reference["ref"], row["data"])
        elif row["encrypted"]:
            if self._cipher is None:
                raise _refused("the undo state is encrypted and SAGA_UNDO_KEY is not set",
                               "UndoKeyMissing")
            try:
                plain = self._cipher.decrypt(plain)
            except fernet.InvalidToken:
                raise _refused("the undo state cannot be decrypted with SAGA_UNDO_KEY (another "
                               "key, or the row was changed)", "UndoStateUnreadable") from None
        try:
            salt = bytes.fromhex(str(row["salt"]))
        except ValueError:
            salt = b""
        if not hmac.compare_digest(digest(salt, plain), str(reference.get("sha256", ""))):
            raise _refused(f"the undo state {reference['ref']!r} does not match the hash the "
                           "run recorded: it was changed, refusing to use it",
                           "UndoStateTampered")
        return json.loads(plain.decode("utf-8"))

    def _sealed(self, run_id: str, ref: str, data: Any) -> bytes:
        """Undo state sealed with its run's data key, opened."""
        if self._sealer is None:
            raise _refused("the undo state is encrypted at rest and no encryption key is "
                           "configured", "UndoKeyMissing")
        plain = open_value(self._sealer, run_id, f"undo|{ref}", data)
        if plain is None:
            raise _refused(f"the undo state {ref!r} is unreadable: its run's data key was "
                           "shredded", "UndoStateMissing")
        return plain

    def forget(self, run_id: str) -> int:
        """Delete a run's undo state; returns how many rows went."""
        self._table()
        return self.db.execute(f"DELETE FROM {UNDO_TABLE} WHERE run_uuid = ?",
                               (str(run_uuid(run_id)),))
