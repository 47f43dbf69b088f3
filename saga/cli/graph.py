"""``saga graph``: a composition file, a template or a run drawn as Mermaid or DOT."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from saga.cli.app import _saga, main, tools_option
from saga.composition import plan_of
from saga.composition.library import find_template
from saga.errors import ConfigError, RunNotFoundError
from saga.lazy import lazy
from saga.scheduler.policy import not_undone

if TYPE_CHECKING:
    from saga import diagram
else:
    diagram = lazy("saga.diagram")  # only `saga graph` draws


@main.command()
@click.argument("target")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid",
              show_default=True)
@tools_option
def graph(target: str, fmt: str, tools: tuple[str, ...]) -> None:
    """Draw a composition FILE, or a RUN with its steps coloured by status.

    TARGET may also name a template. Conditions label their edges; each undo is drawn
    dashed, chained in the order a rollback runs them.

    \b
    Example:
      saga graph deploy.yaml --format dot | dot -Tsvg > deploy.svg
      saga graph quickstart
      saga graph ORDER-42
    """
    saga = _saga(tools)
    try:
        is_file = Path(target).exists()
    except (OSError, ValueError):  # no file has such a name (too long, a NUL): a run's
        is_file = False
    run, left = None, []
    if is_file:
        plan = saga.load(target)
    else:
        try:
            run = saga.get(target)
        except RunNotFoundError as missing:
            try:  # not a run: a template of that name, else the run was what was meant
                template = find_template(target, saga.settings)
            except ConfigError:
                raise missing from None
            plan = saga.load(template)
        else:
            plan = plan_of(run)
            left = not_undone(plan, run)
    draw = diagram.mermaid if fmt == "mermaid" else diagram.dot
    click.echo(draw(plan, run, left), nl=False)
