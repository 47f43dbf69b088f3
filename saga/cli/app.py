"""The ``saga`` command line: thin click commands over :class:`saga.api.Saga`.

Exit codes: 0 success (a run completed or is waiting for approval), 1 a run ended
failed or compensated, 2 bad usage or an invalid definition or inputs, 3 the store cannot
be reached, 4 an unknown run, 5 a concurrent writer won. Errors print one line on stderr;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from saga import audit as audit_log
from saga.api import Saga, run_summary
from saga.config import load_settings
from saga.definition import coerce_text, parse_text
from saga.domain import RUN_STATUSES, Run
from saga.errors import DefinitionError, InputError, Problem, SagaError

_STATUS_STYLE = {"completed": "green", "running": "cyan", "failed": "red", "skipped": "dim",
                 "compensated": "magenta", "compensating": "magenta", "waiting": "yellow",
                 "pending": "dim", "cancelled": "red"}


def _handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = click.get_current_context().find_root().params.get("debug", False)
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise  # click prints usage errors itself, with their own exit code
        except SagaError as e:
            if debug:
                raise
            click.echo("error: " + " ".join(str(e).split()), err=True)
            sys.exit(e.exit_code)
        except Exception as e:  # the promise: one clear line, traceback only with --debug
            if debug:
                raise
            detail = " ".join(str(e).split())
            click.echo(f"error: {type(e).__name__}: {detail} (run with --debug for details)",
                       err=True)
            sys.exit(1)
    return wrapper


def _saga(tools: tuple[str, ...] = ()) -> Saga:
    return Saga(load_settings(), tools=tools)


def _emit_json(value: Any) -> None:
    click.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


tools_option = click.option("--tools", "tools", multiple=True, metavar="MODULE",
                            help="Import a Python module of tools (repeatable).")
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
mode_option = click.option("--mode", type=click.Choice(["normal", "eco"]), default="normal",
                           show_default=True, help="eco skips enhancement-layer steps.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.version_option(package_name="saga")
def main(debug: bool) -> None:
    """saga: durable sagas on an event-sourced log."""


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@tools_option
@json_option
@_handle_errors
def validate(file: str, tools: tuple[str, ...], as_json: bool) -> None:
    """Check a composition; print its execution levels and critical path."""
    saga = _saga(tools)
    try:
        plan = saga.load(file)
    except DefinitionError as e:
        if not as_json:
            raise
        _emit_json({"valid": False, "problems": [p.to_json() for p in e.problems]})
        sys.exit(e.exit_code)
    levels, critical = plan.levels(), plan.critical_path()
    if as_json:
        _emit_json({"valid": True, "name": plan.definition.name, "levels": levels,
                    "critical_path": critical, "steps": len(plan.order)})
        return
    click.echo(f"{file}: valid ({len(plan.order)} steps)")
    for i, level in enumerate(levels, 1):
        click.echo(f"  level {i}: {', '.join(level)}")
    click.echo(f"  critical path: {' -> '.join(critical)}")


def _parse_inputs(pairs: tuple[str, ...], inputs_file: str | None,
                  plan_inputs: dict[str, Any]) -> dict[str, Any]:
    given: dict[str, Any] = {}
    if inputs_file:
        try:
            data = parse_text(Path(inputs_file).read_text(encoding="utf-8"), inputs_file)
        except OSError as e:
            raise InputError([Problem("--inputs-file", f"cannot read: {e.strerror}")]) from e
        except DefinitionError as e:
            raise InputError([Problem("--inputs-file", "must be a JSON/YAML mapping")]) from e
        given.update(data)
    for pair in pairs:
        if "=" not in pair:
            raise InputError([Problem("--input", f"{pair!r} is not KEY=VALUE")])
        key, value = pair.split("=", 1)
        given[key] = coerce_text(plan_inputs.get(key), value)
    return given


def _run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options every command that starts a run shares."""
    for option in reversed([
        click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE",
                     help="An input value (repeatable); typed by the input's declared type."),
        click.option("--inputs-file", type=click.Path(dir_okay=False),
                     help="Inputs as JSON/YAML."),
        click.option("--actor", help="Who is running this (default: SAGA_ACTOR or the OS user)."),
        mode_option,
        click.option("--dry-run", is_flag=True, help="Show the plan and parameters; run nothing."),
        tools_option, json_option]):
        func = option(func)
    return func


