"""Replay: recorded decisions reproduced by the current scheduler; doctored ones caught."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from eventsourcing.persistence import StoredEvent

from saga import Saga
from saga.cli import main
from saga.config import Settings
from saga.replay import verify

GOLDEN = Path(__file__).parents[1] / "golden"
CHAIN = {"name": "chain", "steps": [
    {"id": "a", "tool": "echo", "args": {"x": 1}},
    {"id": "b", "tool": "echo", "args": {"y": "{{ a.x }}"},
     "compensate": {"tool": "echo", "args": {"undo": "{{ output.y }}"}}},
    {"id": "c", "tool": "fail", "args": {"message": "boom"}, "when": "inputs.fail"}]}


def doctor(settings: Settings, run_id: str, version: int, change: Any) -> None:
    """Rewrite one stored event's payload in place, as someone with database access could."""
    if settings.is_postgres:
        import psycopg

        from tests.conftest import PG_URL

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{settings.schema}"')
            state = conn.execute("SELECT state FROM saga_events WHERE originator_id = %s "
                                 "AND originator_version = %s", (run_id, version)).fetchone()[0]
            data = change(json.loads(bytes(state)))
            conn.execute("UPDATE saga_events SET state = %s WHERE originator_id = %s AND "
                         "originator_version = %s", (json.dumps(data).encode(), run_id, version))
        return
    with sqlite3.connect(settings.home / "saga.db") as conn:
        key = uuid.UUID(run_id).hex if conn.execute(
            "SELECT 1 FROM stored_events WHERE originator_id = ?", (run_id,)).fetchone() is None \
            else run_id
        (state,) = conn.execute("SELECT state FROM stored_events WHERE originator_id = ? AND "
                                "originator_version = ?", (key, version)).fetchone()
        data = change(json.loads(state))
        conn.execute("UPDATE stored_events SET state = ? WHERE originator_id = ? AND "
                     "originator_version = ?", (json.dumps(data).encode(), key, version))


def version_of(saga: Saga, run_id: str, event_type: str, step_id: str | None = None) -> int:
    return next(e["version"] for e in saga.history(run_id)
                if e["type"] == event_type and (step_id is None or e.get("step_id") == step_id))


def test_recorded_runs_verify(saga: Saga) -> None:
    plan = saga.load(CHAIN)
    for fail in (False, True):
        run = saga.run(plan, {"fail": fail})
        assert run.status == ("compensated" if fail else "completed")
        assert saga.verify(run.run_id) is None


@pytest.mark.doctored
def test_doctored_parameters_diverge(saga: Saga, settings: Settings) -> None:
    run = saga.run(saga.load(CHAIN), {"fail": False})
    version = version_of(saga, run.run_id, "StepStarted", "b")

    def change(state: dict[str, Any]) -> dict[str, Any]:
        state["parameters"] = {"y": 999}
        return state

    doctor(settings, run.run_id, version, change)
    divergence = saga.verify(run.run_id)
    assert divergence is not None
    assert divergence.version == version and divergence.event_type == "StepStarted"
    assert "{'y': 1}" in str(divergence)


@pytest.mark.doctored
def test_doctored_outcome_diverges_and_the_cli_says_where(settings: Settings,
                                                          saga: Saga) -> None:
    run = saga.run(saga.load(CHAIN), {"fail": False})
    version = version_of(saga, run.run_id, "RunCompleted")

    def change(state: dict[str, Any]) -> dict[str, Any]:
        state["outputs"] = {"forged": True}
        return state

    doctor(settings, run.run_id, version, change)
    saga.close()
    env = {"SAGA_HOME": str(settings.home)} if not settings.is_postgres else {
        "SAGA_DATABASE_URL": settings.database_url, "SAGA_DATABASE_SCHEMA": settings.schema}
    result = CliRunner().invoke(main, ["replay", run.run_id, "--verify"], env=env)
    assert result.exit_code == 1
    assert f"event {version} (RunCompleted) diverges" in result.output
    ok = CliRunner().invoke(main, ["replay", run.run_id, "--at", "4", "--json"], env=env)
    assert ok.exit_code == 0, ok.output
    state = json.loads(ok.output)
    assert state["version"] == 4 and state["status"] == "running"
    assert state["steps"]["a"]["status"] == "completed"
    assert state["steps"]["b"]["status"] == "running"


def test_state_at_a_time(lite: Saga) -> None:
    run = lite.run(lite.load(CHAIN), {"fail": False})
    events = lite.history(run.run_id)
    at = lite.state_at(run.run_id, events[1]["timestamp"])
    assert at.version == 2
    with pytest.raises(Exception, match="did not exist yet"):
        lite.state_at(run.run_id, "2000-01-01T00:00:00+00:00")


def load_golden(name: str, saga: Saga) -> list[Any]:
    data = json.loads((GOLDEN / name).read_text())
    run_id = uuid.UUID(data["run_id"])
    return [saga.app.mapper.to_domain_event(StoredEvent(
        originator_id=run_id, originator_version=e["version"], topic=e["topic"],
        state=json.dumps(e["state"]).encode())) for e in data["events"]]


@pytest.mark.parametrize("name", ["completed.json", "compensated.json", "retried.json"])
def test_golden_histories_replay(name: str, lite: Saga) -> None:
    events = load_golden(name, lite)
    assert verify(events) is None


def test_the_diverging_golden_history_diverges(lite: Saga) -> None:
    events = load_golden("diverging.json", lite)
    divergence = verify(events)
    assert divergence is not None
    assert (divergence.version, divergence.event_type) == (2, "StepStarted")
