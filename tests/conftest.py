"""Shared fixtures: a store per test, parametrised over SQLite and a real PostgreSQL.

The PostgreSQL half of the suite (a test parametrised with ``"postgres"``, one using
``pg_settings`` or ``pg_schema``, or one marked ``postgres``) needs the server at
``SAGA_TEST_DATABASE_URL``. When it cannot be reached those tests are skipped with the
reason, unless ``CI`` is set: there they fail, since CI must run them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from saga.api import Saga
from saga.config import Settings
from saga.tools import Registry, load_registry

PG_URL = os.environ.get("SAGA_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
_PG_FIXTURES = frozenset({"pg_settings", "pg_schema"})


def needs_postgres(item: pytest.Item) -> bool:
    """Whether a test belongs to the PostgreSQL half of the suite."""
    if item.get_closest_marker("postgres") is not None:
        return True
    if _PG_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    return callspec is not None and any(
        isinstance(v, str) and v == "postgres" for v in callspec.params.values())


@functools.cache
def postgres_unavailable() -> str | None:
    """Why the test server cannot be used, or None when it answers (asked once)."""
    where = re.sub(r"//([^:/@]+):[^@]*@", r"//\1:***@", PG_URL)
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install -e '.[postgres]')"
    try:
        with psycopg.connect(PG_URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as e:
        detail = " ".join(str(e).split()) or type(e).__name__
        return f"PostgreSQL at {where} is unreachable: {detail[:200]}"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not needs_postgres(item):
        return
    reason = postgres_unavailable()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI runs the PostgreSQL half of the suite: it must answer)",
                    pytrace=False)
    pytest.skip(reason)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if os.environ.get("CI"):
        return  # there the PostgreSQL tests errored, each with the reason
    if postgres_unavailable.cache_info().currsize and postgres_unavailable():
        skipped = [r for r in terminalreporter.stats.get("skipped", [])
                   if "PostgreSQL at" in str(r.longrepr) or "psycopg" in str(r.longrepr)]
        terminalreporter.write_line(f"{postgres_unavailable()}: {len(skipped)} PostgreSQL "
                                    "tests skipped")


def _drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@contextlib.contextmanager
def postgres_store() -> Iterator[Settings]:
    """Settings for a fresh PostgreSQL schema of its own, dropped afterwards."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        yield Settings(database_url=PG_URL, schema=schema, actor="tester", pool_size=1,
                       max_overflow=2)
    finally:
        _drop_schema(schema)


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    """Settings for a store of its own: a fresh SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield Settings(home=tmp_path / ".saga", actor="tester")
        return
    with postgres_store() as pg:
        yield pg


@pytest.fixture
def pg_settings() -> Iterator[Settings]:
    """Settings for a fresh PostgreSQL schema only."""
    with postgres_store() as pg:
        yield pg


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    """Settings for a fresh SQLite store only (for tests about the engine, not the store)."""
    return Settings(home=tmp_path / ".saga", actor="tester")


def store_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a new process on the store of ``settings``: none of this
    process's ``SAGA_*``, this checkout importable, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                         env.get("PYTHONPATH", "")])
    if settings.is_postgres:
        env.update(SAGA_DATABASE_URL=settings.database_url or "",
                   SAGA_DATABASE_SCHEMA=settings.schema or "")
    else:
        env["SAGA_HOME"] = str(settings.home)
    env.update(extra)
    return env


@pytest.fixture
def registry() -> Registry:
    """Built-ins plus the test tools in tests/standins/standins.py."""
    return load_registry(["tests.standins.standins"])


def _verify_every_run(s: Saga, request: pytest.FixtureRequest) -> None:
    """Every run a test created replays to the same decisions (unless it doctored them)."""
    if "doctored" in request.keywords or s._app is None:
        return
    for _, run_id in s.app.run_ids():
        divergence = s.verify(run_id)
        assert divergence is None, f"run {run_id}: {divergence}"


@pytest.fixture
def saga(settings: Settings, registry: Registry,
         request: pytest.FixtureRequest) -> Iterator[Saga]:
    """A Saga on a store of its own (parametrised over SQLite and PostgreSQL); every run
    it recorded is replayed through the scheduler afterwards."""
    s = Saga(settings, registry=registry)
    yield s
    _verify_every_run(s, request)
    s.close()


@pytest.fixture
def lite(sqlite_settings: Settings, registry: Registry,
         request: pytest.FixtureRequest) -> Iterator[Saga]:
    """A Saga on a fresh SQLite store; its runs are replayed afterwards, as with ``saga``."""
    s = Saga(sqlite_settings, registry=registry)
    yield s
    _verify_every_run(s, request)
    s.close()