def _run_file(saga: Saga, file: str, pairs: tuple[str, ...], inputs_file: str | None,
              actor: str | None, mode: str, dry_run: bool, as_json: bool) -> None:
    plan = saga.load(file)
    inputs = _parse_inputs(pairs, inputs_file, {s.name: s for s in plan.definition.inputs})
    if dry_run:
        _print_dry_run(saga.dry_run(plan, inputs), as_json)
        return
    with _Progress(enabled=not as_json) as progress:
        result = saga.run(plan, inputs, actor=actor, options={"mode": mode},
                          on_events=progress.update)
    _finish(result, as_json)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@_run_options
@_handle_errors
def run(file: str, pairs: tuple[str, ...], inputs_file: str | None, actor: str | None,
        mode: str, dry_run: bool, tools: tuple[str, ...], as_json: bool) -> None:
    """Start a run of FILE and drive it here until it finishes (or waits for approval)."""
    _run_file(_saga(tools), file, pairs, inputs_file, actor, mode, dry_run, as_json)


@main.group()
def templates() -> None:
    """Ready compositions in templates/ (and the folders in SAGA_TEMPLATES)."""


@templates.command(name="list")
@json_option
@_handle_errors
def templates_list(as_json: bool) -> None:
    """The templates, with their success rate and mean duration from past runs."""
    from saga.templates import list_templates, templates_stats

    saga = _saga()
    infos = list_templates(saga.settings)
    try:
        stats = templates_stats(saga, infos)
    except SagaError:
        stats = {}
    if as_json:
        _emit_json([info.to_json() | {"stats": stats.get(info.name)} for info in infos])
        return
    click.echo(f"{'NAME':<28} {'CATEGORY':<12} {'RUNS':>4} {'SUCCESS':>7} {'MEAN':>7}  "
               "DESCRIPTION")
    for info in infos:
        st = stats.get(info.name) or {}
        rate, mean = st.get("success_rate"), st.get("mean_duration_ms")
        click.echo(f"{info.name:<28} {info.category or '':<12} {st.get('runs', 0):>4} "
                   f"{'-' if rate is None else f'{rate:.0%}':>7} {_duration(mean):>7}  "
                   f"{(info.title or info.description or '')[:60]}")


def _duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s" if ms >= 1000 else f"{ms:.0f}ms"


@templates.command(name="show")
@click.argument("name")
@json_option
@_handle_errors
def templates_show(name: str, as_json: bool) -> None:
    """A template's description, inputs, needed configuration and statistics."""
    from saga.templates import find_template, read_template, template_stats

    saga = _saga()
    info = read_template(find_template(name, saga.settings))
    stats = template_stats(saga, name)
    if as_json:
        _emit_json(info.to_json() | {"stats": stats})
        return
    click.echo(f"{info.name}: {info.title or info.definition_name}  ({info.path})")
    click.echo(f"category: {info.category}   tags: {', '.join(info.tags or [])}")
    click.echo(f"tools: {', '.join(info.required_tools or [])}")
    if info.description:
        click.echo("\n" + info.description.strip())
    if info.inputs:
        click.echo("\ninputs:")
        for spec in info.inputs:
            required = "required" if spec.get("required") else f"default {spec.get('default')!r}"
            click.echo(f"  {spec['name']:<18} {spec.get('type', 'string'):<8} {required:<22} "
                       f"{spec.get('description', '')}")
    if info.config:
        click.echo("\nneeds in saga.toml:\n" + str(info.config).rstrip())
    if info.example:
        click.echo("\nexample: " + str(info.example).strip())
    rate = stats.get("success_rate")
    click.echo(f"\nruns: {stats.get('runs', 0)}, success "
               f"{'-' if rate is None else f'{rate:.0%}'}, mean "
               f"{_duration(stats.get('mean_duration_ms'))}")


