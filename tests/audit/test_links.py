"""A new event joins its run's chain with the link a replay of the log computes, and the
engine hashes that link once (the chain is on every step's path)."""

from __future__ import annotations

from typing import Any

import pytest

from saga import chain
from saga.domain import Run
from saga.domain import run as run_module


def a_run() -> Run:
    return Run.begin({"name": "linked", "steps": []}, "d" * 64, {"x": 1},
                     {"actor": "tester"}, {})


def step_through(run: Run) -> None:
    run.start_step("a", 0, 1, {"p": "é"}, worker="w1")
    run.complete_step("a", 0, 1, {"out": [1, 2]}, 3)
    run.pause("alice", "look")
    run.unpause("bob")
    run.start_step("b", 0, 1, {})
    run.fail_step("b", 0, 1, "Boom", "it broke", False)


@pytest.mark.parametrize("key", [None, b"audit-key"])
def test_a_new_event_joins_the_chain_a_replay_builds(monkeypatch: pytest.MonkeyPatch,
                                                      key: bytes | None) -> None:
    monkeypatch.setattr(Run, "audit_key", key)
    run = a_run()
    step_through(run)
    events = list(run.pending_events)
    prev = chain.genesis(str(run.id))
    for event in events:
        assert event.prev_hash == prev
        assert event.mac == (chain.sign(key, event.link()) if key else None)
        prev = event.link()
    assert run.head_hash == prev
    replayed: Any = None
    for event in events:
        replayed = event.mutate(replayed)
    assert replayed.head_hash == run.head_hash
    assert replayed.version == run.version == len(events)
    assert replayed.steps == run.steps and replayed.status == run.status


def test_a_new_event_is_hashed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(event_type: str, *args: Any) -> str:
        calls.append(event_type)
        return original(event_type, *args)

    original = chain.event_hash
    monkeypatch.setattr(chain, "event_hash", counted)
    monkeypatch.setattr(run_module, "event_hash", counted)
    run = a_run()
    calls.clear()  # begin() builds its first link apart
    step_through(run)
    assert calls == [type(e).__name__ for e in run.pending_events[1:]]


def test_a_new_event_is_the_event_its_class_would_make() -> None:
    """Events are made without their dataclass ``__init__`` (see ``chain.new_event``): the
    same event, and still refused without a field or with one too many."""
    run = a_run()
    step_through(run)
    for event in run.pending_events[1:]:
        made = type(event)(**vars(event))
        assert made == event and vars(made) == vars(event)
    started = run.pending_events[1]
    links = {k: getattr(started, k) for k in chain.CHAIN_FIELDS}
    payload = chain.payload_of(vars(started))
    made = chain.new_event(type(started), started.originator_id, started.originator_version,
                           started.timestamp, payload, links)
    assert made == started
    with pytest.raises(TypeError, match="worker"):
        chain.new_event(type(started), started.originator_id, started.originator_version,
                        started.timestamp, {k: v for k, v in payload.items() if k != "worker"},
                        links)
    with pytest.raises(TypeError, match="StepStarted"):
        chain.new_event(type(started), started.originator_id, started.originator_version,
                        started.timestamp, {**payload, "extra": 1}, links)


def test_the_run_id_text_is_derived_not_stored() -> None:
    run = a_run()
    assert run.run_id == str(run.id)
    snapshot = Run.Snapshot.take(run)
    assert "_run_id" not in snapshot.state
    assert snapshot.mutate(None).run_id == str(run.id)


def test_only_an_event_that_may_end_a_wait_asks_whether_the_run_still_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []
    original = Run.is_waiting

    def counted(self: Run) -> bool:
        asked.append(self.version)
        return bool(original.fget(self))  # type: ignore[misc]

    monkeypatch.setattr(Run, "is_waiting", property(counted))
    run = a_run()  # RunStarted: asked
    run.start_step("a", 0, 1, {})  # a step starting ends no wait: not asked
    run.request_approval("b", "ok?")
    assert run.status == "waiting"
    run.decide_approval("b", True, "alice", "fine")  # may end it: asked
    assert asked == [1, 4] and run.status == "running"
