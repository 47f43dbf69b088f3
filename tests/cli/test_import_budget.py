"""What ``saga run`` and ``saga status`` import from the shell, counted (issue 44): a
command's start is mostly Python importing, so the count of modules is the budget, and
the heavy packages that neither command needs must not come back on their path. Each
command runs as a new process (``python -X importtime``, one line per module imported);
``saga status`` reads the run the ``saga run`` process wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

#: Modules each command may import, the interpreter's own included: about 400 on
#: 2026-11-29 (``python -c pass`` imports about 60), with room for the features still
#: landing. A heavy dependency (pydantic's schema builder counts about 40, FastAPI's stack
#: 300) breaks it; so does a quiet growth of a tenth.
BUDGET = 440
#: Packages neither command needs on SQLite (the service, templates, terminal rendering
#: off a terminal, tracing, metrics, graphs and drawings, MCP and HTTP clients, cron,
#: encryption, retries, PostgreSQL), and saga's modules of other commands.
HEAVY = ("fastapi", "starlette", "uvicorn", "anyio", "jinja2", "rich", "pygments",
         "opentelemetry", "prometheus_client", "networkx", "httpx", "mcp", "croniter",
         "cryptography", "tenacity", "psycopg", "psycopg_pool", "saga.server", "saga.worker",
         "saga.audit", "saga.replay", "saga.schedules", "saga.diagram", "saga.report")
FLOW = """name: three
steps:
  - {id: s0, tool: noop}
  - {id: s1, tool: noop, depends_on: [s0]}
  - {id: s2, tool: noop, depends_on: [s1]}
"""


def imported(tmp_path: Path, *args: str) -> tuple[str, list[str]]:
    """``saga ARGS`` in a new process: its stdout, and the modules it imported in order."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_HOME": str(tmp_path / ".saga"), "SAGA_ACTOR": "tester"}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "saga.cli", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = [line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
               if line.startswith("import time:") and "|" in line]
    return done.stdout, modules[1:]  # the first line is the column headings


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_saga_run_and_status_import_within_their_budget(tmp_path: Path) -> None:
    (tmp_path / "flow.yaml").write_text(FLOW, encoding="utf-8")
    out, run_modules = imported(tmp_path, "run", "flow.yaml", "--json")
    run = json.loads(out)
    assert run["status"] == "completed"
    out, status_modules = imported(tmp_path, "status", run["run_id"], "--json")
    assert json.loads(out)["status"] == "completed"  # read from the other process's run
    for name, modules in (("saga run", run_modules), ("saga status", status_modules)):
        assert "saga.api" in modules and "saga.cli" in modules, name  # counted for real
        assert heavy(modules) == [], name
        assert len(modules) <= BUDGET, (name, len(modules))