@templates.command(name="run")
@click.argument("name")
@_run_options
@_handle_errors
def templates_run(name: str, pairs: tuple[str, ...], inputs_file: str | None, actor: str | None,
                  mode: str, dry_run: bool, tools: tuple[str, ...], as_json: bool) -> None:
    """Run the template NAME here, like saga run."""
    from saga.templates import find_template

    saga = _saga(tools)
    path = find_template(name, saga.settings)
    _run_file(saga, str(path), pairs, inputs_file, actor, mode, dry_run, as_json)


@main.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE",
              help="An input value (repeatable); typed by the input's declared type.")
@click.option("--inputs-file", type=click.Path(dir_okay=False), help="Inputs as JSON/YAML.")
@click.option("--actor", help="Who is submitting this (default: SAGA_ACTOR or the OS user).")
@mode_option
@tools_option
@json_option
@_handle_errors
def submit(file: str, pairs: tuple[str, ...], inputs_file: str | None, actor: str | None,
           mode: str, tools: tuple[str, ...], as_json: bool) -> None:
    """Record a run of FILE without executing it; a worker will pick it up."""
    saga = _saga(tools)
    plan = saga.load(file)
    inputs = _parse_inputs(pairs, inputs_file, {s.name: s for s in plan.definition.inputs})
    run = saga.submit(plan, inputs, actor=actor, options={"mode": mode})
    if as_json:
        _emit_json({"run_id": run.run_id, "status": run.status, "name": run.name})
    else:
        click.echo(run.run_id)


@main.command()
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Runs driven at once.")
@click.option("--until-idle", is_flag=True, help="Exit when nothing is runnable.")
@click.option("--id", "worker_id", help="This worker's name (default host:pid).")
@click.option("--lease", "lease_seconds", type=click.FloatRange(0.5, 3600),
              help="Lease length in seconds (default SAGA_LEASE_SECONDS or 30).")
@click.option("--poll", type=click.FloatRange(0.05, 60), default=0.5, show_default=True,
              help="Seconds between looks for new work.")
@tools_option
@_handle_errors
def worker(concurrency: int, until_idle: bool, worker_id: str | None,
           lease_seconds: float | None, poll: float, tools: tuple[str, ...]) -> None:
    """Claim runnable runs and drive them (new, interrupted, approved, redriven)."""
    import signal

    saga = _saga(tools)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    w = saga.worker_loop(worker_id=worker_id, concurrency=concurrency, poll_interval=poll,
                         lease_seconds=lease_seconds or saga.settings.lease_seconds)
    click.echo(f"worker {w.worker_id} on {saga.settings.store_description}", err=True)
    try:
        driven = w.run(until_idle=until_idle, stop=lambda: bool(stopping))
    except KeyboardInterrupt:
        driven = w.driven
    click.echo(f"worker {w.worker_id} stopped after {driven} drives", err=True)


@main.command()
@click.argument("run_id")
@tools_option
@json_option
@_handle_errors
def resume(run_id: str, tools: tuple[str, ...], as_json: bool) -> None:
    """Continue an unfinished run here (after an approval, or when it was interrupted)."""
    saga = _saga(tools)
    with _Progress(enabled=not as_json) as progress:
        result = saga.resume(run_id, on_events=progress.update)
    _finish(result, as_json)


def _undo_command(name: str, doc: str) -> None:
    @main.command(name=name, help=doc)
    @click.argument("run_id")
    @click.option("--reason", help="Why (recorded).")
    @click.option("--actor", help="Who (default: SAGA_ACTOR or the OS user).")
    @tools_option
    @json_option
    @_handle_errors
    def command(run_id: str, reason: str | None, actor: str | None, tools: tuple[str, ...],
                as_json: bool) -> None:
        saga = _saga(tools)
        with _Progress(enabled=not as_json) as progress:
            if name == "retry":
                result = saga.retry(run_id, actor=actor, on_events=progress.update)
            else:
                method = saga.cancel if name == "cancel" else saga.compensate
                result = method(run_id, actor=actor, reason=reason, on_events=progress.update)
        intended = {"retry": ("completed", "waiting"), "compensate": ("compensated",),
                    "cancel": ("cancelled",)}[name]
        _finish(result, as_json, intended)


