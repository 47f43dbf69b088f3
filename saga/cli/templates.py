"""Commands on the template library and the tools: ``saga templates ...``, ``saga tools``."""

from __future__ import annotations

from typing import Any

import click

from saga.cli.app import (
    _emit_json,
    _saga,
    json_option,
    main,
    tools_option,
)
from saga.cli.render import (
    _duration,
)
from saga.cli.runs import (
    _run_file,
    _run_options,
)
from saga.composition.library import find_template, list_templates, read_template
from saga.errors import SagaError
from saga.report import template_stats, templates_stats


@main.group()
def templates() -> None:
    """Ready compositions in templates/ (and the folders in SAGA_TEMPLATES).

    \b
    Example:
      saga templates list && saga templates show quickstart
    """


@templates.command(name="list")
@json_option
def templates_list(as_json: bool) -> None:
    """The templates, with their success rate and mean duration from past runs.

    \b
    Example:
      saga templates list --json
    """

    saga = _saga()
    infos = list_templates(saga.settings)
    try:
        stats = templates_stats(saga, infos)
    except SagaError:
        stats = {}
    if as_json:
        _emit_json([info.to_json() | {"definition": info.definition_name,
                                      "stats": stats.get(info.name)} for info in infos])
        return
    click.echo(f"{'NAME':<28} {'CATEGORY':<12} {'RUNS':>4} {'SUCCESS':>7} {'MEAN':>7}  "
               "DESCRIPTION")
    for info in infos:
        st = stats.get(info.name) or {}
        rate, mean = st.get("success_rate"), st.get("mean_duration_ms")
        tags = f"  [{', '.join(info.tags)}]" if info.tags else ""
        click.echo(f"{info.name:<28} {info.category or '':<12} {st.get('runs', 0):>4} "
                   f"{'-' if rate is None else f'{rate:.0%}':>7} {_duration(mean):>7}  "
                   f"{(info.title or info.description or '')[:60]}{tags}")


@templates.command(name="show")
@click.argument("name")
@json_option
def templates_show(name: str, as_json: bool) -> None:
    """A template's description, inputs, needed configuration and statistics.

    \b
    Example:
      saga templates show quickstart
    """

    saga = _saga()
    info = read_template(find_template(name, saga.settings))
    stats = template_stats(saga, name)
    if as_json:
        _emit_json(info.to_json() | {"definition": info.definition_name, "stats": stats})
        return
    click.echo(f"{info.name}: {info.title or info.definition_name}  ({info.path})")
    click.echo(f"category: {info.category}   tags: {', '.join(info.tags or [])}")
    click.echo(f"tools: {', '.join(info.required_tools or [])}")
    if info.description:
        click.echo("\n" + info.description.strip())
    if info.long_description:
        click.echo("\n" + info.long_description.strip())
    if info.inputs:
        click.echo("\ninputs:")
        for spec in info.inputs:
            required = "required" if spec.get("required") else f"default {spec.get('default')!r}"
            click.echo(f"  {spec['name']:<18} {spec.get('type', 'string'):<8} {required:<22} "
                       f"{spec.get('description', '')}")
    if info.config:
        click.echo("\nneeds in saga.toml:\n" + str(info.config).rstrip())
    if info.setup:  # what an empty folder needs first, as commands to paste
        click.echo("\nsetup (in an empty folder):")
        for command in info.setup:
            click.echo("  " + command)
    if info.example:
        click.echo("\nexample: " + str(info.example).strip())
    rate = stats.get("success_rate")
    click.echo(f"\nruns: {stats.get('runs', 0)}, success "
               f"{'-' if rate is None else f'{rate:.0%}'}, mean "
               f"{_duration(stats.get('mean_duration_ms'))}")


@templates.command(name="run")
@click.argument("name")
@_run_options
def templates_run(name: str, **options: Any) -> None:
    """Run the template NAME here, like saga run.

    \b
    Example:
      saga templates run quickstart -i fail_at=ship --json
    """
    saga = _saga(options["tools"])
    path = find_template(name, saga.settings)
    _run_file(saga, str(path), options)


@main.command()
@tools_option
@json_option
def tools(tools: tuple[str, ...], as_json: bool) -> None:
    """List the available tools.

    \b
    Example:
      saga tools --tools mytools --json
    """
    registry = _saga(tools).registry
    rows = [{"name": t.name, "source": t.source, "description": t.description,
             "compensation": t.compensate is not None, "params": t.params} for t in registry]
    if as_json:
        _emit_json(rows)
        return
    for row in rows:
        click.echo(f"{row['name']:<24} {row['source']:<28} {row['description']}")
