"""Settings, read once from an environment mapping and ``saga.toml``.

Precedence: environment variables (``SAGA_*``) over ``saga.toml`` (in the working
directory, or the file named by ``SAGA_CONFIG``) over ``[tool.saga]`` in
``pyproject.toml`` over defaults. Nothing here reads the environment at import time.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlparse

from saga.errors import ConfigError
from saga.lazy import lazy

if TYPE_CHECKING:
    import tomllib
else:
    tomllib = lazy("tomllib")  # read only where a config file is


@dataclass(frozen=True)
class QueueLimit:
    """What saga.toml's ``[queues.NAME]`` allows one queue, across every worker together:
    ``concurrency`` runs driven at once, and ``rate`` run starts per ``per`` seconds."""

    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None

    @property
    def limited(self) -> bool:
        """True when the queue has any limit."""
        return self.concurrency is not None or self.rate is not None


_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_rate(text: str) -> tuple[int, float]:
    """``"10/m"`` -> (10, 60.0): N starts per second, minute, hour or day (``"5/s"``,
    ``"100/h"``), or per a number of them (``"3/10s"``)."""
    match = _RATE.match(text) if isinstance(text, str) else None
    if not match or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
        raise ConfigError(f"queue rate {text!r} must look like \"10/m\" (N per s, m, h or d, "
                          "or per a number of them: \"3/10s\")")
    return int(match.group(1)), float(match.group(2) or 1) * _UNIT[match.group(3)]


def parse_queues(table: Any) -> dict[str, QueueLimit]:
    """``[queues.NAME]`` tables (``concurrency = N``, ``rate = "10/m"``) as limits."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError("[queues] must hold tables: [queues.NAME] concurrency = 2")
    limits = {}
    for name, spec in table.items():
        if not isinstance(spec, dict) or set(spec) - {"concurrency", "rate"}:
            raise ConfigError(f"[queues.{name}] takes concurrency = N and rate = \"N/m\"")
        concurrency = spec.get("concurrency")
        if concurrency is not None and (isinstance(concurrency, bool)
                                        or not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigError(f"[queues.{name}] concurrency must be a positive integer")
        rate, per = parse_rate(spec["rate"]) if spec.get("rate") is not None else (None, None)
        limits[str(name)] = QueueLimit(concurrency, rate, per)
    return limits


@dataclass(frozen=True)
class ResourceLimit:
    """What saga.toml's ``[resources.NAME]`` allows the calls of steps that name the
    resource, across every worker together: ``concurrency`` calls at once, and a token
    bucket of ``burst`` tokens refilled at ``rate`` per ``per`` seconds (a call takes one)."""

    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None
    burst: int | None = None


def parse_resources(table: Any) -> dict[str, ResourceLimit]:
    """``[resources.NAME]`` tables (``concurrency = N``, ``rate = "5/s"`` or ``"R/min"``,
    ``burst = N``: tokens at most, the rate's count by default) as limits."""
    if not isinstance(table, dict | None):
        raise ConfigError("[resources] must hold tables: [resources.NAME] concurrency = 2")
    limits = {}
    for name, spec in (table or {}).items():
        if not isinstance(spec, dict) or set(spec) - {"concurrency", "rate", "burst"} \
                or not spec:
            raise ConfigError(f"[resources.\"{name}\"] takes concurrency = N, rate = "
                              "\"N/s\" (or N/min) and burst = N")
        for key in ("concurrency", "burst"):
            value = spec.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ConfigError(f"[resources.\"{name}\"] {key} must be a positive integer")
        try:
            rate, per = (None, None) if spec.get("rate") is None else parse_rate(
                re.sub(r"(?<=[0-9/ ])(min|minute)s?\s*$|sec\s*$", lambda m: m.group(0)[0],
                       str(spec["rate"])))
        except ConfigError:
            raise ConfigError(f"[resources.\"{name}\"] rate {spec['rate']!r} must look like "
                              "\"5/s\" or \"100/min\"") from None
        limits[str(name)] = ResourceLimit(spec.get("concurrency"), rate, per,
                                          spec.get("burst") or rate)
    return limits


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
    #: Takeovers after which a run is quarantined (recorded with each run it applies to).
    quarantine_after: int = 3
    #: How long one store operation keeps reconnecting to a lost PostgreSQL before it
    #: gives up (StoreUnavailableError, exit 3); worker loops wait on beyond it.
    reconnect_seconds: float = 30.0
    #: The longest wait ``saga run`` (driving in process) waits out; a longer one returns
    #: the run ``waiting`` for a worker.
    hold_seconds: float = 60.0
    #: How often a drive with calls in flight looks for commands other processes recorded
    #: on its run (a pause, a cancel): how soon a cancel cuts a running call short.
    watch_seconds: float = 1.0
    audit_key: str | None = field(default=None, repr=False)
    #: Fernet key(s), comma-separated (the first encrypts), for the undo store
    #: (``SAGA_UNDO_KEY``); without one, undo state is kept there in plain text.
    undo_key: str | None = field(default=None, repr=False)
    #: The key-encryption key (base64 of 32 bytes) that seals payloads at rest
    #: (:mod:`saga.store.encryption`): read from the variable ``[encryption] key_env``
    #: (or ``SAGA_ENCRYPTION_KEY_ENV``) names, or from ``[encryption] key_file``.
    encryption_key: str | None = field(default=None, repr=False)
    #: Environment variables compositions may read by name as ``{{ secret.NAME }}``
    #: (saga.toml ``[secrets] allow``); ``SAGA_SECRET_NAME`` is always readable.
    secrets_allow: tuple[str, ...] = ()
    #: Seconds one template, condition or compute block may take (``[limits]``).
    expression_seconds: float = 2.0
    #: The largest value an expression may make, and the most items one value may hold
    #: (``[limits] max_value_size``, ``max_items``; None: the built-in 10,000,000 and
    #: 1,000,000).
    expression_max_value_size: int | None = None
    expression_max_items: int | None = None
    #: Bytes one evaluation may hold (``[limits] max_memory``, an integer or a string such
    #: as ``"64MiB"``; None: the built-in 64 MiB).
    expression_max_memory: int | None = None
    #: Limits per queue (saga.toml ``[queues.NAME]``); a queue not named has none.
    queues: dict[str, QueueLimit] = field(default_factory=dict)
    #: Limits per resource (saga.toml ``[resources.NAME]``); a resource not named has none.
    resources: dict[str, ResourceLimit] = field(default_factory=dict)
    #: PostgreSQL recorder: "xid" (no table lock; see saga.store.pg_recorder; the
    #: default) or "library" (eventsourcing's own, which serialises writers on a table lock).
    pg_recorder: str = "xid"
    #: PostgreSQL event commits: "wait" (each append returns once its commit is flushed
    #: to the WAL) or "no-wait" (it does not: a crash of the database server may lose
    #: the last acknowledged appends; xid recorder only).
    pg_commit: str = "wait"
    #: PostgreSQL URLs of the partitions runs are spread over by run id (saga.toml
    #: ``[database] partitions``, ``SAGA_DATABASE_PARTITIONS``); ``database_url`` is the
    #: first, which also holds the side tables (leases, schedules, cache, undo store).
    partitions: tuple[str, ...] = ()
    #: The tenant this store is (saga.toml ``[tenants.NAME]``, ``SAGA_TENANT``); the
    #: configured store itself is ``default`` (see :func:`tenant_settings`).
    tenant: str = "default"
    file: dict[str, Any] = field(default_factory=dict)

    def expression_limits(self) -> dict[str, Any]:
        """The ``[limits]`` settings as :func:`saga.expressions.configure` takes them."""
        return {"seconds": self.expression_seconds,
                "max_value_size": self.expression_max_value_size,
                "max_items": self.expression_max_items,
                "max_memory": self.expression_max_memory}

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
            of = f", first of {len(self.partitions)} partitions" if self.partitions else ""
            return (f"postgresql://{pg['POSTGRES_USER']}@{pg['POSTGRES_HOST']}:"
                    f"{pg['POSTGRES_PORT']}/{pg['POSTGRES_DBNAME']}"
                    f" (schema {pg.get('POSTGRES_SCHEMA', 'public')}{of})")
        return str(self.home / "saga.db")

    def store_env(self) -> dict[str, str]:
        """The eventsourcing environment (``PERSISTENCE_MODULE``, ``POSTGRES_*``, ...)."""
        if self.is_postgres:
            env = postgres_params(self.database_url or "", self.schema)
            env.update(PERSISTENCE_MODULE="eventsourcing.postgres",
                       POSTGRES_POOL_SIZE=str(self.pool_size),
                       POSTGRES_MAX_OVERFLOW=str(self.max_overflow),
                       POSTGRES_CONNECT_TIMEOUT="5",
                       # No ping before each checkout (a round trip each): a dead
                       # connection fails its call, and saga.store.reconnect drops the
                       # pool's dead ones and tries again.
                       POSTGRES_PRE_PING="n")
            if self.pg_recorder == "xid":
                recorder = ("NoWaitXidOrderedRecorder" if self.pg_commit == "no-wait"
                            else "XidOrderedRecorder")
                env["APPLICATION_RECORDER_TOPIC"] = f"saga.store.pg_recorder:{recorder}"
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
    partitions = _partitions(env.get("SAGA_DATABASE_PARTITIONS"), database.get("partitions"))
    url = env.get("SAGA_DATABASE_URL") or database.get("url")
    if partitions and url and url != partitions[0]:
        raise ConfigError("with partitions, leave SAGA_DATABASE_URL (and [database] url) "
                          "unset: the first partition holds the side tables")
    try:
        settings = Settings(
            home=(cwd / home) if not Path(home).is_absolute() else Path(home),
            database_url=partitions[0] if partitions else url,
            partitions=partitions,
            schema=env.get("SAGA_DATABASE_SCHEMA") or database.get("schema"),
            tools=tuple(dict.fromkeys(t.strip() for t in tools)),
            actor=env.get("SAGA_ACTOR") or _user(),
            pool_size=int(env.get("SAGA_POOL_SIZE") or database.get("pool_size", 2)),
            max_overflow=int(env.get("SAGA_MAX_OVERFLOW") or database.get("max_overflow", 4)),
            snapshot_interval=int(env.get("SAGA_SNAPSHOT_INTERVAL")
                                  or data.get("snapshot_interval", 100)),
            lease_seconds=float(env.get("SAGA_LEASE_SECONDS") or data.get("lease_seconds", 30)),
            quarantine_after=int(env.get("SAGA_QUARANTINE_AFTER")
                                 or data.get("quarantine_after", 3)),
            hold_seconds=float(env.get("SAGA_HOLD_SECONDS") or data.get("hold_seconds", 60)),
            watch_seconds=float(env.get("SAGA_WATCH_SECONDS")
                                or data.get("watch_seconds", 1)),
            reconnect_seconds=float(env.get("SAGA_RECONNECT_SECONDS")
                                    or data.get("reconnect_seconds", 30)),
            audit_key=env.get("SAGA_AUDIT_KEY") or None,
            undo_key=env.get("SAGA_UNDO_KEY") or None,
            encryption_key=_encryption_key(env, data, cwd),
            expression_seconds=float(env.get("SAGA_EXPRESSION_SECONDS")
                                     or (data.get("limits") or {}).get("expression_seconds", 2)),
            expression_max_value_size=_int_or_none((data.get("limits") or {})
                                                   .get("max_value_size")),
            expression_max_items=_int_or_none((data.get("limits") or {}).get("max_items")),
            expression_max_memory=_bytes_or_none((data.get("limits") or {}).get("max_memory")),
            secrets_allow=tuple(str(n) for n in (data.get("secrets") or {}).get("allow", [])
                                if isinstance(data.get("secrets"), dict)),
            queues=parse_queues(data.get("queues")),
            resources=parse_resources(data.get("resources")),
            pg_recorder=env.get("SAGA_PG_RECORDER") or database.get("recorder", "xid"),
            pg_commit=env.get("SAGA_PG_COMMIT") or database.get("commit", "wait"),
            file=data,
        )
    except ValueError as e:
        raise ConfigError(f"bad configuration value: {e}") from e
    if overrides:
        settings = Settings(**{**settings.__dict__, **{k: v for k, v in overrides.items()
                                                         if v is not None}})
    if not settings.watch_seconds > 0:
        raise ConfigError(f"SAGA_WATCH_SECONDS must be a positive number of seconds, not "
                          f"{settings.watch_seconds!r}")
    if settings.pg_recorder not in ("xid", "library"):
        raise ConfigError(f"SAGA_PG_RECORDER must be xid or library, not {settings.pg_recorder!r}")
    if settings.pg_commit not in ("wait", "no-wait"):
        raise ConfigError(f"SAGA_PG_COMMIT must be wait or no-wait, not {settings.pg_commit!r}")
    if settings.pg_commit == "no-wait" and settings.pg_recorder != "xid":
        raise ConfigError("SAGA_PG_COMMIT=no-wait needs the xid recorder "
                          "(SAGA_PG_RECORDER=xid, the default)")
    if settings.database_url and not settings.is_postgres:
        raise ConfigError("SAGA_DATABASE_URL must start with postgresql:// "
                          "(leave it unset for the embedded SQLite store)")
    if settings.partitions and (settings.database_url != settings.partitions[0]
                                or not settings.is_postgres):
        raise ConfigError("with partitions, the database URL is the first partition's")
    if env.get("SAGA_TENANT"):
        settings = tenant_settings(settings, env["SAGA_TENANT"])
    return settings


DEFAULT_TENANT = "default"
_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")


def tenant_names(settings: Settings) -> list[str]:
    """The tenants saga.toml configures (``[tenants.NAME]``), after ``default``: the
    configured store itself."""
    table = settings.file.get("tenants") or {}
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise ConfigError('[tenants] must hold tables: [tenants.acme] schema = "acme"')
    for name in table:
        if name == DEFAULT_TENANT:
            raise ConfigError("[tenants.default]: the default tenant is the configured store "
                              "itself ([database]); name the others")
        if not _TENANT.match(str(name)):
            raise ConfigError(f"[tenants.{name}]: a tenant's name is letters, digits, _ and - "
                              "(up to 40, starting with a letter or digit)")
    return [DEFAULT_TENANT, *(str(n) for n in table)]


def tenant_settings(settings: Settings, name: str) -> Settings:
    """The settings of tenant ``name``: a store of its own. ``[tenants.NAME]`` may give
    ``database_url`` (another server; default the configured one) and ``schema``
    (default ``tenant_NAME``) for PostgreSQL, or ``home`` (default
    ``HOME/tenants/NAME``; a relative one is under the working directory) for a SQLite
    file of its own."""
    if name == settings.tenant:
        return settings
    if settings.tenant != DEFAULT_TENANT:
        raise ConfigError(f"these settings are tenant {settings.tenant!r}'s (SAGA_TENANT), "
                          f"not {name!r}'s")
    if name not in tenant_names(settings):
        raise ConfigError(f"no tenant {name!r}: saga.toml configures "
                          f"{', '.join(tenant_names(settings))}")
    if name == DEFAULT_TENANT:  # the configured store itself
        return settings
    spec: dict[str, Any] = settings.file["tenants"][name]
    unknown = set(spec) - {"database_url", "schema", "home"}
    if unknown:
        raise ConfigError(f"[tenants.{name}] takes database_url, schema and home, "
                          f"not {', '.join(sorted(unknown))}")
    url = spec.get("database_url") or (settings.database_url if settings.is_postgres else None)
    if url:
        if not str(url).startswith(("postgres://", "postgresql://")):
            raise ConfigError(f"[tenants.{name}] database_url must be a postgresql:// URL")
        postgres_params(str(url))
        return replace(settings, database_url=str(url), partitions=(), tenant=name,
                       schema=str(spec.get("schema") or f"tenant_{name}"))
    home = Path(str(spec.get("home") or settings.home / "tenants" / name))
    return replace(settings, tenant=name,
                   home=home if home.is_absolute() else Path.cwd() / home)


def _partitions(env_value: str | None, table_value: Any) -> tuple[str, ...]:
    """The partition URLs: ``SAGA_DATABASE_PARTITIONS`` (separated by commas or
    whitespace) over ``[database] partitions`` (a list); one URL is no partitioning."""
    if env_value:
        urls = [u for u in re.split(r"[,\s]+", env_value) if u]
    elif table_value is None:
        return ()
    elif isinstance(table_value, list) and all(isinstance(u, str) for u in table_value):
        urls = list(table_value)
    else:
        raise ConfigError('[database] partitions must be a list of URLs: '
                          'partitions = ["postgresql://h1/saga", "postgresql://h2/saga"]')
    for url in urls:
        if not url.startswith(("postgres://", "postgresql://")):
            raise ConfigError(f"partition {url!r} must be a postgresql:// URL "
                              "(only PostgreSQL stores are partitioned)")
        postgres_params(url)
    if len(set(urls)) != len(urls):
        raise ConfigError("a database is named twice in the partitions")
    return tuple(urls) if len(urls) > 1 else ()


def _encryption_key(env: Mapping[str, str], data: dict[str, Any], cwd: Path) -> str | None:
    """The encryption key's text: from the variable ``SAGA_ENCRYPTION_KEY_ENV`` or
    ``[encryption] key_env`` names (the key itself never sits in a file saga reads
    settings from), else from ``[encryption] key_file``; None when neither is set, ""
    when the variable named is not set in this process."""
    found = data.get("encryption")
    table: dict[str, Any] = found if isinstance(found, dict) else {}
    name = env.get("SAGA_ENCRYPTION_KEY_ENV") or table.get("key_env")
    if name:
        # Unset here: "" (configured, not available), so this process can still verify
        # the audit chain but refuses to write or read sealed payloads.
        return (env.get(str(name)) or "").strip()
    if table.get("key_file"):
        path = Path(str(table["key_file"])).expanduser()
        try:
            return (path if path.is_absolute() else cwd / path).read_text().strip()
        except OSError as e:
            raise ConfigError(f"cannot read [encryption] key_file {path}: {e}") from e
    return None


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def _bytes_or_none(value: Any) -> int | None:
    """A byte count: an integer, or a string such as ``"64MiB"`` (KiB, MiB, GiB)."""
    if value is None or isinstance(value, int):
        return value
    number = str(value).strip().rstrip("BbIiKkMmGg ")
    unit = str(value).strip()[len(number):].strip().lower()
    if unit not in _UNITS or not number.isdigit():
        raise ValueError(f"max_memory {value!r}: write bytes, or a number with KiB, MiB or GiB")
    return int(number) * _UNITS[unit]