_undo_command("retry", "Redrive a failed run from its failed steps, keeping completed work.")
_undo_command("compensate", "Undo a run's completed steps, in reverse completion order.")
_undo_command("cancel", "Cancel an unfinished run: undo its completed steps, record who.")


@main.command()
@click.argument("run_id")
@click.option("--verify", is_flag=True, help="Check the scheduler reproduces every decision.")
@click.option("--at", help="Show the run as it was at a version number or an ISO time.")
@json_option
@_handle_errors
def replay(run_id: str, verify: bool, at: str | None, as_json: bool) -> None:
    """Replay a run's history: verify its decisions, or show it at a point in time."""
    saga = _saga()
    if not verify and at is None:
        raise click.UsageError("give --verify or --at")
    if at is not None:
        summary = run_summary(saga.state_at(run_id, at))
        _emit_json(summary) if as_json else _print_summary(summary)
    if verify:
        divergence = saga.verify(run_id)
        if as_json:
            _emit_json({"run_id": run_id, "ok": divergence is None,
                        "divergence": None if divergence is None else {
                            "version": divergence.version, "event": divergence.event_type,
                            "recorded": divergence.recorded, "expected": divergence.expected}})
        elif divergence is None:
            click.echo(f"run {run_id}: replay reproduces every recorded decision")
        else:
            click.echo(f"run {run_id}: {divergence}")
        if divergence is not None:
            sys.exit(1)


@main.group()
def audit() -> None:
    """Tamper checks on the event log: each run's hash chain (and macs, with a key)."""


@audit.command(name="verify")
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@click.option("--all", "all_runs", is_flag=True, help="Verify every run in the store.")
@click.option("--file", "file", type=click.Path(dir_okay=False),
              help="Verify an export (saga export) offline, without the store.")
@click.option("--head", help="A head known from before (an export's or an earlier verify's): "
                             "the chain must still contain it (catches a deleted tail).")
@json_option
@_handle_errors
def audit_verify(run_ids: tuple[str, ...], all_runs: bool, file: str | None, head: str | None,
                 as_json: bool) -> None:
    """Verify runs' audit chains: exit 0 when all verify, 1 when one is broken."""
    settings = load_settings()
    key = audit_log.audit_key(settings)
    if file is not None:
        if run_ids or all_runs:
            raise click.UsageError("--file verifies the file alone: give no RUN and no --all")
        try:
            text = Path(file).read_text(encoding="utf-8")
            results = [audit_log.verify_export(text, key, head)]
        except (OSError, ValueError) as e:
            raise click.UsageError(f"{file}: {e}") from None
    else:
        if bool(run_ids) == all_runs:
            raise click.UsageError("give RUN ... or --all")
        if head and len(run_ids) != 1:
            raise click.UsageError("--head applies to exactly one RUN")
        results = audit_log.verify_store(settings, None if all_runs else list(run_ids), key,
                                         {run_ids[0]: head} if head else None)
    ok = all(r.ok for r in results)
    if as_json:
        _emit_json({"ok": ok, "keyed": key is not None, "runs": [r.to_json() for r in results]})
    else:
        for r in results:
            click.echo(str(r))
        if all_runs:
            broken = sum(not r.ok for r in results)
            click.echo(f"{len(results)} runs checked, {broken} broken")
        if key is None:
            click.echo("note: SAGA_AUDIT_KEY is not set: macs were not checked, so a chain "
                       "rewritten end to end would pass", err=True)
    if not ok:
        sys.exit(1)


@main.command(name="export")
@click.argument("run_id")
@click.option("--format", "fmt", type=click.Choice(["json", "jsonl"]), default="json",
              show_default=True, help="One JSON document, or one event per line.")
