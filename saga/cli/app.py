"""The ``saga`` command line: thin click commands over :class:`saga.api.Saga`.

Exit codes: 0 success (a run completed or is waiting for approval), 1 a run ended
failed or compensated, 2 bad usage or an invalid definition or inputs, 3 the store cannot
be reached, 4 an unknown run, 5 a concurrent writer won, 6 a chosen run id exists with
another definition or inputs. Errors print one line on stderr;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from saga.api import Saga
from saga.config import load_settings
from saga.errors import SagaError


class _Group(click.Group):
    """The ``saga`` group: the ONE place an error becomes a line on stderr and an exit code
    (each :class:`SagaError` carries its own; anything else is 1)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click prints usage errors itself, with their own exit code
        except SagaError as e:
            if ctx.params.get("debug"):
                raise
            click.echo("error: " + " ".join(str(e).split()), err=True)
            sys.exit(e.exit_code)
        except Exception as e:  # the promise: one clear line, traceback only with --debug
            if ctx.params.get("debug"):
                raise
            detail = " ".join(str(e).split())
            click.echo(f"error: {type(e).__name__}: {detail} (run with --debug for details)",
                       err=True)
            sys.exit(1)


def _saga(tools: tuple[str, ...] = ()) -> Saga:
    return Saga(load_settings(), tools=tools)


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


tools_option = click.option("--tools", "tools", multiple=True, metavar="MODULE",
                            help="Import a Python module of tools (repeatable).")


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


mode_option = click.option("--mode", type=click.Choice(["normal", "eco"]), default="normal",
                           show_default=True, help="eco skips enhancement-layer steps.")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="saga")
def main(debug: bool) -> None:
    """saga: durable sagas on an event-sourced log."""
