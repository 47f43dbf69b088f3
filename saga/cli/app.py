"""The ``saga`` command line: thin click commands over :class:`saga.api.Saga`.

Exit codes: 0 success (a run completed or is waiting for approval), 1 a run ended
failed or compensated, 2 bad usage or an invalid definition or inputs, 3 the store cannot
be reached, 4 an unknown run, 5 a concurrent writer won, 6 a chosen run id exists with
another definition or inputs. Errors print one line on stderr (an error of several
problems: that line, then one line per problem); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import logging
import os
import re
import sys
import threading
from typing import TYPE_CHECKING, Any, NoReturn

import click

from saga.config import load_settings
from saga.errors import SagaError
from saga.lazy import lazy
from saga.telemetry import logs

if TYPE_CHECKING:
    import difflib

    from saga.api import Saga
else:
    difflib = lazy("difflib")  # only a misspelt command needs it


#: Whether :func:`run` has the cyclic collector off while a command's modules import.
_STARTING = [False]

#: Each command, the module that defines it and its one-line help: ``saga --help`` and
#: ``saga --version`` list them without importing the engine (tests/cli/test_startup.py
#: keeps this table equal to the commands' own help).
COMMANDS: dict[str, tuple[str, str]] = {
    'approve': ('saga.cli.runs',
                 'Approve a step that waits for confirmation.'),
    'audit': ('saga.cli.audit',
               "Tamper checks on the event log: each run's hash chain (and macs, with a key)."),
    'cancel': ('saga.cli.runs',
                'Cancel an unfinished run: undo its completed steps, record who; or, with...'),
    'compensate': ('saga.cli.runs',
                    "Undo a run's completed steps, in reverse completion order."),
    'db': ('saga.cli.admin',
            "The store's tables."),
    'export': ('saga.cli.audit',
                "Print a run's complete, verifiable history (check it with saga audit verify..."),
    'graph': ('saga.cli.graph',
               'Draw a composition FILE, or a RUN with its steps coloured by status.'),
    'history': ('saga.cli.runs',
                 'Print every event of a run, in order.'),
    'keys': ('saga.cli.keys',
              'The encryption keys of payloads at rest: generate a key, rotate it.'),
    'label': ('saga.cli.replay_tools',
               "Change a run's labels while it runs (KEY= removes a label)."),
    'list': ('saga.cli.runs',
              'List runs, newest first, from the read model (caught up first).'),
    'mcp': ('saga.cli.service',
             'Serve saga as an MCP server: each composition a tool, plus skill_run and...'),
    'migrate': ('saga.cli.replay_tools',
                 'Move a run in flight to a new definition, when replay proves it safe.'),
    'notifications': ('saga.cli.notifications',
                       "Webhooks derived from runs' events: list them, show one, send one again."),
    'pause': ('saga.cli.runs',
               'Pause a run: no new step starts, attempts in flight finish.'),
    'projection': ('saga.cli.admin',
                    'The read model: tables saga_runs and saga_steps, maintained from the log.'),
    'reject': ('saga.cli.runs',
                'Reject a step that waits for confirmation (it fails and follows its on_error).'),
    'replay': ('saga.cli.runs',
                "Replay a run's history: verify its decisions, or show it at a point in time."),
    'report': ('saga.cli.audit',
                'A compliance report: outcomes, failures, compensations, durations, who did...'),
    'reset': ('saga.cli.replay_tools',
               'Re-run a run from STEP: undo the steps from there, then run them again.'),
    'resources': ('saga.cli.resources',
                   'Show each limited resource: its limits, its calls in flight and waiting.'),
    'resume': ('saga.cli.runs',
                'Continue an unfinished run here (after an approval, or when it was...'),
    'retention': ('saga.cli.audit',
                   'Remove user data from old finished runs, keeping their audit chains...'),
    'retry': ('saga.cli.runs',
               'Redrive a failed run from its failed steps, keeping completed work; or,...'),
    'run': ('saga.cli.runs',
             "Start a run of FILE (a file or a template's name) and drive it here until..."),
    'run-graph': ('saga.cli.runs',
                   "Seed 004's spelling of saga run: run WORKFLOW_FILE here."),
    'schedule': ('saga.cli.admin',
                  'Compositions started on a cron expression or every N seconds, fired by...'),
    'serve': ('saga.cli.service',
               'Serve the HTTP API, live event streams and the web run viewer.'),
    'signal': ('saga.cli.runs',
                'Send the signal NAME to a run: the first step waiting for it continues with...'),
    'status': ('saga.cli.runs',
                "Show a run's status and its steps (read from the run's own history)."),
    'submit': ('saga.cli.runs',
                'Record a run of FILE without executing it; a worker will pick it up.'),
    'templates': ('saga.cli.templates',
                   'Ready compositions in templates/ (and the folders in SAGA_TEMPLATES).'),
    'token': ('saga.cli.tokens',
               'API tokens of tenants: create (the secret is shown once), list, revoke.'),
    'tools': ('saga.cli.templates',
               'List the available tools.'),
    'unpause': ('saga.cli.runs',
                 'Let a paused run go on (a worker continues it).'),
    'validate': ('saga.cli.runs',
                  'Check a composition; print its execution levels and critical path.'),
    'watch': ('saga.cli.service',
               "Follow events as they are recorded: one RUN's, or every run's."),
    'worker': ('saga.cli.admin',
                'Claim runnable runs and drive them (new, interrupted, approved, redriven).'),
}


class _Group(click.Group):
    """The ``saga`` group: the ONE place an error becomes a line on stderr and an exit code
    (each :class:`SagaError` carries its own; anything else is 1); and it loads a
    command's module only when that command runs, so ``--help`` starts fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(COMMANDS[cmd_name][0])  # its commands register here
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            resolved = super().resolve_command(ctx, args)
        except click.UsageError as e:  # `saga rnu`: name the command they meant
            close = difflib.get_close_matches(args[0] if args else "",
                                              self.list_commands(ctx), n=3, cutoff=0.6)
            if close:
                raise click.UsageError(f"{e.message} Did you mean "
                                       f"{' or '.join(repr(c) for c in close)}?", e.ctx) from e
            raise
        if _STARTING[0]:  # run() turned the collector off for the imports: see there
            _STARTING[0] = False
            gc.freeze()
            gc.enable()
        return resolved

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1] if name in COMMANDS else
                 (self.commands[name].get_short_help_str(limit=formatter.width)))
                for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise  # click prints usage errors itself, with their own exit code
        except BrokenPipeError:
            _quiet_stdout()  # `saga ... | head -1`: the reader had enough
            sys.exit(0)
        except SagaError as e:
            if ctx.params.get("debug"):
                raise
            for line in _error_lines(e):
                click.echo(line, err=True)
            sys.exit(e.exit_code)
        except Exception as e:  # the promise: one clear line, traceback only with --debug
            if ctx.params.get("debug"):
                raise
            detail = " ".join(str(e).split())
            click.echo(f"error: {type(e).__name__}: {detail} (run with --debug for details)",
                       err=True)
            sys.exit(1)