@_handle_errors
def export(run_id: str, fmt: str) -> None:
    """Print a run's complete, verifiable history (check it with saga audit verify --file)."""
    click.echo(audit_log.export_run(load_settings(), run_id, fmt), nl=False)


@main.command(name="report")
@click.option("--since", metavar="DATE", help="Runs started at or after this date or ISO time "
              "(UTC when no offset is given).")
@click.option("--until", metavar="DATE", help="Runs started before this date or ISO time.")
@click.option("--definition", metavar="NAME", help="Only runs of this composition.")
@click.option("--actor", metavar="A", help="Only runs this person started or acted on.")
@click.option("--status", "status_filter", type=click.Choice(RUN_STATUSES),
              help="Only runs with this status.")
@click.option("--format", "fmt", type=click.Choice(["md", "csv", "json", "html"]), default="md",
              show_default=True, help="md and html for people, json for everything, csv one "
                                      "row per run.")
@click.option("--output", "-o", type=click.Path(dir_okay=False, writable=True),
              help="Write the report to FILE instead of standard output.")
@_handle_errors
def report_command(since: str | None, until: str | None, definition: str | None,
                   actor: str | None, status_filter: str | None, fmt: str,
                   output: str | None) -> None:
    """A compliance report: outcomes, failures, compensations, durations, who did what, and
    whether each run's audit chain verifies."""
    from saga.report import build_report, parse_moment, render

    for name, value in (("--since", since), ("--until", until)):
        try:  # checked here so a bad bound is a usage error (exit 2), not a failure
            parse_moment(value, name)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    with _saga() as saga:
        built = build_report(saga, since=since, until=until, definition=definition,
                             actor=actor, status=status_filter)
    text = render(built, fmt)
    if output is None:
        click.echo(text, nl=False)
        return
    # newline="": the csv module already wrote its own line ends.
    Path(output).write_text(text, encoding="utf-8", newline="")
    click.echo(f"wrote {output} ({built.summary['runs']} runs)", err=True)


@main.group()
def retention() -> None:
    """Remove user data from old finished runs, keeping their audit chains verifiable."""


@retention.command(name="apply")
@click.option("--older-than", "days", type=click.FloatRange(min=0), required=True,
              metavar="DAYS", help="Finished runs whose last event is older than this.")
@click.option("--dry-run", is_flag=True, help="Only list the runs that would be redacted.")
@json_option
@_handle_errors
def retention_apply(days: float, dry_run: bool, as_json: bool) -> None:
    """Redact inputs, parameters and outputs of finished runs older than DAYS."""
    ids = audit_log.apply_retention(load_settings(), days, dry_run=dry_run)
    if as_json:
        _emit_json({"dry_run": dry_run, "older_than_days": days, "runs": ids})
        return
    for run_id in ids:
        click.echo(f"{'would redact' if dry_run else 'redacted'} {run_id}")
    verb = "would be redacted" if dry_run else "redacted"
    click.echo(f"{len(ids)} run(s) {verb} (finished more than {days:g} days ago)")


@main.group()
def projection() -> None:
    """The read model: tables saga_runs and saga_steps, maintained from the log."""


@projection.command(name="run")
@click.option("--follow", is_flag=True, help="Keep applying new events until interrupted.")
@click.option("--poll", type=click.FloatRange(0.05, 60), default=0.5, show_default=True)
@_handle_errors
def projection_run(follow: bool, poll: float) -> None:
    """Apply the events the read model has not seen yet (and, with --follow, keep going)."""
    import signal

    saga = _saga()
    applied = saga.projection.catch_up()
    click.echo(f"applied {applied} events; position {saga.projection.position()}", err=True)
    if follow:
        stopping: list[int] = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        with contextlib.suppress(KeyboardInterrupt):
            saga.projection.follow(poll_interval=poll, stop=lambda: bool(stopping))
        click.echo(f"stopped at position {saga.projection.position()}", err=True)


@projection.command(name="rebuild")
@_handle_errors
def projection_rebuild() -> None:
    """Drop the read model and rebuild it from the first event."""
    saga = _saga()
    applied = saga.projection.rebuild()
    click.echo(f"rebuilt from {applied} events; position {saga.projection.position()}")


