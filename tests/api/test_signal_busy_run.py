"""An operator's signal lands on a run another writer keeps appending to.

``saga signal`` (and every command through ``RunCommands._append``) reads the run, records
its event and appends it under the run's version fence. A busy driver (a run appending
many events quickly, on a loaded machine) can win every race between that read and that
append. Before, the command gave up after 6 tries (~0.6 s): ``saga signal`` exited 5, "run
... was changed by another writer" (found by the conformance simulator's long mode). Now it
tries again for ``append_patience`` seconds (5), with short jittered waits.

The races are forced, not hoped for: a stand-in in front of ``save_run`` has a real second
writer (another Saga labelling the run) append first, for the first BUSY saves, so each of
those appends is refused by the real version fence.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.errors import ConcurrentWriteError
from tests.conftest import store_env

#: More conflicts in a row than the old fixed count of tries (6) survived.
BUSY = 10

FLOW = {"name": "busy-signal", "steps": [
    {"id": "prep", "tool": "echo", "parameters": {"x": 1}},
    {"id": "approve", "signal": "go"}]}

#: ``saga signal`` in a process of its own, its first BUSY appends each beaten by another
#: writer (a second Saga of its own labelling the run) just before they are made.
CLI_BUSY = """
import os, sys
from saga.api import Saga
from saga.config import load_settings
from saga.store import SagaApplication
save = SagaApplication.save_run
other = Saga(load_settings())
left = [int(os.environ["BUSY"])]

def save_run(self, run, *args, **kwargs):
    if left[0] > 0 and run.pending_events and self is not other.app:  # the CLI's own
        left[0] -= 1
        other.label(run.run_id, {"busy": str(left[0])})
    return save(self, run, *args, **kwargs)

SagaApplication.save_run = save_run
sys.argv[0] = "saga"
from saga.cli import run
run()
"""


def waiting_run(settings: Settings) -> str:
    """A run whose ``approve`` step waits for the signal ``go``."""
    with Saga(settings) as s:
        run = s.run(s.load(FLOW))
        assert s.get(run.run_id).steps["approve"]["status"] == "running"
        return run.run_id


def beaten(s: Saga, other: Saga, times: int | None) -> list[int]:
    """Make ``s``'s next ``times`` appends (every one if None) lose to ``other``; returns
    the count of appends tried, as a one-item list updated in place."""
    save, tried = s.app.save_run, [0]

    def save_run(run: Any, *args: Any, **kwargs: Any) -> None:
        tried[0] += 1
        if times is None or tried[0] <= times:
            other.label(run.run_id, {"busy": str(tried[0])})
        save(run, *args, **kwargs)
    s.app.save_run = save_run  # type: ignore[method-assign]
    return tried


def busy_env(settings: Settings) -> dict[str, str]:
    """The environment of a ``CLI_BUSY`` process on the store of ``settings``."""
    return store_env(settings, BUSY=str(BUSY), SAGA_ACTOR="ops")


def test_a_signal_outlasts_a_run_that_keeps_changing(settings: Settings) -> None:
    run_id = waiting_run(settings)
    with Saga(settings) as s, Saga(settings) as other:
        tried = beaten(s, other, BUSY)
        s.signal(run_id, "go", {"ok": True})
        assert tried[0] == BUSY + 1
    with Saga(settings) as fresh:
        run = fresh.get(run_id)
        assert [(x["name"], x["data"]) for x in run.signals] == [("go", {"ok": True})]
        assert run.context["labels"]["busy"] == str(BUSY)


def test_a_command_gives_up_once_its_patience_is_spent(sqlite_settings: Settings) -> None:
    """Bounded by time: a run that changes before every append refuses the command after
    ``append_patience`` seconds (not sooner, not never), and nothing of it is recorded."""
    run_id = waiting_run(sqlite_settings)
    with Saga(sqlite_settings) as s, Saga(sqlite_settings) as other:
        s.append_patience = 0.5
        tried = beaten(s, other, None)
        began = time.monotonic()
        with pytest.raises(ConcurrentWriteError):
            s.signal(run_id, "go")
        assert 0.5 <= time.monotonic() - began < 3
        assert tried[0] > 6  # more than the old fixed count, in half a second
        assert s.get(run_id).signals == []


def test_saga_signal_exits_0_on_a_busy_run_and_a_new_process_reads_it(
        settings: Settings, tmp_path: Path) -> None:
    run_id = waiting_run(settings)
    env = busy_env(settings)
    sent = subprocess.run(
        [sys.executable, "-c", CLI_BUSY, "signal", run_id, "go", "--data", '{"n": 7}',
         "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    with Saga(settings) as fresh:
        run = fresh.get(run_id)
        assert [(x["name"], x["data"], x["actor"]) for x in run.signals] == \
            [("go", {"n": 7}, "ops")]
        assert run.context["labels"]["busy"] == "0"  # every forced conflict happened
    assert json.loads(sent.stdout)  # the CLI printed the run it signalled


def test_label_and_migrate_outlast_a_run_that_keeps_changing(settings: Settings) -> None:
    """``saga label`` and ``saga migrate`` gave up after 5 immediate tries (exit 5, "was
    changed by another writer"; the conformance simulator's long mode found both); they
    now try as long as every other command."""
    run_id = waiting_run(settings)
    later = {**FLOW, "steps": [*FLOW["steps"],
                               {"id": "after", "tool": "echo", "parameters": {"y": 2}}]}
    with Saga(settings) as s, Saga(settings) as other:
        tried = beaten(s, other, BUSY)
        s.label(run_id, {"team": "ops"})
        assert tried[0] == BUSY + 1
        tried = beaten(s, other, BUSY)
        check = s.migrate(run_id, s.load(later))
        assert check.migrated and tried[0] == BUSY + 1
    with Saga(settings) as fresh:
        run = fresh.get(run_id)
        assert run.context["labels"]["team"] == "ops"
        assert [e["type"] for e in fresh.history(run_id)].count("DefinitionMigrated") == 1
        assert "after" in [s["id"] for s in run.definition["steps"]]


@pytest.mark.parametrize("command", ["label", "migrate"])
def test_saga_label_and_migrate_exit_0_on_a_busy_run(settings: Settings, tmp_path: Path,
                                                     command: str) -> None:
    run_id = waiting_run(settings)
    env = busy_env(settings)
    later = tmp_path / "later.json"
    later.write_text(json.dumps({**FLOW, "steps": [
        *FLOW["steps"], {"id": "after", "tool": "echo", "parameters": {"y": 2}}]}))
    args = ["label", run_id, "team=ops"] if command == "label" else \
        ["migrate", run_id, "--to", str(later)]
    done = subprocess.run([sys.executable, "-c", CLI_BUSY, *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    with Saga(settings) as fresh:
        run = fresh.get(run_id)
        assert run.context["labels"]["busy"] == "0"  # every forced conflict happened
        if command == "label":
            assert run.context["labels"]["team"] == "ops"
        else:
            assert "after" in [s["id"] for s in run.definition["steps"]]
