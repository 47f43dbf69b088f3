"""Leases on both stores: claim, renew, release, and what commits without waiting."""

from __future__ import annotations

from saga.api import Saga
from saga.config import Settings
from saga.store.leases import Leases
from saga.tools import Registry


def test_claim_renew_release_on_both_stores(saga: Saga) -> None:
    saga.leases  # noqa: B018 - creates the store and its side tables
    assert saga._db is not None
    now = [1000.0]
    leases = Leases(saga._db, clock=lambda: now[0])
    assert leases.claim("r1", "a", 10)
    assert not leases.claim("r1", "b", 10)  # held by a
    assert leases.renew("r1", "a", 30)
    assert leases.holder("r1") == ("a", 1030.0)
    assert not leases.renew("r1", "b", 30)  # not b's to renew
    leases.release("r1", "b")  # not b's to give up
    assert leases.holder("r1") == ("a", 1030.0)
    leases.release("r1", "a")
    assert leases.holder("r1") is None
    assert not leases.renew("r1", "a", 30)  # nothing left to renew
    assert leases.claim("r1", "b", 10)
    now[0] = 2000.0  # b's lease expired: a may take the run over
    assert leases.claim("r1", "a", 10)


def test_renewals_and_releases_commit_without_waiting_for_the_flush(
        pg_settings: Settings, registry: Registry) -> None:
    """One autocommit statement each, whose transaction sets synchronous_commit off for
    itself (seen by running them inside a transaction of ours); the session keeps it on."""
    s = Saga(pg_settings, registry=registry)
    try:
        leases = s.leases
        assert s._db is not None
        db = s._db
        assert leases.claim("r1", "a", 10)
        conn = db.conn
        for change in (lambda: leases.renew("r1", "a", 30),
                       lambda: leases.release("r1", "a")):
            with conn.transaction():
                change()
                row = conn.execute("SHOW synchronous_commit").fetchone()
                assert row is not None and row[0] == "off"
            row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None and row[0] == "on"
        assert leases.holder("r1") is None
        with conn.transaction():  # a claim waits for its flush
            assert leases.claim("r1", "a", 10)
            row = conn.execute("SHOW synchronous_commit").fetchone()
            assert row is not None and row[0] == "on"
    finally:
        s.close()
