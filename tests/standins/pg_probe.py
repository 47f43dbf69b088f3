"""Run by tests/test_setup.py with SAGA_TEST_DATABASE_URL at a closed port: the tests that
need PostgreSQL skip (or, with CI set, fail) and the others run. Not collected on its own
(its name does not start with ``test_``)."""

from __future__ import annotations

import pytest

from saga.config import Settings


def test_either_store(settings: Settings) -> None:
    assert settings.is_postgres or settings.home is not None


def test_postgres_only(pg_settings: Settings) -> None:
    assert pg_settings.is_postgres


@pytest.mark.postgres
def test_marked() -> None:
    pass


def test_no_store() -> None:
    pass
