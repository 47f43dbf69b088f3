"""Audit integrity on real stores: runs recorded by the engine, then doctored in SQL the way
someone with database access could, must be caught with the right version and reason."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from saga import audit
from saga.api import Saga
from saga.audit import (
    EVENT_DELETED,
    FORGED,
    INSERTED_OR_REORDERED,
    NOT_A_CHAIN,
    PAYLOAD_EDITED,
    REDACTED,
    TRANSPLANTED,
    Record,
)
from saga.audit.chain import link_of, payload_digest
from saga.chain import payload_hash, sign
from saga.config import Settings
from saga.domain import Run
from saga.store.side_tables import Database
from saga.tools import Registry

SECRET = "tok-s3cret-4242"
FLOW = {"name": "audited", "steps": [
    {"id": "a", "tool": "echo", "args": {"token": "{{ inputs.token }}"},
     "compensate": {"tool": "echo", "args": {"undo": "{{ output.token }}"}}},
    {"id": "b", "tool": "noop"},
    {"id": "c", "tool": "fail", "args": {"message": "boom", "retryable": False},
     "when": "inputs.fail"}]}


# -- helpers: a run, and SQL access to the raw rows ----------------------------------------

def record(saga: Saga, fail: bool = False) -> str:
    run = saga.run(saga.load(FLOW), {"token": SECRET, "fail": fail})
    assert run.status == ("compensated" if fail else "completed")
    return run.run_id


def version_of(settings: Settings, run_id: str, kind: str, step: str | None = None) -> int:
    return next(r.version for r in audit.read_records(settings, run_id)
                if r.type_name == kind and (step is None or r.state.get("step_id") == step))


class Rows:
    """Direct SQL on the stored events of one run (what an intruder with access can do)."""

    def __init__(self, settings: Settings, run_id: str) -> None:
        self.db = Database(settings)
        self.table = "saga_events" if settings.is_postgres else "stored_events"
        self.id = uuid.UUID(run_id) if settings.is_postgres else uuid.UUID(run_id).hex

    def __enter__(self) -> Rows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.close()

    def run(self, sql: str, *args: Any) -> None:
        self.db.execute(sql.format(t=self.table), (*args,))

    def state(self, version: int) -> dict[str, Any]:
        row = self.db.query(f"SELECT state FROM {self.table} WHERE originator_id = ? AND "
                            "originator_version = ?", (self.id, version))[0]
        return json.loads(bytes(row["state"]))

    def put(self, version: int, state: dict[str, Any]) -> None:
        self.run("UPDATE {t} SET state = ? WHERE originator_id = ? AND originator_version = ?",
                 json.dumps(state).encode(), self.id, version)

    def delete(self, version: int) -> None:
        self.run("DELETE FROM {t} WHERE originator_id = ? AND originator_version = ?",
                 self.id, version)

    def shift(self, from_version: int, by: int) -> None:
        """Renumber every event from a version on (via negatives: the key is unique)."""
        self.run("UPDATE {t} SET originator_version = -(originator_version + ?) "
                 "WHERE originator_id = ? AND originator_version >= ?", by, self.id, from_version)
        self.run("UPDATE {t} SET originator_version = -originator_version "
                 "WHERE originator_id = ? AND originator_version < 0", self.id)

    def swap(self, a: int, b: int) -> None:
        for old, new in ((a, -1), (b, a), (-1, b)):
            self.run("UPDATE {t} SET originator_version = ? WHERE originator_id = ? AND "
                     "originator_version = ?", new, self.id, old)

    def insert(self, version: int, topic: str, state: dict[str, Any]) -> None:
        self.run("INSERT INTO {t} (originator_id, originator_version, topic, state) "
                 "VALUES (?, ?, ?, ?)", self.id, version, topic, json.dumps(state).encode())

    def blob(self) -> bytes:
        rows = self.db.query(f"SELECT state FROM {self.table} WHERE originator_id = ? "
                             "ORDER BY originator_version", (self.id,))
        return b"\n".join(bytes(r["state"]) for r in rows)


def snapshot_count(settings: Settings, run_id: str) -> int:
    table = "saga_snapshots" if settings.is_postgres else "stored_snapshots"
    key: Any = uuid.UUID(run_id) if settings.is_postgres else uuid.UUID(run_id).hex
    db = Database(settings)
    try:
        return int(db.query(f"SELECT COUNT(*) AS n FROM {table} WHERE originator_id = ?",
                            (key,))[0]["n"])
    finally:
        db.close()


def only(settings: Settings, run_id: str, **kwargs: Any) -> audit.Result:
    (result,) = audit.verify_store(settings, [run_id], **kwargs)
    return result


def broken(result: audit.Result, at: int, reason: str) -> None:
    assert not result.ok, result
    assert (result.broken_at, result.reason) == (at, reason), result
    assert str(at) in result.message and result.message.startswith(reason)


@pytest.fixture
def keyed(settings: Settings, registry: Registry) -> Iterator[Saga]:
    """A Saga whose events carry a mac (SAGA_AUDIT_KEY=k)."""
    s = Saga(replace(settings, audit_key="k"), registry=registry)
    try:
        assert s.app and Run.audit_key == b"k"
        yield s
    finally:
        s.close()
        Run.audit_key = None


# -- an untouched store --------------------------------------------------------------------

def test_an_untouched_store_verifies(saga: Saga, settings: Settings) -> None:
    done, undone = record(saga), record(saga, fail=True)
    assert audit.run_ids(settings) == [done, undone]
    results = audit.verify_store(settings)
    assert [r.run_id for r in results] == [done, undone]
    for r in results:
        history = saga.history(r.run_id)
        assert r.ok and r.reason is None and r.broken_at is None, r
        assert (r.events, r.redacted, r.keyed) == (len(history), 0, False)
        assert r.head == history[-1]["hash"]  # the raw link equals the domain's link
        assert "ok" in str(r)
    records = audit.read_records(settings, undone)
    assert [r.version for r in records] == list(range(1, len(records) + 1))
    assert records[0].type_name == "RunStarted" and records[-1].type_name == "RunCompensated"
    assert all(payload_digest(r.state) == r.payload_hash for r in records)
    with pytest.raises(audit.RunNotFoundError):
        audit.verify_store(settings, [str(uuid.uuid4())])
    # A head taken earlier still checks out after the run legitimately went on.
    known = results[0].head
    saga.compensate(done)
    grown = only(settings, done, expected_heads={done: known})
    assert grown.ok and grown.head != known and "recorded since" in grown.message
    assert grown.to_json()["ok"] is True and grown.to_json()["head"] == grown.head


def test_an_empty_store_has_nothing_to_verify(settings: Settings) -> None:
    assert audit.run_ids(settings) == []
    assert audit.verify_store(settings) == []
    assert audit.apply_retention(settings, 0) == []


# -- doctored stores -----------------------------------------------------------------------

@pytest.mark.doctored
def test_an_edited_payload_is_caught(saga: Saga, settings: Settings) -> None:
    run_id = record(saga)
    v = version_of(settings, run_id, "StepCompleted", "a")
    with Rows(settings, run_id) as rows:
        state = rows.state(v)
        state["output"] = {"token": "someone-else"}
        rows.put(v, state)
    broken(only(settings, run_id), v, PAYLOAD_EDITED)
    # A payload that no longer fits its event class, or is not JSON at all, is reported too.
    misfit, garbage = record(saga), record(saga)
    with Rows(settings, misfit) as rows:
        state = rows.state(v)
        del state["output"]
        rows.put(v, {**state, "iteration": "zero", "planted": [1, 2]})
    broken(only(settings, misfit), v, PAYLOAD_EDITED)
    with Rows(settings, garbage) as rows:
        rows.run("UPDATE {t} SET state = ? WHERE originator_id = ? AND originator_version = ?",
                 b"\xff not json", rows.id, v)
    broken(only(settings, garbage), v, PAYLOAD_EDITED)
    assert [r.ok for r in audit.verify_store(settings)] == [False, False, False]


@pytest.mark.doctored
def test_a_deleted_middle_event_is_caught(saga: Saga, settings: Settings) -> None:
    gap, renumbered = record(saga), record(saga)
    v = version_of(settings, gap, "StepStarted", "b")
    with Rows(settings, gap) as rows:
        rows.delete(v)
    broken(only(settings, gap), v, EVENT_DELETED)
    with Rows(settings, renumbered) as rows:  # and the versions closed up behind it
        rows.delete(v)
        rows.shift(v + 1, -1)
    broken(only(settings, renumbered), v, EVENT_DELETED)


@pytest.mark.doctored
def test_a_deleted_last_event_is_caught_against_a_known_head(saga: Saga,
                                                             settings: Settings) -> None:
    run_id = record(saga)
    known = json.loads(audit.export_run(settings, run_id))["head"]
    last = len(audit.read_records(settings, run_id))
    assert only(settings, run_id, expected_heads={run_id: known}).ok
    with Rows(settings, run_id) as rows:
        rows.delete(last)
    # The chain alone cannot see a missing tail: what is left is consistent...
    assert only(settings, run_id).ok
    # ...but the head taken earlier is no longer in it.
    broken(only(settings, run_id, expected_heads={run_id: known}), last, EVENT_DELETED)
    broken(audit.verify_records(audit.read_records(settings, run_id), expected_head=known),
           last, EVENT_DELETED)


@pytest.mark.doctored
def test_reordered_events_are_caught(saga: Saga, settings: Settings) -> None:
    adjacent, apart = record(saga), record(saga)
    with Rows(settings, adjacent) as rows:
        rows.swap(2, 3)
    broken(only(settings, adjacent), 2, INSERTED_OR_REORDERED)
    assert "reordered" in only(settings, adjacent).message
    with Rows(settings, apart) as rows:
        rows.swap(2, 4)
    broken(only(settings, apart), 2, INSERTED_OR_REORDERED)


@pytest.mark.doctored
def test_an_inserted_event_is_caught(saga: Saga, settings: Settings) -> None:
    careful, careless = record(saga), record(saga)
    for run_id in (careful, careless):
        records = audit.read_records(settings, run_id)
        k = version_of(settings, run_id, "StepStarted", "b")
        template = next(r for r in records if r.type_name == "StepCompleted")
        forged = dict(template.state, output={"token": "planted"}, duration_ms=1)
        forged["payload_hash"] = payload_digest(forged)
        # The careful intruder links the forgery to its predecessor; the careless one not.
        before = records[k - 2]
        forged["prev_hash"] = link_of(before) if run_id == careful else "0" * 64
        with Rows(settings, run_id) as rows:
            rows.shift(k, 1)
            rows.insert(k, "saga.StepCompleted", forged)
        result = only(settings, run_id)
        broken(result, k, INSERTED_OR_REORDERED)
        assert "inserted" in result.message
        assert len(audit.read_records(settings, run_id)) == len(records) + 1


@pytest.mark.doctored
def test_a_run_without_its_first_event_is_caught(saga: Saga, settings: Settings) -> None:
    deleted, rewired = record(saga), record(saga)
    with Rows(settings, deleted) as rows:
        rows.delete(1)
    broken(only(settings, deleted), 1, EVENT_DELETED)
    with Rows(settings, rewired) as rows:
        state = rows.state(1)
        state["prev_hash"] = "not a link"
        rows.put(1, state)
    broken(only(settings, rewired), 1, NOT_A_CHAIN)


@pytest.mark.doctored
@pytest.mark.parametrize("key", [None, "k3y"])
def test_a_history_copied_under_another_run_id_is_caught(settings: Settings,
                                                         registry: Registry,
                                                         key: str | None) -> None:
    """The chain binds its run id: a verbatim copy of a run's events under a new id (which
    would otherwise pass, macs and all) is reported as transplanted, with or without the
    audit key."""
    keyed = replace(settings, audit_key=key)
    with Saga(keyed, registry=registry) as s:
        original = record(s)
    copy = str(uuid.uuid4())
    with Rows(keyed, original) as rows:
        target = uuid.UUID(copy) if keyed.is_postgres else uuid.UUID(copy).hex
        rows.run("INSERT INTO {t} (originator_id, originator_version, topic, state) "
                 "SELECT ?, originator_version, topic, state FROM {t} WHERE originator_id = ?",
                 target, rows.id)
    assert audit.verify_store(keyed, [original])[0].ok
    result = audit.verify_store(keyed, [copy])[0]
    assert (result.ok, result.reason, result.broken_at) == (False, TRANSPLANTED, 1)


def reforge(settings: Settings, run_id: str, version: int, change: dict[str, Any]) -> None:
    """Edit one event and recompute every hash after it, as someone who read saga.audit
    (but has no key) would."""
    records = audit.read_records(settings, run_id)
    with Rows(settings, run_id) as rows:
        prev = link_of(records[version - 2])
        for r in records[version - 1:]:
            state = dict(r.state, **change) if r.version == version else dict(r.state)
            state["payload_hash"] = payload_digest(state)
            state["prev_hash"] = prev
            rows.put(r.version, state)
            prev = link_of(Record(r.run_id, r.version, r.topic, state))


@pytest.mark.doctored
def test_a_reforged_chain_passes_without_the_key_and_fails_with_it(keyed: Saga,
                                                                   settings: Settings) -> None:
    run_id = record(keyed)
    clean = only(settings, run_id, key=b"k")
    assert clean.ok and clean.keyed and "macs verified" in str(clean)
    broken(only(settings, run_id, key=b"wrong"), 1, FORGED)
    v = version_of(settings, run_id, "StepCompleted", "a")
    reforge(settings, run_id, v, {"output": {"token": "rewritten"}})
    assert only(settings, run_id).ok  # consistent: nothing but the key can tell
    broken(only(settings, run_id, key=b"k"), v, FORGED)
    with Rows(settings, run_id) as rows:  # dropping the macs does not help either
        for r in audit.read_records(settings, run_id):
            rows.put(r.version, dict(r.state, mac=None))
    result = only(settings, run_id, key="k")
    broken(result, 1, FORGED)
    assert "no mac" in result.message


def test_events_written_without_a_key_fail_a_keyed_check(saga: Saga,
                                                         settings: Settings) -> None:
    run_id = record(saga)
    assert only(settings, run_id).ok
    broken(only(settings, run_id, key=b"k"), 1, FORGED)


# -- export --------------------------------------------------------------------------------

@pytest.mark.doctored
def test_exports_verify_offline_and_tampering_shows(saga: Saga, settings: Settings) -> None:
    run_id = record(saga, fail=True)
    text = audit.export_run(settings, run_id, "json")
    document = json.loads(text)
    assert set(document) == {"run_id", "events", "head"} and document["run_id"] == run_id
    events = document["events"]
    assert len(events) == len(saga.history(run_id))
    assert [set(e) for e in events] == [{"type", "version", "timestamp", "actor", "payload",
                                        "payload_hash", "prev_hash", "hash", "mac"}] * len(events)
    assert [e["hash"] for e in events] == [e["hash"] for e in saga.history(run_id)]
    assert events[0]["payload"]["inputs"] == {"token": SECRET, "fail": True}
    assert document["head"] == events[-1]["hash"] == only(settings, run_id).head
    lines = audit.export_run(settings, run_id, "jsonl").splitlines()
    assert [json.loads(line) for line in lines] == [{"run_id": run_id, **e} for e in events]
    for exported in (text, "\n".join(lines)):
        result = audit.verify_export(exported)
        assert result.ok and result.run_id == run_id and result.head == document["head"]

    v = next(e["version"] for e in events if e["type"] == "StepCompleted")

    def tampered(change: Any) -> str:
        copy = json.loads(text)
        change(copy)
        return json.dumps(copy)

    def edit(d: dict[str, Any]) -> None:
        d["events"][v - 1]["payload"]["output"] = {"token": "x"}

    def rehash(d: dict[str, Any]) -> None:
        d["events"][v - 1]["hash"] = "0" * 64

    def truncate(d: dict[str, Any]) -> None:
        d["events"].pop()

    def cover(d: dict[str, Any]) -> None:
        d["events"].pop()
        d["head"] = d["events"][-1]["hash"]

    last = len(events)
    broken(audit.verify_export(tampered(edit)), v, PAYLOAD_EDITED)
    broken(audit.verify_export(tampered(rehash)), v, FORGED)
    broken(audit.verify_export(tampered(truncate)), last, EVENT_DELETED)
    assert audit.verify_export(tampered(cover)).ok  # a covered-up tail needs a known head
    broken(audit.verify_export(tampered(cover), expected_head=document["head"]), last,
           EVENT_DELETED)
    swapped = [*lines[:1], lines[2], lines[1], *lines[3:]]
    broken(audit.verify_export("\n".join(swapped)), 2, INSERTED_OR_REORDERED)
    broken(audit.verify_export("\n".join([lines[1], lines[0], *lines[2:]])), 1,
           INSERTED_OR_REORDERED)
    broken(audit.verify_export("\n".join(lines[1:])), 1, EVENT_DELETED)
    failed = audit.verify_export(tampered(edit))
    assert failed.to_json()["reason"] == PAYLOAD_EDITED and "BROKEN at event" in str(failed)
    for garbage in ("", "not json", '{"run_id": "x"}', '{"events": [{"type": 1}]}'):
        with pytest.raises(ValueError):
            audit.verify_export(garbage)
    with pytest.raises(ValueError):
        audit.export_run(settings, run_id, "xml")
    with pytest.raises(audit.RunNotFoundError):
        audit.export_run(settings, str(uuid.uuid4()))
    # The store itself is untouched by all this.
    assert only(settings, run_id).ok


def test_a_keyed_export_verifies_offline_with_the_key(keyed: Saga, settings: Settings) -> None:
    run_id = record(keyed)
    text = audit.export_run(settings, run_id, "jsonl")
    first = json.loads(text.splitlines()[0])
    assert first["mac"] == sign(b"k", first["hash"])
    assert audit.verify_export(text, key=b"k").ok
    broken(audit.verify_export(text, key=b"other"), 1, FORGED)


def test_wrapped_values_hash_as_the_objects_they_were() -> None:
    """The library stores datetimes, UUIDs and Decimals wrapped as {"_type_", "_data_"};
    the payload hash was taken of the objects, so the raw check unwraps them first."""
    at, uid, amount = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC), uuid.UUID(int=7), Decimal("1.10")
    original = {"output": {"at": at, "id": uid, "amount": amount}, "step_id": "s"}
    state = {"timestamp": {"_type_": "datetime_iso", "_data_": at.isoformat()},
             "actor": None, "prev_hash": "p", "payload_hash": payload_hash(original), "mac": None,
             "step_id": "s",
             "output": {"at": {"_type_": "datetime_iso", "_data_": at.isoformat()},
                        "id": {"_type_": "uuid_hex", "_data_": uid.hex},
                        "amount": {"_type_": "decimal_str", "_data_": "1.10"}}}
    assert payload_digest(state) == state["payload_hash"]
    state["output"]["amount"]["_data_"] = "1.11"
    assert payload_digest(state) != state["payload_hash"]


# -- retention -----------------------------------------------------------------------------

@pytest.mark.doctored
def test_retention_removes_user_data_and_keeps_the_chain(settings: Settings,
                                                         registry: Registry) -> None:
    s = Saga(replace(settings, snapshot_interval=3), registry=registry)
    try:
        done, undone = record(s), record(s, fail=True)
        waiting = s.submit(s.load(FLOW), {"token": SECRET, "fail": False}).run_id
        heads = {r.run_id: r.head for r in audit.verify_store(settings)}
        assert snapshot_count(settings, done) > 0 and snapshot_count(settings, undone) > 0
        blobs = {}
        for run_id in (done, undone, waiting):
            with Rows(settings, run_id) as rows:
                blobs[run_id] = rows.blob()
            assert SECRET.encode() in blobs[run_id]

        # Not old enough: nothing is due.
        assert audit.apply_retention(settings, 30) == []
        # A dry run names the finished runs and changes nothing.
        later = datetime.now(UTC) + timedelta(days=400)
        assert audit.apply_retention(settings, 365, dry_run=True, now=later) == [done, undone]
        for run_id, blob in blobs.items():
            with Rows(settings, run_id) as rows:
                assert rows.blob() == blob
        assert snapshot_count(settings, done) > 0

        assert audit.apply_retention(settings, 365, now=later) == [done, undone]
        for run_id in (done, undone):
            with Rows(settings, run_id) as rows:
                assert SECRET.encode() not in rows.blob()
            assert snapshot_count(settings, run_id) == 0
            records = audit.read_records(settings, run_id)
            first = records[0].state
            assert first["inputs"] == REDACTED and first["definition"]["name"] == "audited"
            for r in records:
                for name in audit.REDACTABLE.get(r.type_name, ()):
                    assert r.state[name] == REDACTED, (r.type_name, name)
            result = only(settings, run_id, expected_heads={run_id: heads[run_id]})
            assert result.ok and records[-1].type_name == "RetentionApplied", result
            assert result.redacted == sum(r.type_name in audit.REDACTABLE for r in records)
            assert audit.verify_export(audit.export_run(settings, run_id, "jsonl")).ok
        # The runs still load.
        status = s.status(undone)
        assert status["status"] == "compensated" and status["inputs"] == REDACTED
        assert status["steps"]["a"]["output"] == REDACTED and status["outputs"] == REDACTED
        assert s.status(done)["status"] == "completed"
        # The unfinished run is untouched, and a second pass has nothing left to do.
        with Rows(settings, waiting) as rows:
            assert rows.blob() == blobs[waiting]
        assert audit.apply_retention(settings, 0) == []
        assert audit.apply_retention(settings, 0, dry_run=True) == []
        # An edit beside a redaction is caught: retention recorded each payload's hash.
        v = version_of(settings, undone, "RunCompensated")
        with Rows(settings, undone) as rows:
            state = rows.state(v)
            state["error"] = {"message": "all fine, nothing failed"}
            rows.put(v, state)
        broken(only(settings, undone), v, PAYLOAD_EDITED)
        # A redaction marker cannot hide an edit in a run that never finished.
        with Rows(settings, waiting) as rows:
            state = rows.state(1)
            state["inputs"] = REDACTED
            rows.put(1, state)
        broken(only(settings, waiting), 1, PAYLOAD_EDITED)
    finally:
        s.close()


@pytest.mark.doctored
def test_retention_keeps_the_evidence_of_a_tampered_run(saga: Saga, settings: Settings) -> None:
    tampered, clean = record(saga), record(saga)
    v = version_of(settings, tampered, "StepCompleted", "a")
    with Rows(settings, tampered) as rows:
        state = rows.state(v)
        state["duration_ms"] = 99999
        rows.put(v, state)
        before = rows.blob()
    assert audit.apply_retention(settings, 0) == [clean]
    with Rows(settings, tampered) as rows:
        assert rows.blob() == before
    broken(only(settings, tampered), v, PAYLOAD_EDITED)
    with pytest.raises(ValueError):
        audit.apply_retention(settings, -1)


@pytest.mark.doctored
def test_retention_under_a_key_keeps_the_macs_valid(keyed: Saga, settings: Settings) -> None:
    run_id = record(keyed, fail=True)
    assert audit.apply_retention(settings, 0, key=b"k") == [run_id]
    result = only(settings, run_id, key=b"k")
    assert result.ok and result.keyed and result.redacted > 0, result


@pytest.mark.doctored
@pytest.mark.parametrize("key", [None, "k3y"])
def test_a_laundered_redaction_is_caught(settings: Settings, registry: Registry,
                                         key: str | None) -> None:
    """Marking a finished run's events redacted by hand, to hide other edits (a changed
    definition, a rewritten error), fails with and without the key: no retention event
    records those payloads."""
    keyed = replace(settings, audit_key=key)
    with Saga(keyed, registry=registry) as s:
        run_id = record(s, fail=True)
    with Rows(keyed, run_id) as rows:
        state = rows.state(1)
        state["inputs"] = REDACTED
        state["definition"]["name"] = "harmless"
        rows.put(1, state)
    result = only(keyed, run_id)
    broken(result, 1, PAYLOAD_EDITED)
    assert "no retention event records it" in result.message


def snapshot_rows(settings: Settings, run_id: str) -> tuple[Database, str, Any]:
    table = "saga_snapshots" if settings.is_postgres else "stored_snapshots"
    key: Any = uuid.UUID(run_id) if settings.is_postgres else uuid.UUID(run_id).hex
    return Database(settings), table, key


@pytest.mark.doctored
@pytest.mark.parametrize("key", [None, "k3y"])
@pytest.mark.parametrize("reseal", [False, True])
def test_a_doctored_snapshot_is_never_trusted(settings: Settings, registry: Registry,
                                              key: str | None, reseal: bool) -> None:
    """An edited snapshot (the compensation's recorded parameters changed) is refused
    when the run loads (it is rebuilt from its events) and reported by audit verify, with
    and without the key, even when the editor recomputed an unkeyed seal."""
    from saga.chain import seal

    snapshotting = replace(settings, audit_key=key, snapshot_interval=2)
    with Saga(snapshotting, registry=registry) as s:
        run_id = record(s)
        honest = s.get(run_id).steps["a"]["parameters"]
    db, table, rid = snapshot_rows(snapshotting, run_id)
    try:
        row = db.query(f"SELECT originator_version, state FROM {table} WHERE originator_id = ? "
                       "ORDER BY originator_version DESC", (rid,))[0]
        state = json.loads(bytes(row["state"]))
        state["state"]["steps"]["a"]["parameters"] = {"token": "attacker"}
        if reseal:
            state["state"]["seal"] = seal(state["state"], None)
        db.execute(f"UPDATE {table} SET state = ? WHERE originator_id = ? AND "
                   "originator_version = ?",
                   (json.dumps(state).encode(), rid, row["originator_version"]))
    finally:
        db.close()
    with Saga(snapshotting, registry=registry) as s:
        loaded = s.get(run_id)
        if key or not reseal:
            assert loaded.steps["a"]["parameters"] == honest  # refused, rebuilt
    result = only(snapshotting, run_id, key=key)
    assert (result.ok, result.reason) == (False, audit.SNAPSHOT_DOCTORED), result
