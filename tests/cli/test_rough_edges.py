"""The command line's rough edges, smoothed (issue 39): "did you mean" for commands,
tools and keys; every problem of a composition at once, one per line; an unknown status
refused; rows of ``saga list`` within 80 columns, with human times; silence when the
reader of stdout goes away; and, on Ctrl-C, what ``saga run`` left and how to go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from saga.cli import main
from saga.cli.render import _ago
from saga.config import Settings
from tests.server.conftest import store_env


def invoke(home: Path, *args: str) -> Result:
    env = {"SAGA_HOME": str(home), "SAGA_ACTOR": "tester", "SAGA_DATABASE_URL": None,
           "SAGA_DATABASE_SCHEMA": None, "SAGA_TOOLS": None, "SAGA_CONFIG": None}
    return CliRunner().invoke(main, list(args), env=env)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # no saga.toml of the project applies
    return tmp_path / ".saga"


def test_a_misspelt_command_names_the_one_meant(home: Path) -> None:
    result = invoke(home, "rnu", "quickstart")
    assert result.exit_code == 2
    assert "No such command 'rnu'. Did you mean 'run'?" in result.stderr
    result = invoke(home, "zzzzzz")
    assert result.exit_code == 2 and "Did you mean" not in result.stderr


def test_every_problem_at_once_one_per_line_with_close_names(home: Path,
                                                            tmp_path: Path) -> None:
    # step a is malformed twice over (a bad retry, a misspelt key) and calls a misspelt
    # tool: its unknown tool is said with the rest, not hidden behind them
    flow = tmp_path / "flow.yaml"
    flow.write_text("name: flow\nstepz: 1\nsteps:\n"
                    "  - id: a\n    tool: ecko\n    retry: 5\n    dependz_on: []\n"
                    "  - id: b\n    tool: noop\n    compensate: {tool: nop}\n")
    result = invoke(home, "validate", str(flow))
    assert result.exit_code == 2, result.output
    head, *lines = result.stderr.splitlines()
    assert head == f"error: {flow} is invalid for 5 reasons:"
    assert sorted(lines) == sorted([
        "  stepz: unknown key (not part of the composition language); did you mean 'steps'?",
        "  steps[0].retry: Input should be a valid dictionary or instance of RetryPolicy",
        "  steps[0].dependz_on: unknown key (not part of the composition language); "
        "did you mean 'depends_on'?",
        "  steps[0].tool: unknown tool 'ecko'; did you mean 'echo'?",
        "  steps[1].compensate.tool: unknown tool 'nop'; did you mean 'noop'?"]), lines
    data = json.loads(invoke(home, "validate", str(flow), "--json").stdout)
    assert len(data["problems"]) == 5


def test_list_refuses_an_unknown_status(home: Path) -> None:
    result = invoke(home, "list", "--status", "bogus")
    assert result.exit_code == 2
    assert "Invalid value for '--status': 'bogus' is not one of 'running'" in result.stderr
    assert invoke(home, "list", "--status", "failed").exit_code == 0


def test_list_rows_fit_80_columns_with_human_times(home: Path, tmp_path: Path) -> None:
    flow = tmp_path / "flow.yaml"
    flow.write_text("name: a-composition-with-a-rather-long-name-indeed\n"
                    "steps: [{id: a, tool: noop}]\n")
    chosen = "ORDER-2026-11-29-000000000042"  # longer than the 20 columns it gets
    ran = [json.loads(invoke(home, "run", str(flow), "--json", *extra).stdout)
           for extra in ((), ("--id", chosen), ("--actor", "someone-with-a-long-name"))]
    result = invoke(home, "list")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["RUN", "STATUS", "DEFINITION", "ACTOR", "STARTED"]
    assert len(rows) == 3 and all(len(line) <= 80 for line in [header, *rows]), rows
    assert all(line.endswith("s ago") for line in rows), rows
    shown = [line.split()[0] for line in rows]
    assert shown[1] == chosen[:19] + "…"
    assert shown[0] == ran[2]["run_id"][:8] and shown[2] == ran[0]["run_id"][:8]
    for prefix in (shown[0], shown[1].rstrip("…")):  # what is shown finds the run
        assert invoke(home, "status", prefix).exit_code == 0
    listed = json.loads(invoke(home, "list", "--json").stdout)  # JSON keeps ISO times
    assert datetime.fromisoformat(listed[0]["started_at"]).tzinfo is not None
    history = invoke(home, "history", chosen).stdout.splitlines()
    assert history[0].split()[1].count(":") == 2 and "T" not in history[0].split()[1]


def test_ago_is_short() -> None:
    now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    ago = {d: _ago((now - d).isoformat(), now) for d in (
        timedelta(seconds=5), timedelta(minutes=2, seconds=3), timedelta(hours=3),
        timedelta(days=5), timedelta(days=90), timedelta(seconds=-2))}
    assert list(ago.values()) == ["5s ago", "2m ago", "3h ago", "5d ago", "2026-08-31",
                                  "0s ago"]
    assert _ago((now + timedelta(minutes=5)).isoformat(), now) == "in 5m"
    assert _ago(None) == "-"


def test_schedules_say_when_they_fire_next_in_human_time(home: Path) -> None:
    added = invoke(home, "schedule", "add", "nightly", "quickstart", "--every", "2h")
    assert added.exit_code == 0, added.output
    header, row = invoke(home, "schedule", "list").stdout.splitlines()
    assert header.split() == ["NAME", "WHEN", "NEXT", "STATE"]
    assert row.split()[3:5] == ["in", "1h"] or row.split()[3:5] == ["in", "2h"], row
    listed = json.loads(invoke(home, "schedule", "list", "--json").stdout)
    assert datetime.fromisoformat(listed[0]["next_due"]).tzinfo is not None


# -- real processes ----------------------------------------------------------------------

def _env(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    return env | {"SAGA_HOME": str(cwd / ".saga"), "SAGA_ACTOR": "ops",
                  "SAGA_LEASE_SECONDS": "2"}


def _saga(args: list[str], cwd: Path,
          env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=cwd,
                          env=env or _env(cwd), capture_output=True, text=True, timeout=120)


def _reader_gone(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``saga ARGS | head -0``: the reader of stdout has gone before saga writes."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=cwd,
                              env=_env(cwd), stdout=w, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    finally:
        os.close(w)


def test_a_reader_going_away_is_silent(tmp_path: Path) -> None:
    done = _saga(["run", "quickstart", "--id", "PIPE-1", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    watched = _saga(["watch", "PIPE-1"], tmp_path).stdout.splitlines()
    assert watched[0].split()[1].count(":") == 2 and "T" not in watched[0].split()[1]
    for args in (["validate", "quickstart"], ["templates", "list"], ["watch", "PIPE-1"],
                 ["history", "PIPE-1"], ["list"]):
        gone = _reader_gone(args, tmp_path)
        assert gone.stderr == "", (args, gone.stderr)
        assert gone.returncode == 0, (args, gone.returncode)


def _sigint_default() -> None:
    # As in a terminal: a test run started in the background (`pytest &`) has SIGINT
    # ignored, its children inherit that, and saga (as Python) leaves it ignored, so
    # the Ctrl-C below would never arrive and the run would just finish.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_in_run_says_what_it_left_and_another_process_finishes_it(
        tmp_path: Path, settings: Settings) -> None:
    env = store_env(settings, SAGA_ACTOR="ops")
    calls = tmp_path / "calls.txt"
    flow = tmp_path / "slow.yaml"
    flow.write_text(f"""\