@main.group()
def db() -> None:
    """The store's tables."""


@db.command(name="init")
@_handle_errors
def db_init() -> None:
    """Create every table once (run it before starting many workers at once)."""
    saga = _saga()
    saga.leases  # noqa: B018 - creating the store and its side tables is the point
    saga.projection.create_tables()
    click.echo(f"initialised {saga.settings.store_description}")


def _print_dry_run(preview: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _emit_json(preview)
        return
    click.echo(f"dry run of {preview['name']} (nothing is recorded, no tool is called)")
    for i, level in enumerate(preview["levels"], 1):
        click.echo(f"  level {i}: {', '.join(level)}")
    for step in preview["steps"]:
        what = step["tool"] or (f"use {step['use']}" if step["use"] else "compute")
        notes = [f"when {step['when']}"] if step["when"] else []
        notes += ["for each"] if step["loop"] is not None else []
        notes += ["asks for approval"] if step["approval"] else []
        notes += ["compensated"] if step["compensate"] else []
        click.echo(f"  {step['id']}: {what} {json.dumps(step['parameters'], default=str)}"
                   + (f"  [{'; '.join(notes)}]" if notes else ""))


@main.command()
@click.argument("target")
@click.option("--format", "fmt", type=click.Choice(["mermaid", "dot"]), default="mermaid",
              show_default=True)
@tools_option
@_handle_errors
def graph(target: str, fmt: str, tools: tuple[str, ...]) -> None:
    """Draw a composition FILE, or a RUN with its steps coloured by status."""
    from saga import diagram
    from saga.executor import plan_for

    saga = _saga(tools)
    if Path(target).exists():
        plan, run = saga.load(target), None
    else:
        run = saga.get(target)
        plan = plan_for(run)
    click.echo((diagram.mermaid if fmt == "mermaid" else diagram.dot)(plan, run), nl=False)


def _finish(run: Run, as_json: bool, success: tuple[str, ...] = ("completed", "waiting")) -> None:
    """Print the run and exit: 0 when it ended as the command intended, else 1."""
    summary = run_summary(run)
    if as_json:
        _emit_json(summary)
    else:
        _print_summary(summary)
    sys.exit(0 if run.status in success else 1)


@main.command()
@click.argument("run_id")
@json_option
@_handle_errors
def status(run_id: str, as_json: bool) -> None:
    """Show a run's status and its steps (read from the run's own history)."""
    summary = _saga().status(run_id)
    if as_json:
        _emit_json(summary)
    else:
        _print_summary(summary)


@main.command(name="list")
@click.option("--status", "status_filter", help="Only runs with this status.")
@click.option("--since", help="Only runs started at or after this ISO time.")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="At most this many runs (0: all).")
@json_option
@_handle_errors
def list_runs(status_filter: str | None, since: str | None, limit: int, as_json: bool) -> None:
    """List runs, newest first, from the read model (caught up first)."""
    saga = _saga()
    runs = saga.list_runs(status_filter, limit, since)
    lag = saga.lag()
    if lag:
        click.echo(f"note: the read model is {lag} events behind the log", err=True)
    if as_json:
        _emit_json(runs)
        return
    if not runs:
        click.echo("no runs")
    for r in runs:
        click.echo(f"{r['run_id']}  {r['status']:<12} {r['name']:<30} {r['started_at']}")


@main.command()
@click.argument("run_id")
@json_option
@_handle_errors
def history(run_id: str, as_json: bool) -> None:
    """Print every event of a run, in order."""
    events = _saga().history(run_id)
    if as_json:
        _emit_json(events)
        return
    for e in events:
        detail = _event_detail(e)
        click.echo(f"{e['version']:>4}  {e['timestamp']}  {e['type']:<20} {detail}")


