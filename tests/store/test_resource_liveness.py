"""A dead worker's resource slot is free at once, even once its registration is gone: the
slot keeps the worker's liveness lock key from when it was taken (a clean stop of another
worker forgets dead workers that hold no run's lease), on SQLite and PostgreSQL."""

from __future__ import annotations

from saga import Saga
from saga.config import ResourceLimit, Settings
from saga.store import Database
from saga.store.leases import Leases
from saga.store.liveness import Liveness
from saga.store.resources import ResourceSlots

LIMITS = {"one": ResourceLimit(concurrency=1)}


def test_a_dead_workers_slot_is_free_after_its_registration_is_forgotten(
        settings: Settings) -> None:
    with Saga(settings) as s:
        s.leases  # noqa: B018 - the store and its schema exist
    db, other_db = Database(settings), Database(settings)
    try:
        leases = Leases(db)
        doomed = Liveness(db, "doomed", leases.bindings)
        doomed.start(5)
        mine, other = ResourceSlots(db, LIMITS), ResourceSlots(other_db, LIMITS)
        assert mine.acquire(["one"], "r1:s:1", "r1", "s", "doomed", 60, 60).granted
        assert not other.acquire(["one"], "r2:s:1", "r2", "s", "heir", 60, 60).granted
        assert [h["worker"] for h in other.holders("one")] == ["doomed"]  # alive: held
        doomed.stop()  # its lock goes, as with its process; its row stays (it was alive)
        # ... until another worker's clean stop forgets it (it held no run's lease)
        other_db.execute("DELETE FROM saga_workers WHERE worker = ?", ("doomed",))
        assert other.holders("one") == []
        assert other.usage()["one"].in_use == 0
        assert other.acquire(["one"], "r2:s:1", "r2", "s", "heir", 60, 60).granted
    finally:
        db.close()
        other_db.close()
