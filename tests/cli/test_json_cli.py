"""Every command that prints data takes ``--json`` (``graph``, ``export`` and ``report``
take ``--format`` instead), and uses ``definition`` for the composition's name."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

from saga.cli import main
from saga.cli.app import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
CONFIRMED = """\
name: json-confirmed
steps:
  - id: book
    tool: echo
    args: {x: booked}
  - id: pay
    tool: echo
    args: {x: paid}
    confirm: "Pay now?"
"""
#: Commands that print data in another way, on purpose.
FORMATTED = {"graph", "export", "report"}
#: Commands that print no data of their own (a server, a stream with its own --json).
NO_DATA = {"serve", "mcp"}


def run(home: Path, *args: str, code: int = 0) -> Any:
    result = CliRunner().invoke(main, list(args), env={"SAGA_HOME": str(home),
                                                      "SAGA_ACTOR": "tester"})
    assert result.exit_code == code, (result.output, result.exception)
    return json.loads(result.stdout)


def leaves(command: click.Command, path: str = "") -> list[tuple[str, click.Command]]:
    if isinstance(command, click.Group):
        return [leaf for name in command.list_commands(click.Context(command))
                for leaf in leaves(command.get_command(click.Context(command), name),  # type: ignore[arg-type]
                                   f"{path} {name}".strip())]
    return [(path, command)]


def test_every_data_command_takes_json_or_format() -> None:
    commands = [leaf for name in COMMANDS
                for leaf in leaves(main.get_command(click.Context(main), name), name)]  # type: ignore[arg-type]
    assert len(commands) > 30
    lacking = []
    for path, command in commands:
        options = {o for p in command.params for o in getattr(p, "opts", [])}
        top = path.split()[0]
        if top in FORMATTED:
            assert "--format" in options, path
        elif top not in NO_DATA and "--json" not in options:
            lacking.append(path)
    assert lacking == []


def test_projection_db_worker_and_decisions_print_json(tmp_path: Path) -> None:
    home = tmp_path / ".saga"
    assert run(home, "db", "init", "--json")["initialised"] is True
    quick = str(ROOT / "saga" / "templates" / "quickstart.yaml")
    submitted = run(home, "submit", quick, "--json")
    assert submitted["definition"] == submitted["name"] == "quickstart"
    worked = run(home, "worker", "--until-idle", "--json")
    assert worked["drives"] >= 1 and worked["worker"]
    assert run(home, "status", submitted["run_id"], "--json")["status"] == "completed"
    rebuilt = run(home, "projection", "rebuild", "--json")
    assert rebuilt["rebuilt_from"] > 0 and rebuilt["position"] == rebuilt["rebuilt_from"]
    assert run(home, "projection", "run", "--json") == {
        "applied": 0, "position": rebuilt["position"], "followed": False}

    (tmp_path / "confirmed.yaml").write_text(CONFIRMED)
    waiting = run(home, "run", str(tmp_path / "confirmed.yaml"), "--json")
    assert waiting["status"] == "waiting"
    decided = run(home, "approve", waiting["run_id"], "pay", "--json")
    assert decided == {"run_id": waiting["run_id"], "step_id": "pay", "decision": "approved",
                       "status": decided["status"]}
    other = run(home, "run", str(tmp_path / "confirmed.yaml"), "--json")
    assert run(home, "reject", other["run_id"], "pay", "--json")["decision"] == "rejected"


def test_schedule_changes_print_json(tmp_path: Path) -> None:
    home = tmp_path / ".saga"
    added = run(home, "schedule", "add", "ping", "quickstart", "--every", "1h", "--json")
    assert added["definition"] == "quickstart"
    assert run(home, "schedule", "pause", "ping", "--json")["paused"] is True
    assert run(home, "schedule", "resume", "ping", "--json")["paused"] is False
    assert run(home, "schedule", "remove", "ping", "--json") == {"name": "ping",
                                                                 "removed": True}


def test_definition_is_the_composition_field_everywhere(tmp_path: Path) -> None:
    home = tmp_path / ".saga"
    quick = str(ROOT / "saga" / "templates" / "quickstart.yaml")
    assert run(home, "validate", quick, "--json")["definition"] == "quickstart"
    assert run(home, "run", quick, "--validate-only", "--json")["definition"] == "quickstart"
    assert run(home, "run", quick, "--dry-run", "--json")["definition"] == "quickstart"
    ran = run(home, "run", quick, "--json")
    assert ran["definition"] == ran["name"] == "quickstart"
    status = run(home, "status", ran["run_id"], "--json")
    assert status["definition"] == status["name"] == "quickstart"
    (listed,) = run(home, "list", "--json")
    assert listed["definition"] == listed["name"] == "quickstart"
    templates = {t["name"]: t for t in run(home, "templates", "list", "--json")}
    assert templates["quickstart"]["definition"] == templates["quickstart"]["definition_name"]
    shown = run(home, "templates", "show", "quickstart", "--json")
    assert shown["definition"] == shown["definition_name"] == "quickstart"


FLAKY = """\
name: json-flaky
steps:
  - id: flaky
    tool: fail
    args: {message: not yet, times: 1}
    retry: {max_attempts: 2, delay: 1.5, backoff: fixed}
"""


def test_a_retried_step_shows_its_last_attempt_duration_not_the_backoff(
        tmp_path: Path) -> None:
    home = tmp_path / ".saga"
    (tmp_path / "flaky.yaml").write_text(FLAKY)
    ran = run(home, "run", str(tmp_path / "flaky.yaml"), "--json")
    assert ran["status"] == "completed"
    step = run(home, "status", ran["run_id"], "--json")["steps"]["flaky"]
    assert step["attempt"] == 2
    assert 0 <= step["duration_ms"] < 1000  # the attempt, not the 1.5 s it waited before it
    history = run(home, "history", ran["run_id"], "--json")
    first = next(e for e in history if e["type"] == "StepStarted")
    done = next(e for e in history if e["type"] == "StepCompleted")
    waited = (datetime.fromisoformat(done["timestamp"])
              - datetime.fromisoformat(first["timestamp"])).total_seconds()
    assert waited >= 1.5  # what the old fold reported
    recorded = done["payload"]["duration_ms"]  # 0 for a call under a millisecond: then
    assert step["duration_ms"] == recorded if recorded else step["duration_ms"] < 1000  # window
    run(home, "projection", "run", "--json")
    with sqlite3.connect(home / "saga.db") as conn:  # the read model agrees
        (projected,) = conn.execute(
            "SELECT duration_ms FROM saga_steps WHERE step_id = 'flaky'").fetchone()
    assert projected == step["duration_ms"]