def _event_detail(e: dict[str, Any]) -> str:
    p = e["payload"]
    parts = []
    if "step_id" in p:
        parts.append(p["step_id"] + (f"[{p['iteration']}]" if p.get("iteration") else ""))
    for key in ("attempt", "reason", "error_type", "message", "steps", "comment", "actor"):
        if p.get(key) not in (None, "", []):
            parts.append(f"{key}={p[key]}")
    if e["type"] == "RunStarted":
        parts.append(f"{p['definition'].get('name')} by {p['context'].get('actor')}")
    if "output" in p and e["type"] == "StepCompleted":
        parts.append(f"output={json.dumps(p['output'], default=str)[:80]}")
    return " ".join(str(x) for x in parts)


def _decision_command(name: str, approved: bool, doc: str) -> None:
    @main.command(name=name, help=doc)
    @click.argument("run_id")
    @click.argument("step_id")
    @click.option("--comment", help="Recorded with the decision.")
    @click.option("--actor", help="Who decides (default: SAGA_ACTOR or the OS user).")
    @_handle_errors
    def command(run_id: str, step_id: str, comment: str | None, actor: str | None) -> None:
        s = _saga()
        decide = s.approve if approved else s.reject
        run = decide(run_id, step_id, actor=actor, comment=comment)
        click.echo(f"{step_id} {name}d on run {run.run_id}; continue it with: "
                   f"saga resume {run.run_id}")


_decision_command("approve", True, "Approve a step that waits for confirmation.")
_decision_command("reject", False, "Reject a step that waits for confirmation (it fails and "
                                   "follows its on_error).")


@main.command()
@tools_option
@json_option
@_handle_errors
def tools(tools: tuple[str, ...], as_json: bool) -> None:
    """List the available tools."""
    registry = _saga(tools).registry
    rows = [{"name": t.name, "source": t.source, "description": t.description,
             "compensation": t.compensate is not None, "params": t.params} for t in registry]
    if as_json:
        _emit_json(rows)
        return
    for row in rows:
        click.echo(f"{row['name']:<24} {row['source']:<28} {row['description']}")


def _print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    style = _STATUS_STYLE.get(summary["status"], "")
    console.print(f"run {summary['run_id']} ({summary['name']}): [{style}]{summary['status']}[/]")
    table = Table(show_header=True, header_style="bold", box=None)
    for column in ("step", "status", "attempts", "ms", "detail"):
        table.add_column(column)
    for key, s in summary.get("steps", {}).items():
        detail = (s.get("error") or {}).get("message") or s.get("reason") or ""
        if s.get("approval", {}).get("status") == "requested":
            detail = f"waiting for approval: {s['approval']['message']}"
        st = s.get("status", "")
        table.add_row(key, f"[{_STATUS_STYLE.get(st, '')}]{st}[/]", str(s.get("attempt", "")),
                      str(s.get("duration_ms", "") or ""), str(detail))
    console.print(table)
    if summary.get("error"):
        console.print(f"error: {summary['error'].get('message', summary['error'])}")
    if summary.get("outputs") is not None and summary["status"] == "completed":
        console.print("outputs: " + json.dumps(summary["outputs"], default=str,
                                               ensure_ascii=False))
    for child in summary.get("children", []):
        console.print(f"  └ step {child['step']}: child run {child['run_id']} "
                      f"({child['name']}): {child['status']}")
    if summary.get("waiting_for"):
        for step in summary["waiting_for"]:
            console.print(f"waiting: saga approve {summary['run_id']} {step}")


class _Progress:
    """Live progress on a terminal; silent otherwise (the summary follows either way)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stdout.isatty()
        self._live: Any = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from rich.live import Live

            self._live = Live(refresh_per_second=8, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)

    def update(self, run: Run, events: list[Any]) -> None:
        """Redraw the step table after each commit."""
        if self._live is None:
            return
        from rich.table import Table

        table = Table(title=f"{run.name} — {run.status}", box=None)
        table.add_column("step")
        table.add_column("status")
        table.add_column("attempt")
        for key, s in run.steps.items():
            st = s["status"]
            table.add_row(key, f"[{_STATUS_STYLE.get(st, '')}]{st}[/]", str(s["attempt"]))
        self._live.update(table)


if __name__ == "__main__":  # pragma: no cover
    main()