name: slow
steps:
  - id: first
    tool: file
    args: {{action: append, path: "{calls}", content: "first\\n"}}
  - id: nap
    tool: sleep
    args: {{seconds: 4}}
""")
    proc = subprocess.Popen([sys.executable, "-m", "saga.cli", "run", str(flow), "--id", "CC-1"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:  # off a terminal: one line per event
        if "StepStarted nap" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Aborted!" not in err and "Traceback" not in err
    assert "interrupted: run CC-1 (slow) is left running, steps in flight: nap" in err
    assert "saga resume CC-1" in err and "saga worker" in err and "saga status CC-1" in err
    # with --json and an id saga chose, the run is named all the same
    calls.write_text("")
    quiet = subprocess.Popen([sys.executable, "-m", "saga.cli", "run", str(flow), "--json"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    while not calls.read_text():  # its first step has run: the run is recorded
        assert quiet.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    quiet.send_signal(signal.SIGINT)
    _, err = quiet.communicate(timeout=60)
    assert quiet.returncode == 130 and "interrupted: run " in err and "(slow) is left" in err, err
    calls.write_text("first\n")
    # a new process reads what this one left, and finishes it without calling first again
    status = json.loads(_saga(["status", "CC-1", "--json"], tmp_path, env).stdout)
    assert status["status"] == "running"
    deadline = time.monotonic() + 60
    while True:
        resumed = _saga(["resume", "CC-1", "--json"], tmp_path, env)
        if resumed.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the interrupted process's lease lapses (SAGA_LEASE_SECONDS=2)
    assert json.loads(resumed.stdout)["status"] == "completed", resumed.stderr
    assert calls.read_text().split() == ["first"]
