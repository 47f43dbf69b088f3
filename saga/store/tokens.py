"""API tokens of tenants, kept in the ``saga_tokens`` table of the configured store.

A token's secret is shown once, when it is made, and never stored: the table keeps the
SHA-256 of its random part (256 bits from :mod:`secrets`, so a plain digest is as good
as a slow one), compared in constant time. The secret reads ``saga_<id>_<random>``, so
the row is found by its id and nothing is searched by a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from saga.errors import InputError, Problem, SagaError
from saga.store.side_tables import Database

#: What each scope may do, each including the one before it.
SCOPES = ("read", "operate", "admin")
DDL = ("""CREATE TABLE IF NOT EXISTS saga_tokens (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, tenant TEXT NOT NULL, scope TEXT NOT NULL,
    digest TEXT NOT NULL, created_at TEXT NOT NULL, created_by TEXT NOT NULL,
    expires_at TEXT, revoked_at TEXT, revoked_by TEXT)""",)
_COLUMNS = ("id", "name", "tenant", "scope", "created_at", "created_by", "expires_at",
            "revoked_at", "revoked_by")
_SECRET = re.compile(r"^saga_([0-9a-f]{12})_([A-Za-z0-9_-]{20,})$")
_NAME = re.compile(r"^[\w.@+-]{1,60}$")
_DURATION = re.compile(r"^\s*(\d+)\s*([mhdw])\s*$")
_UNIT = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_expiry(text: str) -> timedelta:
    """``"30d"`` -> 30 days: a number of minutes, hours, days or weeks (m, h, d, w)."""
    match = _DURATION.match(text)
    if not match or int(match.group(1)) < 1:
        raise InputError([Problem("--expires", "a duration such as 30d, 12h, 2w or 90m")])
    return timedelta(seconds=int(match.group(1)) * _UNIT[match.group(2)])


def digest(secret: str) -> str:
    """The stored form of a token's random part."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Token:
    """One token, as listed: everything but its secret."""

    id: str
    name: str
    tenant: str
    scope: str
    created_at: str
    created_by: str
    expires_at: str | None = None
    revoked_at: str | None = None
    revoked_by: str | None = None

    @property
    def actor(self) -> str:
        """Who a change made with this token is recorded as: ``token:<id>:<name>``."""
        return f"token:{self.id}:{self.name}"

    def live(self, now: datetime) -> bool:
        """True while the token is neither revoked nor expired."""
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or datetime.fromisoformat(self.expires_at) > now

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        """The token's fields, and its state (``active``, ``expired``, ``revoked``)."""
        now = now or datetime.now(UTC)
        state = ("revoked" if self.revoked_at else "active" if self.live(now) else "expired")
        return {**{c: getattr(self, c) for c in _COLUMNS}, "state": state}


class TokenStore:
    """The ``saga_tokens`` table of one store."""

    def __init__(self, db: Database) -> None:
        self.db = db
        db.create(DDL)

    def create(self, tenant: str, scope: str, *, name: str | None = None,
               expires: timedelta | None = None, actor: str = "unknown",
               now: datetime | None = None) -> tuple[Token, str]:
        """A new token and its secret (shown once: only its digest is kept)."""
        if scope not in SCOPES:
            raise InputError([Problem("--scope", f"one of {', '.join(SCOPES)}")])
        name = name or f"{tenant}-{scope}"
        if not _NAME.match(name):
            raise InputError([Problem("--name", "letters, digits and ._@+- (1 to 60)")])
        now = now or datetime.now(UTC)
        ident, random = secrets.token_hex(6), secrets.token_urlsafe(32)
        token = Token(ident, name, tenant, scope, now.isoformat(), actor,
                      (now + expires).isoformat() if expires else None)
        self.db.execute(
            "INSERT INTO saga_tokens (id, name, tenant, scope, digest, created_at, created_by,"
            " expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (token.id, name, tenant, scope, digest(random), token.created_at, actor,
             token.expires_at))
        return token, f"saga_{ident}_{random}"

    def all(self, tenant: str | None = None) -> list[Token]:
        """Every token (of ``tenant``), oldest first."""
        where, args = ("WHERE tenant = ?", (tenant,)) if tenant else ("", ())
        rows = self.db.query(f"SELECT {', '.join(_COLUMNS)} FROM saga_tokens {where} "
                             "ORDER BY created_at, id", args)
        return [Token(**row) for row in rows]

    def get(self, ident: str) -> Token:
        """The token ``ident`` (TokenNotFoundError, exit 4, when there is none)."""
        rows = self.db.query(f"SELECT {', '.join(_COLUMNS)} FROM saga_tokens WHERE id = ?",
                             (ident,))
        if not rows:
            raise TokenNotFoundError(f"no token {ident!r} (saga token list shows them)")
        return Token(**rows[0])

    def revoke(self, ident: str, actor: str = "unknown",
               now: datetime | None = None) -> Token:
        """Revoke a token: it is refused from now on (revoking twice changes nothing)."""
        self.get(ident)
        self.db.execute("UPDATE saga_tokens SET revoked_at = ?, revoked_by = ? "
                        "WHERE id = ? AND revoked_at IS NULL",
                        ((now or datetime.now(UTC)).isoformat(), actor, ident))
        return self.get(ident)

    def any_live(self, now: datetime | None = None) -> bool:
        """True when some token may be used: the API then requires one."""
        now = now or datetime.now(UTC)
        rows = self.db.query("SELECT expires_at FROM saga_tokens WHERE revoked_at IS NULL")
        return any(r["expires_at"] is None or datetime.fromisoformat(r["expires_at"]) > now
                   for r in rows)

    def verify(self, presented: str, now: datetime | None = None) -> Token | None:
        """The live token whose secret is ``presented``, else None (unknown, wrong,
        expired or revoked alike)."""
        match = _SECRET.match(presented)
        if match is None:
            return None
        rows = self.db.query(f"SELECT digest, {', '.join(_COLUMNS)} FROM saga_tokens "
                             "WHERE id = ?", (match.group(1),))
        if not rows:
            return None
        row = dict(rows[0])
        stored = row.pop("digest")
        if not hmac.compare_digest(stored.encode(), digest(match.group(2)).encode()):
            return None
        token = Token(**row)
        return token if token.live(now or datetime.now(UTC)) else None


class TokenNotFoundError(SagaError):
    """No token has that id (exit 4 and a 404, as a run that is not there)."""

    exit_code = 4