def _error_lines(error: SagaError) -> list[str]:
    """An error as stderr shows it: one line; or, for an error with several problems (a
    composition's, the inputs'), its summary and then each problem on a line of its own."""
    text = " ".join(str(error).split())
    problems = [" ".join(str(p).split()) for p in getattr(error, "problems", None) or ()]
    detail = "; ".join(problems)
    lines = ["error: " + text]
    if len(problems) > 1 and text.endswith(": " + detail):
        lines = ["error: " + text[:-len(detail) - 2] + ":", *("  " + p for p in problems)]
    template = re.fullmatch(r"template '([^']+)'", str(getattr(error, "source", None) or ""))
    if template:  # a built-in template is invalid here only for what its setup gives it
        lines.append(f"  its setup (the saga.toml it needs): saga templates show "
                     f"{template.group(1)}")
    return lines


def _quiet_stdout() -> None:
    """Point stdout at /dev/null once its reader has gone, so that the flush at exit does
    not fail a second time (Python would print the BrokenPipeError then)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class FilePath(click.Path):
    """A file argument: ``click.Path(dir_okay=False)``, where a name no file system takes
    (a NUL, a lone surrogate) is bad usage (exit 2), not the ValueError ``os.stat``
    raises for it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(dir_okay=False, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except ValueError as e:
            self.fail(f"{value!r} is not a usable file name ({e})", param, ctx)


def _saga(tools: tuple[str, ...] = ()) -> Saga:
    """The command's Saga, closed (its connections ended) when the command ends."""
    api = importlib.import_module("saga.api")  # the engine loads when a command needs it
    saga: Saga = api.Saga(load_settings(), tools=tools)
    click.get_current_context().call_on_close(saga.close)
    return saga


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


tools_option = click.option("--tools", "tools", multiple=True, metavar="MODULE",
                            help="Import a Python module of tools (repeatable).")


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


mode_option = click.option(
    "--mode", default="normal", show_default=True, metavar="NAME",
    callback=lambda _ctx, _param, value: _mode(value),
    help="The run's mode, seen as context.mode (eco skips enhancement-layer steps).")


def _mode(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,39}", value):
        raise click.BadParameter(f"{value!r}: a mode is a name (letters, digits, _ and -)")
    return value


def note(message: str) -> None:
    """A line for the operator on stderr; a log record (``saga.cli``, info) when log
    lines are JSON, so that stderr stays one JSON object per line."""
    if logs.is_json():
        logging.getLogger("saga.cli").info(message)
    else:
        click.echo(message, err=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.option("--log-format", type=click.Choice(logs.FORMATS, case_sensitive=False),
              envvar="SAGA_LOG_FORMAT",
              help="Log lines on stderr as text, or one JSON object per line with the run "
                   "and step they are about (SAGA_LOG_FORMAT).")
@click.option("--log-level", type=click.Choice(logs.LEVELS, case_sensitive=False),
              envvar="SAGA_LOG_LEVEL",
              help="The least severe log lines shown (SAGA_LOG_LEVEL; default info with "
                   "--log-format json, else warning).")
@click.version_option(package_name="saga")
def main(debug: bool, log_format: str | None, log_level: str | None) -> None:
    """saga: durable sagas on an event-sourced log.

    \b
    Example:
      saga run quickstart                 # a three-step order saga, end to end
      saga COMMAND --help                 # each command's options and an example
    """
    if log_format or log_level:
        logs.configure((log_format or "text").lower(), log_level)


def run() -> NoReturn:
    """The ``saga`` command: :data:`main`, then an exit that skips the interpreter's
    teardown once nothing is left for it to finish.

    Why: tearing down the engine's modules (freeing their objects one by one) took about
    80 ms of a 0.35 s ``saga run``. Everything a normal exit does that matters still
    happens: the command's Saga is closed with its context, the ``atexit`` handlers run
    (log handlers flush, exporters send their spans), and stdout and stderr are flushed.
    When a thread other than daemons is still running, or the exit status is not a
    number, the normal exit is taken instead, which waits for those threads.

    The cyclic garbage collector is off until the command's modules are imported (see
    ``_Group.resolve_command``), and what they made is then frozen out of its scans: the
    imports allocate some 85,000 objects that live as long as the process; the 115
    collections they triggered took 6% of a ``saga run`` to free about 800 (which now
    stay, frozen with the rest)."""
    gc.disable()
    _STARTING[0] = True
    try:
        main.main(prog_name="saga")
        code: Any = 0
    except SystemExit as e:
        code = e.code
    except BrokenPipeError:  # raised outside a command (click's own output): as there
        _quiet_stdout()
        code = 0
    _exit(code)


def _exit(code: Any) -> NoReturn:
    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if run_exitfuncs is None or not (code is None or isinstance(code, int)):
        sys.exit(code)
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(0.5)  # a tool pool just shut down ends its threads at once
            if thread.is_alive():
                sys.exit(code)
    run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)  # the normal exit reports an unwritable stdout as it always does
    os._exit(code or 0)
