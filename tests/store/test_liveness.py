"""Workers' liveness (saga.store.liveness): a lease whose holder's lock is gone is taken
at once; one whose holder never registered waits for its expiry, as before."""

from __future__ import annotations

import time
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.errors import ConfigError
from saga.store.liveness import SWEEP_EVERY, Liveness
from saga.tools import Registry


def test_a_dead_workers_unexpired_lease_is_taken_at_once(settings: Settings,
                                                        registry: Registry) -> None:
    with Saga(settings, registry=registry) as saga:
        leases = saga.leases
        a = Liveness(leases.db, "a", leases.bindings)
        a.start(1.0)
        assert leases.claim("r1", "a", 30)
        assert leases.claim("r2", "cli", 30)  # a holder that never registered
        assert not leases.claim("r1", "b", 30)  # alive: its lease holds
        assert set(leases.held_by_others(["r1", "r2"], "b")) == {"r1", "r2"}
        b = Liveness(leases.db, "b", leases.bindings)
        b.start(1.0)
        assert b.sweep() == []
        expiry = leases.holder("r1")[1]  # type: ignore[index]
        a.stop()  # as its process's death does: the lock goes, the row stays
        # (the server lets the lock go as the backend exits, a moment after the close)
        gone = time.monotonic() + 5
        while set(leases.held_by_others(["r1", "r2"], "b")) != {"r2"}:
            assert time.monotonic() < gone, "the dead worker's lock is still held"
            time.sleep(0.01)
        b._swept = float("-inf")  # (sweeps are at most every SWEEP_EVERY)
        assert b.sweep() == [leases.lease("r1", "b", 30).run_id]
        assert leases.claim_first(["r1", "r2"], 2, "b", 30)[0] == ["r1"]
        assert leases.previous("r1", "b") == ("a", expiry)  # RunTakenOver.seen says so
        assert not leases.claim("r2", "b", 30)  # waits for its expiry, as before
        b.stop()


def test_a_worker_id_in_use_is_refused_and_taken_back_once_free(
        settings: Settings, registry: Registry) -> None:
    with Saga(settings, registry=registry) as saga:
        leases = saga.leases
        first = Liveness(leases.db, "w", leases.bindings)
        first.start(1.0)
        assert leases.claim("r1", "w", 30)
        with pytest.raises(ConfigError, match="in use by a live process"):
            Liveness(leases.db, "w").start(0.2)
        first.stop()
        again = Liveness(leases.db, "w", leases.bindings)
        again.start(5.0)  # (the server lets the lock go a moment after the close)
        # Its own runs back at once, taken from the process that had its id.
        expiry = leases.holder("r1")[1]  # type: ignore[index]
        assert leases.claim("r1", "w", 30)
        assert leases.previous("r1", "w") == ("w", expiry)
        again.stop()


def _holding_then_cut(leases: Any) -> tuple[Liveness, Any]:
    """Worker ``w`` live, holding run r1's lease, then its lock's connection cut (an
    operator's pg_terminate_backend, or a server restart), its next sweep due."""
    w = Liveness(leases.db, "w", leases.bindings)
    w.start(1.0)
    assert leases.claim("r1", "w", 30)
    lease = leases.lease("r1", "w", 30)
    lease.expires = leases.clock() + 30
    assert lease.fresh(1.0) and lease.renew()
    leases.db.query("SELECT pg_terminate_backend(%s) AS done", (w._conn.info.backend_pid,))
    w._swept = float("-inf")
    return w, lease


def test_a_worker_that_loses_its_lock_holds_no_lease_until_it_has_it_again(
        pg_settings: Settings, registry: Registry) -> None:
    """Its own connection cut (an operator's pg_terminate_backend): its leases stop
    counting at once (a drive renews and finds it lost), others may take its runs, and
    its next sweep takes the lock again."""
    with Saga(pg_settings, registry=registry) as saga:
        leases = saga.leases
        w, lease = _holding_then_cut(leases)
        assert w.sweep() == []  # finds it lost
        assert not w.alive
        assert not lease.fresh(1.0) and not lease.renew()
        gone = time.monotonic() + 5  # its process looks gone (once the backend exits)
        while not leases.claim("r1", "other", 30):
            assert time.monotonic() < gone, "the lost lock is still held"
            time.sleep(0.01)
        w._swept = float("-inf")
        w.sweep()
        assert w.alive
        assert not leases.claim("r1", "w", 30)  # the other's now
        w.stop()


def test_a_renewal_takes_a_lost_lock_back_and_keeps_its_lease_if_nobody_took_it(
        pg_settings: Settings, registry: Registry) -> None:
    """A server restart drops every lock, a live worker's too: a drive's renewal, once the
    loss is SWEEP_EVERY old, takes the lock again and keeps its lease (nobody took the run
    meanwhile), where it gave the run up before (and a server restart quarantined runs)."""
    with Saga(pg_settings, registry=registry) as saga:
        leases = saga.leases
        w, lease = _holding_then_cut(leases)
        assert w.sweep() == [] and w.lost  # found lost: the worker claims nothing now
        assert not lease.renew()  # not at once: others had no moment to see it gone
        back = time.monotonic() + 5  # (once the old backend has let the lock go)
        while not lease.renew():
            assert time.monotonic() < back, "the renewal never took the lock back"
            time.sleep(SWEEP_EVERY)
        assert w.alive and not w.lost and lease.fresh(1.0)
        assert leases.holder("r1")[0] == "w"  # type: ignore[index]
        assert not leases.claim("r1", "other", 30)  # it counts again
        w.stop()
