"""``saga --help`` and ``saga --version`` start without loading the engine: counted in
imported modules, not in seconds."""

from __future__ import annotations

import json
import re
import subprocess
import sys

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
