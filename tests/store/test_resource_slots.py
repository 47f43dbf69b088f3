"""Resource slots in the store (saga.toml ``[resources.NAME]``): concurrency, arrival
order, all-or-none, lapsed slots and waiters, and the token bucket, across separate
connections (as separate workers hold them), on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from saga import Saga
from saga.config import ResourceLimit, Settings, parse_resources
from saga.errors import ConfigError
from saga.store import Database
from saga.store.resources import ResourceSlots


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


LIMITS = {"db": ResourceLimit(concurrency=2), "one": ResourceLimit(concurrency=1),
          "api": ResourceLimit(rate=2, per=1.0, burst=2)}


@pytest.fixture
def slots(settings: Settings) -> Iterator[tuple[ResourceSlots, ResourceSlots, Clock]]:
    """Two workers' views of one store's slots, on one clock the test moves."""
    clock = Clock()
    with Saga(settings) as s:
        s.leases  # noqa: B018 - the store and its schema exist
    dbs = [Database(settings) for _ in range(2)]
    try:
        yield ResourceSlots(dbs[0], LIMITS, clock), ResourceSlots(dbs[1], LIMITS, clock), clock
    finally:
        for db in dbs:
            db.close()


def ask(s: ResourceSlots, holder: str, *names: str, seconds: float = 10.0) -> bool:
    return s.acquire(list(names), holder, holder.split(":")[0], "s", "w", seconds,
                     30.0).granted


def test_concurrency_holds_across_workers_and_a_freed_slot_goes_to_the_first_waiter(
        slots: tuple[ResourceSlots, ResourceSlots, Clock]) -> None:
    a, b, _ = slots
    assert ask(a, "r1:s:1", "db") and ask(b, "r2:s:1", "db")
    assert not ask(a, "r3:s:1", "db")  # full: r3 waits, first in line
    assert not ask(b, "r4:s:1", "db")
    assert [w["holder"] for w in a.waiters("db")] == ["r3:s:1", "r4:s:1"]
    assert {n: (u.in_use, u.waiting) for n, u in b.usage().items()}["db"] == (2, 2)
    b.release(["r1:s:1"])
    assert b.servable() == {"r3"}
    assert not ask(b, "r4:s:1", "db")  # a slot is free, but r3 came first
    assert ask(a, "r3:s:1", "db")
    assert ask(a, "r3:s:1", "db")  # asking again while held renews it
    assert [h["holder"] for h in b.holders("db")] == ["r2:s:1", "r3:s:1"]
    assert b.waiters("db")[0]["holder"] == "r4:s:1"


def test_a_newcomer_never_passes_a_waiter_and_unlimited_names_cost_nothing(
        slots: tuple[ResourceSlots, ResourceSlots, Clock]) -> None:
    a, b, _ = slots
    assert ask(a, "r1:s:1", "one")
    assert not ask(b, "r2:s:1", "one")
    a.release(["r1:s:1"])
    assert not ask(a, "r9:s:1", "one")  # the slot is r2's turn
    assert ask(b, "r2:s:1", "one")
    assert ask(a, "r5:s:1", "not-limited", "other")  # no row, no lock
    assert "not-limited" not in a.usage()


def test_all_or_none_a_call_never_holds_one_slot_while_waiting_for_another(
        slots: tuple[ResourceSlots, ResourceSlots, Clock]) -> None:
    a, b, _ = slots
    assert ask(a, "r1:s:1", "one")
    assert not ask(b, "r2:s:1", "db", "one")
    assert [h["holder"] for h in a.holders("db")] == []  # db was not taken
    assert [w["holder"] for w in a.waiters("one")] == ["r2:s:1"]
    assert a.waiters("db") == []  # it waits only where it was refused
    a.release(["r1:s:1"])
    assert ask(b, "r2:s:1", "db", "one")
    assert {h["holder"] for h in a.holders("db")} == {"r2:s:1"}


def test_a_dead_holders_slot_and_a_silent_waiters_place_lapse(
        slots: tuple[ResourceSlots, ResourceSlots, Clock]) -> None:
    a, b, clock = slots
    assert ask(a, "dead:s:1", "one", seconds=5)  # its worker dies: no renewal, no release
    assert not ask(b, "r2:s:1", "one")
    clock.now += 4
    assert a.renew(["dead:s:1"], 5) == 1  # renewed while its call runs
    clock.now += 4.5
    assert not ask(b, "r2:s:1", "one")  # still held: renewed 4.5 s ago
    clock.now += 1
    assert ask(b, "r2:s:1", "one")  # lapsed: the slot came back
    assert a.renew(["dead:s:1"], 5) == 0
    assert not ask(a, "gone:s:1", "one")  # waits 30 s, then stops asking
    b.release(["r2:s:1"])
    clock.now += 31
    assert ask(b, "r3:s:1", "one")  # the silent waiter lost its place


def test_the_token_bucket_limits_starts_per_second(
        slots: tuple[ResourceSlots, ResourceSlots, Clock]) -> None:
    a, b, clock = slots
    assert ask(a, "r1:s:1", "api") and ask(b, "r2:s:1", "api")  # the burst
    a.release(["r1:s:1", "r2:s:1"])  # ended: the rate counts starts, not calls in flight
    assert not ask(a, "r3:s:1", "api")
    clock.now += 0.5  # one token back (2/s)
    assert not ask(b, "r4:s:1", "api")  # r3 came first
    assert ask(a, "r3:s:1", "api")
    assert not ask(b, "r4:s:1", "api")
    clock.now += 10  # full again, no more than the burst
    assert ask(b, "r4:s:1", "api") and ask(b, "r5:s:1", "api")
    assert not ask(b, "r6:s:1", "api")


def test_resources_in_saga_toml() -> None:
    assert parse_resources({"db": {"concurrency": 2}, "api": {"rate": "100/min"},
                            "http:example.com": {"rate": "5/s", "burst": 1,
                                                 "concurrency": 3}}) == {
        "db": ResourceLimit(2), "api": ResourceLimit(None, 100, 60.0, 100),
        "http:example.com": ResourceLimit(3, 5, 1.0, 1)}
    for bad, message in (({"db": {}}, "takes concurrency"),
                         ({"db": {"concurrency": 0}}, "positive integer"),
                         ({"db": {"rate": "fast"}}, "must look like"),
                         ({"db": {"limit": 2}}, "takes concurrency"),
                         ([1], "must hold tables")):
        with pytest.raises(ConfigError, match=message):
            parse_resources(bad)
