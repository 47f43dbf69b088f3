"""Shared fixtures: a store per test, parametrised over SQLite and a real PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from saga.api import Saga
from saga.config import Settings
from saga.tools import Registry, load_registry

PG_URL = os.environ.get("SAGA_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")


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
