"""``saga --help`` and ``saga --version`` start without loading the engine: counted in
imported modules, not in seconds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

from saga.cli import main
from saga.cli.app import COMMANDS

HEAVY = ("saga.api", "saga.executor", "saga.store", "eventsourcing", "pydantic", "networkx",
         "jinja2", "rich", "psycopg", "httpx", "mcp", "yaml", "opentelemetry",
         "prometheus_client")


def loaded_after(args: list[str]) -> list[str]:
    code = ("import sys, json\nfrom saga.cli import main\n"
            f"try:\n    main({args!r}, standalone_mode=False)\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    modules = json.loads(out.splitlines()[-1])
    return [m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)]


def test_help_and_version_load_no_engine() -> None:
    assert loaded_after(["--help"]) == []
    assert loaded_after(["--version"]) == []


def test_the_command_table_matches_the_commands() -> None:
    for module in sorted({m for m, _ in COMMANDS.values()}):
        __import__(module)
    assert set(COMMANDS) == set(main.commands)
    for name, (module, short) in COMMANDS.items():
        command = main.commands[name]
        assert command.callback is not None and command.callback.__module__ == module, name
        assert command.get_short_help_str(limit=78) == short, name
        assert isinstance(command, click.Command)


def every_command(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command and subcommand's path, groups included."""
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        paths.append((*path, name))
        if isinstance(command, click.Group):
            paths += every_command(command, (*path, name))
    return paths


def test_every_help_has_an_example() -> None:
    from click.testing import CliRunner

    paths = every_command(main)
    assert len(paths) > 40 and ("projection", "rebuild") in paths
    lacking = []
    for path in [(), *paths]:
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        if not re.search(r"Example:\n +(saga|SAGA_\w+=\S+ saga) ", result.output):
            lacking.append(" ".join(path))
    assert lacking == []


#: What a run of a step-list composition never touches, so ``saga run`` does not import it
#: (networkx and the graph form's models are for graph-form files and drawings; audit,
#: replay, schedules and workers for their own commands; Jinja2 for templates; cryptography
#: for SAGA_UNDO_KEY; rich for a terminal or text that is not plain; tenacity for a retry's
#: wait, a lost connection or new PostgreSQL tables; tomllib for a saga.toml or pyproject.toml;
#: difflib for a template not found).
NOT_FOR_A_STEP_LIST_RUN = ("networkx", "saga.composition.graph_form",
                           "saga.composition.graph_model", "saga.composition.graph_checks",
                           "saga.scheduler.graph", "saga.audit", "saga.replay",
                           "saga.schedules", "saga.worker", "saga.diagram", "croniter",
                           "jinja2", "cryptography", "rich", "tenacity", "tomllib", "difflib")
STEP_LIST = """name: three
steps:
  - {id: s0, tool: noop}
  - {id: s1, tool: noop, depends_on: [s0]}
  - {id: s2, tool: noop, depends_on: [s1]}
"""
GRAPH_FORM = """id: g
name: g
entry_point: a
nodes:
  - {id: a, type: task, task_config: {role: noop, task_template: x}}
  - {id: b, type: task, task_config: {role: noop, task_template: y}}
edges:
  - {id: e1, source: a, target: b}
"""


def run_in_a_process(tmp_path: Path, text: str) -> tuple[dict[str, Any], list[str], bool]:
    """``saga run FILE`` (its summary printed off a terminal), then ``saga run FILE --json``
    in a fresh interpreter: the run the second printed, the modules loaded by the end, and
    whether the graph form's pydantic models had been built."""
    flow = tmp_path / "flow.yaml"
    flow.write_text(text, encoding="utf-8")
    code = ("import contextlib, io, sys, json\nfrom saga.cli import main\n"
            "text = io.StringIO()\n"
            f"for args, out in ((['run', {str(flow)!r}], text), "
            f"(['run', {str(flow)!r}, '--json'], sys.stdout)):\n"
            "    try:\n        with contextlib.redirect_stdout(out):\n"
            "            main(args, standalone_mode=False)\n"
            "    except SystemExit as e:\n        assert not e.code, e.code\n"
            "assert '): completed' in text.getvalue(), text.getvalue()\n"
            "modules = sorted(sys.modules)\n"
            "from saga.composition import graph_model\n"
            "print(json.dumps([modules, graph_model.WorkflowGraph.__pydantic_complete__]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path, env={**env, "SAGA_HOME": str(tmp_path)})
    *run_lines, last = out.stdout.splitlines()
    modules, built = json.loads(last)
    return json.loads("\n".join(run_lines)), modules, built


def loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return [m for m in modules if any(m == n or m.startswith(n + ".") for n in names)]


def test_a_step_list_run_loads_no_graph_library(tmp_path: Path) -> None:
    """``saga run`` of a step-list file starts without networkx, the graph-form models or
    the modules of other commands (issue 15: they were most of its start-up time)."""
    run, modules, built = run_in_a_process(tmp_path, STEP_LIST)
    assert run["status"] == "completed" and list(run["steps"]) == ["s0", "s1", "s2"]
    assert loaded(modules, NOT_FOR_A_STEP_LIST_RUN) == []
    assert not built


def test_a_graph_form_run_loads_them_when_it_needs_them(tmp_path: Path) -> None:
    """The other side of the test above, so that it can fail: the graph form does load
    networkx and build its models, on first use."""
    run, modules, built = run_in_a_process(tmp_path, GRAPH_FORM)
    assert run["status"] == "completed" and list(run["steps"]) == ["a", "b"]
    assert "networkx" in loaded(modules, NOT_FOR_A_STEP_LIST_RUN)
    assert {"saga.composition.graph_form", "saga.scheduler.graph"} <= set(modules)
    assert built


def test_the_collector_is_back_on_once_a_command_is_loaded() -> None:
    """``saga`` turns the cyclic garbage collector off while a command's modules import
    (they make tens of thousands of objects that live as long as the process); resolving
    the command freezes those and turns it on again, so a worker or a server that runs
    for days collects as usual."""
    code = ("import gc, click\nfrom saga.cli import app\n"
            "gc.disable()\napp.main.resolve_command(click.Context(app.main), ['list'])\n"
            "print(gc.isenabled())\n"  # a caller's own choice is left alone
            "app._STARTING[0] = True\n"  # as run() sets it
            "app.main.resolve_command(click.Context(app.main), ['list'])\n"
            "print(gc.isenabled(), gc.get_freeze_count() > 1000)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "True", "True"]
