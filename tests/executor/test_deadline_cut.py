"""A run's deadline that cuts a call short leaves no effect unaccounted for (promise 5):
the cut call may have acted (its tool runs on in its thread), so the rollback undoes it
first when its undo can be said without the output it never recorded (the tool's own
undo), and names it not undone when it cannot (a ``compensate`` that reads the output).
Before, such a step was neither undone nor named. The run is made by ``saga run`` in one
process and read by new ones, on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

from saga.config import Settings
from tests.cli.test_missing_tools import Cli

TOOLS = '''
import os, time
from saga import tool

def _note(what):
    with open(os.environ["OPS_CALLS"], "a") as f:
        f.write(what + "\\n")

def _unship(params, output, ctx):
    _note("unship " + params["what"])
    return {"unshipped": params["what"]}

@tool("dl.ship", compensate=_unship)
def ship(params, ctx):
    time.sleep(params["seconds"])
    _note("ship " + params["what"])
    return {"shipped": params["what"]}

@tool("dl.note")
def note(params, ctx):
    _note(params["what"])
    return {"what": params["what"]}
'''

FLOW = """
name: deadline-cut
timeout: 1s
steps:
  - id: made
    tool: dl.note
    args: {what: made}
    compensate: {tool: dl.note, args: {what: "unmade {{ output.what }}"}}
  - id: pair
    parallel_group: ship
    tool: dl.ship
    args: {what: own, seconds: 2}
  - id: told
    parallel_group: ship
    tool: dl.ship
    args: {what: told, seconds: 2}
    compensate: {tool: dl.note, args: {what: "untold {{ output.shipped }}"}}
"""


def test_a_call_the_deadline_cuts_short_is_undone_or_named_not_undone(
        settings: Settings, tmp_path: Path) -> None:
    cli = Cli(settings, tmp_path)
    cli.env["SAGA_SNAPSHOT_INTERVAL"] = "4"  # each new process reads the run past snapshots
    (tmp_path / "dlmod.py").write_text(TOOLS)
    run_id = cli.start(FLOW, tools="dlmod")

    status = json.loads(cli("status", run_id, "--json").stdout)
    assert status["status"] == "compensated", status
    steps = status["steps"]
    assert steps["made"]["status"] == "compensated"
    assert steps["pair"]["status"] == "compensated"  # its tool's own undo needs no output
    history = cli.history(run_id)
    started = next(e for e in history if e["type"] == "CompensationStarted")
    assert started["payload"]["steps"][-1] == "made"
    assert set(started["payload"]["steps"]) == {"made", "pair", "told"}
    not_undone = [e for e in history if e["type"] == "StepNotUndone"]
    assert [e["step_id"] for e in not_undone] == ["told"]  # its undo reads the output
    # the cut call acted (it ran on in its thread) and was undone after it returned
    calls = cli.called()
    assert calls.index("own") < calls.index("unship")
    assert "unmade" in calls
    assert cli("replay", run_id, "--verify").returncode == 0
    assert cli("audit", "verify", run_id).returncode == 0
