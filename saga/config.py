"""Settings, read once from an environment mapping and ``saga.toml``.

Precedence: environment variables (``SAGA_*``) over ``saga.toml`` (in the working
directory, or the file named by ``SAGA_CONFIG``) over ``[tool.saga]`` in
``pyproject.toml`` over defaults. Nothing here reads the environment at import time.
"""

from __future__ import annotations

import getpass
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from saga.errors import ConfigError


@dataclass(frozen=True)
class Settings:
    """Everything configurable, resolved."""

    home: Path = Path(".saga")
    database_url: str | None = None
    schema: str | None = None
    tools: tuple[str, ...] = ()
    actor: str = "unknown"
    pool_size: int = 2
    max_overflow: int = 4
    snapshot_interval: int = 100
    lease_seconds: float = 30.0
    #: How long one store operation keeps reconnecting to a lost PostgreSQL before it
    #: gives up (StoreUnavailableError, exit 3); worker loops wait on beyond it.
    reconnect_seconds: float = 30.0
    #: The longest wait ``saga run`` (driving in process) waits out; a longer one returns
    #: the run ``waiting`` for a worker.
    hold_seconds: float = 60.0
    audit_key: str | None = field(default=None, repr=False)
    #: Environment variables compositions may read by name as ``{{ secret.NAME }}``
    #: (saga.toml ``[secrets] allow``); ``SAGA_SECRET_NAME`` is always readable.
    secrets_allow: tuple[str, ...] = ()
    #: Seconds one template, condition or compute block may take (``[limits]``).
    expression_seconds: float = 2.0
    file: dict[str, Any] = field(default_factory=dict)

    @property
    def is_postgres(self) -> bool:
        """True when the store is PostgreSQL."""
        url = self.database_url or ""
        return url.startswith(("postgres://", "postgresql://"))

    @property
    def store_description(self) -> str:
        """Where runs are stored, for messages (no password)."""
        if self.is_postgres:
            pg = postgres_params(self.database_url or "", self.schema)
            return (f"postgresql://{pg['POSTGRES_USER']}@{pg['POSTGRES_HOST']}:"
                    f"{pg['POSTGRES_PORT']}/{pg['POSTGRES_DBNAME']}"
                    f" (schema {pg.get('POSTGRES_SCHEMA', 'public')})")
        return str(self.home / "saga.db")

    def store_env(self) -> dict[str, str]:
        """The eventsourcing environment (``PERSISTENCE_MODULE``, ``POSTGRES_*``, ...)."""
        if self.is_postgres:
            env = postgres_params(self.database_url or "", self.schema)
            env.update(PERSISTENCE_MODULE="eventsourcing.postgres",
                       POSTGRES_POOL_SIZE=str(self.pool_size),
                       POSTGRES_MAX_OVERFLOW=str(self.max_overflow),
                       POSTGRES_CONNECT_TIMEOUT="5",
                       # No ping before each checkout: a dead connection fails its call,
                       # and saga.store.reconnect drops the pool's dead ones and tries
                       # again (psycopg_pool's own check waits 1, 2, 4 s between them).
                       POSTGRES_PRE_PING="n")
            return env
        return {"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(self.home / "saga.db"),
                "SQLITE_LOCK_TIMEOUT": "30"}


def postgres_params(url: str, schema: str | None = None) -> dict[str, str]:
    """``POSTGRES_*`` keys from ``postgresql://user[:pw]@host[:port]/db[?schema=s]``."""
    parsed = urlparse(url)
    if not parsed.hostname or not parsed.path.strip("/"):
        shown = url.replace(f":{parsed.password}@", ":***@", 1) if parsed.password else url
        raise ConfigError(f"database URL {shown!r} must look like postgresql://user@host:5432/db")
    query = parse_qs(parsed.query)
    params = {
        "POSTGRES_HOST": parsed.hostname,
        "POSTGRES_PORT": str(parsed.port or 5432),
        "POSTGRES_DBNAME": unquote(parsed.path.strip("/")),
        "POSTGRES_USER": unquote(parsed.username or getpass.getuser()),
        "POSTGRES_PASSWORD": unquote(parsed.password or ""),
    }
    chosen = schema or (query.get("schema") or [""])[0]
    if chosen:
        params["POSTGRES_SCHEMA"] = chosen
    return params


def _file_settings(env: Mapping[str, str], cwd: Path) -> dict[str, Any]:
    named = env.get("SAGA_CONFIG")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"SAGA_CONFIG names {named!r}, which is not a file")
        return _read_toml(path)
    if (cwd / "saga.toml").is_file():
        return _read_toml(cwd / "saga.toml")
    if (cwd / "pyproject.toml").is_file():
        table = _read_toml(cwd / "pyproject.toml").get("tool", {}).get("saga", {})
        return dict(table) if isinstance(table, dict) else {}
    return {}


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from e


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def load_settings(env: Mapping[str, str] | None = None, cwd: Path | None = None,
                  **overrides: Any) -> Settings:
    """Resolve settings from ``env`` (default ``os.environ``), config files and overrides."""
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    data = _file_settings(env, cwd)
    database = data.get("database", {}) if isinstance(data.get("database"), dict) else {}
    tools = list(data.get("tools", {}).get("modules", [])) if isinstance(
        data.get("tools"), dict) else list(data.get("tools", []))
    tools += [m for m in env.get("SAGA_TOOLS", "").split(",") if m.strip()]
    home = env.get("SAGA_HOME") or data.get("home") or ".saga"
    try:
        settings = Settings(
            home=(cwd / home) if not Path(home).is_absolute() else Path(home),
            database_url=env.get("SAGA_DATABASE_URL") or database.get("url"),
            schema=env.get("SAGA_DATABASE_SCHEMA") or database.get("schema"),
            tools=tuple(dict.fromkeys(t.strip() for t in tools)),
            actor=env.get("SAGA_ACTOR") or _user(),
            pool_size=int(env.get("SAGA_POOL_SIZE") or database.get("pool_size", 2)),
            max_overflow=int(env.get("SAGA_MAX_OVERFLOW") or database.get("max_overflow", 4)),
            snapshot_interval=int(env.get("SAGA_SNAPSHOT_INTERVAL")
                                  or data.get("snapshot_interval", 100)),
            lease_seconds=float(env.get("SAGA_LEASE_SECONDS") or data.get("lease_seconds", 30)),
            hold_seconds=float(env.get("SAGA_HOLD_SECONDS") or data.get("hold_seconds", 60)),
            reconnect_seconds=float(env.get("SAGA_RECONNECT_SECONDS")
                                    or data.get("reconnect_seconds", 30)),
            audit_key=env.get("SAGA_AUDIT_KEY") or None,
            expression_seconds=float(env.get("SAGA_EXPRESSION_SECONDS")
                                     or (data.get("limits") or {}).get("expression_seconds", 2)),
            secrets_allow=tuple(str(n) for n in (data.get("secrets") or {}).get("allow", [])
                                if isinstance(data.get("secrets"), dict)),
            file=data,
        )
    except ValueError as e:
        raise ConfigError(f"bad configuration value: {e}") from e
    if overrides:
        settings = Settings(**{**settings.__dict__, **{k: v for k, v in overrides.items()
                                                         if v is not None}})
    if settings.database_url and not settings.is_postgres:
        raise ConfigError("SAGA_DATABASE_URL must start with postgresql:// "
                          "(leave it unset for the embedded SQLite store)")
    return settings
