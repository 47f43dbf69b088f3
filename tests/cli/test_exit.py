"""How the ``saga`` command ends: after the command, its Saga is closed, the ``atexit``
handlers run and output is flushed; the interpreter's teardown is skipped only when no
thread but daemons is left (otherwise the normal exit waits for them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from saga.api import Saga
from saga.cli import main
from saga.config import Settings

FLOW = """name: exit-flow
steps:
  - {id: a, tool: noop}
  - {id: b, tool: noop, depends_on: [a]}
"""


def saga_process(tmp_path: Path, prelude: str, args: list[str]
                 ) -> subprocess.CompletedProcess[str]:
    """``saga ARGS`` through the console script's entry point, ``prelude`` run first."""
    code = (f"import sys\n{prelude}\nsys.argv = ['saga', *{args!r}]\n"
            "from saga.cli import run\nrun()\n")
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env={"SAGA_HOME": str(tmp_path / ".saga"), "PATH": "/usr/bin:/bin"})


def test_exit_runs_atexit_handlers_and_flushes_output(tmp_path: Path) -> None:
    (tmp_path / "flow.yaml").write_text(FLOW, encoding="utf-8")
    # A handler that writes to stdout without flushing: it must run, and reach the pipe.
    done = saga_process(tmp_path, "import atexit\natexit.register(lambda: print('bye'))",
                        ["run", "flow.yaml"])
    assert done.returncode == 0, done.stderr
    assert "(exit-flow): completed" in done.stdout
    assert done.stdout.splitlines()[-1] == "bye"


def test_exit_status_is_the_commands(tmp_path: Path) -> None:
    assert saga_process(tmp_path, "", ["run", "nope.yaml"]).returncode == 2
    (tmp_path / "fails.yaml").write_text(
        "name: fails\nsteps:\n  - {id: a, tool: fail}\n", encoding="utf-8")
    failed = saga_process(tmp_path, "", ["run", "fails.yaml"])
    assert failed.returncode == 1, failed.stderr
    assert saga_process(tmp_path, "", ["--version"]).returncode == 0


def test_a_thread_still_running_is_waited_for(tmp_path: Path) -> None:
    marker = tmp_path / "thread-finished"
    prelude = ("import threading, time, pathlib\n"
               "def late():\n    time.sleep(1.5)\n"
               f"    pathlib.Path({str(marker)!r}).write_text('yes')\n"
               "threading.Thread(target=late).start()")
    done = saga_process(tmp_path, prelude, ["--version"])
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "yes"


def test_the_commands_saga_is_closed_when_it_ends(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_HOME", str(tmp_path / ".saga"))
    monkeypatch.delenv("SAGA_DATABASE_URL", raising=False)
    (tmp_path / "flow.yaml").write_text(FLOW, encoding="utf-8")
    closed: list[Saga] = []
    real_close = Saga.close

    def close(self: Saga) -> Any:
        closed.append(self)
        return real_close(self)
    monkeypatch.setattr(Saga, "close", close)
    result = CliRunner().invoke(main, ["run", str(tmp_path / "flow.yaml")])
    assert result.exit_code == 0, result.output
    assert len(closed) == 1
    result = CliRunner().invoke(main, ["run", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2


def test_a_reader_that_goes_away_does_not_cut_the_run_short(tmp_path: Path) -> None:
    """``saga run flow.yaml | head -1``: the run still ends (it stopped between two
    steps, on the first line it could not write), and the command exits as the run did."""
    (tmp_path / "flow.yaml").write_text(
        "name: piped\nsteps:\n  - {id: a, tool: noop}\n"
        "  - {id: b, tool: sleep, args: {seconds: 0.3}, depends_on: [a]}\n"
        "  - {id: c, tool: noop, depends_on: [b]}\n", encoding="utf-8")
    code = "import sys\nsys.argv = ['saga', 'run', 'flow.yaml']\nfrom saga.cli import run\nrun()\n"
    child = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={"SAGA_HOME": str(tmp_path / ".saga"), "PATH": "/usr/bin:/bin"})
    assert child.stdout is not None and child.stderr is not None
    first = child.stdout.readline()
    child.stdout.close()  # as head does after its line, while step b sleeps
    assert child.wait(timeout=120) == 0, child.stderr.read()
    assert b"RunStarted" in first
    with Saga(Settings(home=tmp_path / ".saga")) as saga:
        (listed,) = saga.list_runs()
        assert listed["status"] == "completed"
