"""Commands on runs: validate, run, submit, resume, retry, compensate, cancel, replay,
graph, status, list, history, approve and reject."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from saga.api import Saga
from saga.cli.app import (
    FilePath,
    _emit_json,
    _saga,
    json_option,
    main,
    mode_option,
    note,
    tools_option,
)
from saga.cli.render import (
    _ago,
    _clock,
    _event_detail,
    _finish,
    _print_dry_run,
    _print_summary,
    _Progress,
)
from saga.composition.definition import coerce_text, parse_text
from saga.domain import RUN_STATUSES, TERMINAL, Run
from saga.errors import DefinitionError, InputError, Problem, SagaError
from saga.executor import recorded_modules
from saga.store.leases import lease_key
from saga.views import run_summary


@main.command()
@click.argument("file", type=FilePath())
@tools_option
@json_option
def validate(file: str, tools: tuple[str, ...], as_json: bool) -> None:
    """Check a composition; print its execution levels and critical path.

    \b
    Example:
      saga validate deploy.yaml --json
    """
    saga = _saga(tools)
    try:
        plan = saga.load(file)
    except DefinitionError as e:
        if not as_json:
            raise
        _emit_json({"valid": False, "problems": [p.to_json() for p in e.problems]})
        sys.exit(e.exit_code)
    levels, critical, undo = plan.levels(), plan.critical_path(), plan.rollback_plan()
    if as_json:
        _emit_json({"valid": True, "definition": plan.definition.name,
                    "name": plan.definition.name, "levels": levels,
                    "critical_path": critical, "steps": len(plan.order), "rollback": undo})
        return
    click.echo(f"{file}: valid ({len(plan.order)} steps)")
    for i, level in enumerate(levels, 1):
        click.echo(f"  level {i}: {', '.join(level)}")
    click.echo(f"  critical path: {' -> '.join(critical)}")
    click.echo("  on rollback, in reverse completion order:")
    for step_id, how in undo.items():
        click.echo(f"    {step_id}: {'undone by ' + how if how else 'not undone'}")


def _parse_inputs(pairs: tuple[str, ...], inputs_file: str | None,
                  plan_inputs: dict[str, Any]) -> dict[str, Any]:
    given: dict[str, Any] = {}
    if inputs_file:
        try:
            data = parse_text(Path(inputs_file).read_text(encoding="utf-8"), inputs_file)
        except UnicodeDecodeError as e:
            raise InputError([Problem("--inputs-file", f"not UTF-8 text: {e.reason}")]) from e
        except OSError as e:
            raise InputError([Problem("--inputs-file", f"cannot read: {e.strerror}")]) from e
        except DefinitionError as e:
            raise InputError([Problem("--inputs-file", "must be a JSON/YAML mapping")]) from e
        given.update(data)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError([Problem("--input", f"{pair!r} is not KEY=VALUE (with a name)")])
        given[key] = coerce_text(plan_inputs.get(key), value)
    return given


def _start_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options every command that starts a run shares (run, submit, templates run)."""
    for option in reversed([
        click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE",
                     help="An input value (repeatable); typed by the input's declared type."),
        click.option("--inputs-file", type=FilePath(),
                     help="Inputs as JSON/YAML."),
        click.option("--actor", help="Who is running this (default: SAGA_ACTOR or the OS user)."),
        click.option("--id", "--workflow-id", "run_id", metavar="ID",
                     help="The run's id, chosen by you (e.g. ORDER-42): starting it again with "
                          "the same definition and inputs returns the same run."),
        click.option("--label", "label_pairs", multiple=True, metavar="KEY=VALUE",
                     help="A label recorded with the run (repeatable); list and report "
                          "filter by it."),
        click.option("--queue", metavar="NAME",
                     help="The queue workers claim the run from (default: the "
                          "composition's queue, else 'default'); saga.toml limits queues."),
        click.option("--priority", type=click.IntRange(-1_000_000, 1_000_000), default=None,
                     help="Claimed before runs of lower priority in its queue (default 0)."),
        mode_option, tools_option, json_option]):
        func = option(func)
    return func


def _run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`_start_options`, plus what only runs started here take."""
    func = click.option("--validate-only", is_flag=True,
                        help="Check the composition and inputs; run nothing (seed 004).")(func)
    func = click.option("--dry-run", is_flag=True,
                        help="Show the plan and parameters; run nothing.")(func)
    return _start_options(func)


def _labels(pairs: tuple[str, ...]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError([Problem("--label", f"{pair!r} is not KEY=VALUE")])
        labels[key] = value
    return labels


def _run_file(saga: Saga, file: str, options: dict[str, Any]) -> None:
    plan = saga.load(file)
    inputs = _parse_inputs(options["pairs"], options["inputs_file"],
                           {s.name: s for s in plan.definition.inputs})
    as_json = options["as_json"]
    if options.get("validate_only"):
        _emit_json({"valid": True, "definition": plan.definition.name,
                    "name": plan.definition.name}) if as_json else \
            click.echo(f"{file}: valid ({len(plan.order)} steps); nothing was run")
        return
    if options.get("dry_run"):
        _print_dry_run(saga.dry_run(plan, inputs), as_json)
        return
    progress = _Progress(enabled=not as_json)
    try:
        with progress:
            result = saga.run(plan, inputs, actor=options["actor"],
                              options={"mode": options["mode"]}, run_id=options["run_id"],
                              labels=_labels(options["label_pairs"]),
                              on_events=progress.update, queue=options["queue"],
                              priority=options["priority"])
    except KeyboardInterrupt:
        _interrupted(saga, progress.recorded or options["run_id"])
        sys.exit(130)  # the shell's code for a command ended by SIGINT
    _finish(result, as_json)


def _interrupted(saga: Saga, run_id: str | None) -> None:
    """Ctrl-C in ``saga run``: say what was left and where, and how to go on, instead of
    click's bare "Aborted!". The run is durable: what it recorded stays, and a worker (or
    ``saga resume``) continues it from there."""
    try:
        summary = saga.status(run_id) if run_id else None
    except (SagaError, OSError):
        summary = None
    if summary is None:
        note("interrupted: " + (f"run {run_id} was not found in the store" if run_id else
                                "before the run was recorded; nothing was left"))
        return
    state = summary["status"]
    if state in TERMINAL:
        note(f"interrupted: run {run_id} ({summary['name']}) had already ended: {state}")
        return
    started = [k for k, s in summary.get("steps", {}).items() if s.get("status") == "running"]
    where = f", steps in flight: {', '.join(started)}" if started else ""
    note(f"interrupted: run {run_id} ({summary['name']}) is left {state}{where}; "
         f"what it recorded stays in {saga.settings.store_description}")
    note(f"  continue it: saga resume {run_id} (or let a worker take it: saga worker)")
    note(f"  undo it: saga cancel {run_id}   see it: saga status {run_id}")


@main.command()
@click.argument("file", type=FilePath())
@_run_options
def run(file: str, **options: Any) -> None:
    """Start a run of FILE (a file or a template's name) and drive it here until it
    finishes (or waits).

    \b
    Example:
      saga run quickstart --id ORDER-42 --label team=payments -i fail_at=ship
    """
    _run_file(_saga(options["tools"]), file, options)


@main.command(name="run-graph")
@click.argument("workflow_file", type=FilePath())
@_run_options
def run_graph(workflow_file: str, **options: Any) -> None:
    """Seed 004's spelling of saga run: run WORKFLOW_FILE here.

    \b
    Example:
      saga run-graph debug_loop.yaml --workflow-id DEBUG-1 -i input="login fails"
      saga run-graph debug_loop.yaml --validate-only
    """
    _run_file(_saga(options["tools"]), workflow_file, options)


@main.command()
@click.argument("file", type=FilePath())
@_start_options
def submit(file: str, **options: Any) -> None:
    """Record a run of FILE without executing it; a worker will pick it up.

    \b
    Example:
      saga submit quickstart --id ORDER-42 --json && saga worker --until-idle
      saga submit report.yaml --queue reports --priority 10
    """
    saga = _saga(options["tools"])
    plan = saga.load(file)
    inputs = _parse_inputs(options["pairs"], options["inputs_file"],
                           {s.name: s for s in plan.definition.inputs})
    run = saga.submit(plan, inputs, actor=options["actor"], options={"mode": options["mode"]},
                      run_id=options["run_id"], labels=_labels(options["label_pairs"]),
                      queue=options["queue"], priority=options["priority"])
    if options["as_json"]:
        _emit_json({"run_id": run.run_id, "status": run.status, "definition": run.name,
                    "name": run.name})
    else:
        click.echo(run.run_id)


@main.command()
@click.argument("run_id")
@tools_option
@json_option
def resume(run_id: str, tools: tuple[str, ...], as_json: bool) -> None:
    """Continue an unfinished run here (after an approval, or when it was interrupted).

    \b
    Example:
      saga approve ORDER-42 pay && saga resume ORDER-42
    """
    saga = _saga(tools)
    with _Progress(enabled=not as_json) as progress:
        result = saga.resume(run_id, on_events=progress.update)
    _finish(result, as_json)


def _undo_command(name: str, doc: str) -> None:
    @main.command(name=name, help=doc)
    @click.argument("run_id", required=False)
    @click.option("--reason", help="Why (recorded).")
    @click.option("--actor", help="Who (default: SAGA_ACTOR or the OS user).")
    @click.option("--definition", help="Every matching run of this composition (bulk).")
    @click.option("--failed-step", help="Bulk: only runs that failed at this step.")
    @click.option("--label", "label_pairs", multiple=True, metavar="KEY=VALUE",
                  help="Bulk: only runs with this label (repeatable).")
    @click.option("--since", help="Bulk: only runs started at or after this ISO time.")
    @click.option("--dry-run", is_flag=True, help="Bulk: list the runs; change nothing.")
    @tools_option
    @json_option
    def command(run_id: str | None, reason: str | None, actor: str | None,
                definition: str | None, failed_step: str | None,
                label_pairs: tuple[str, ...], since: str | None, dry_run: bool,
                tools: tuple[str, ...], as_json: bool) -> None:
        saga = _saga(tools)
        bulk = definition or failed_step or label_pairs or since
        if run_id is None and not bulk:
            raise click.UsageError(f"give a RUN, or filters (--definition, --failed-step, "
                                   f"--label, --since) to {name} many runs at once")
        if run_id is not None and (bulk or dry_run):
            raise click.UsageError("give a RUN or bulk filters, not both")
        if run_id is None:
            _bulk(saga, name, actor, reason, dry_run, as_json, definition=definition,
                  failed_step=failed_step, labels=_labels(label_pairs), since=since)
            return
        with _Progress(enabled=not as_json) as progress:
            if name == "retry":
                result = saga.retry(run_id, actor=actor, reason=reason,
                                    on_events=progress.update)
            else:
                method = saga.cancel if name == "cancel" else saga.compensate
                result = method(run_id, actor=actor, reason=reason, on_events=progress.update)
        intended = {"retry": ("completed", "waiting"), "compensate": ("compensated",),
                    "cancel": ("cancelled",)}[name]
        if result.status not in intended and result.status in ("running", "compensating"):
            # Recorded, and under way in another driver (a live worker held the run past
            # the command's wait for its lease): the command stands, it did not fail.
            _handed_over(saga, result, name)
            intended = (result.status,)
        _finish(result, as_json, intended)


def _handed_over(saga: Saga, run: Run, name: str) -> None:
    """Say (on stderr) who carries out a command this process recorded but did not
    drive, and how to follow the run."""
    held = saga.leases.holder(lease_key(str(run.id)))
    doing = "driving" if name == "retry" else "undoing"
    who = f"the worker holding the run ({held[0]}) is {doing} it" if held else \
        "a worker carries it out"
    click.echo(f"{name} recorded; {who}. Follow it: saga watch {run.run_id} "
               f"(or saga status {run.run_id})", err=True)


def _bulk(saga: Saga, name: str, actor: str | None, reason: str | None, dry_run: bool,
          as_json: bool, **filters: Any) -> None:
    """Retry or cancel every matching run: record the command on each; workers continue
    them (the repair after a downstream outage)."""
    if name == "compensate":
        raise click.UsageError("compensate takes one RUN")
    statuses = ("failed",) if name == "retry" else ("running", "waiting", "paused")
    chosen = saga.select(statuses=statuses, **filters)
    done, refused = [], []
    for run_id in chosen:
        if dry_run:
            continue
        try:
            if name == "retry":
                saga.retry(run_id, actor=actor, reason=reason, drive=False)
            else:
                saga.cancel(run_id, actor=actor, reason=reason, drive=False)
            done.append(run_id)
        except SagaError as e:  # one run in the wrong state must not stop the others
            refused.append({"run_id": run_id, "error": str(e)})
    if as_json:
        _emit_json({"matched": chosen, "changed": done, "refused": refused,
                    "dry_run": dry_run})
        return
    verb = {"retry": "retried", "cancel": "cancelled"}[name]
    for run_id in chosen:
        click.echo(run_id)
    click.echo(f"{len(chosen)} runs matched; " + (
        "nothing changed (dry run)" if dry_run else
        f"{len(done)} {verb} (workers continue them), {len(refused)} refused"))


_undo_command("retry", "Redrive a failed run from its failed steps, keeping completed work; "
                       "or, with filters, every matching failed run.\n\n\b\nExample:\n"
                       "  saga retry ORDER-42\n"
                       "  saga retry --definition payments --failed-step charge "
                       "--since 2026-11-01")
_undo_command("compensate", "Undo a run's completed steps, in reverse completion order."
                            "\n\n\b\nExample:\n  saga compensate ORDER-42 --reason "
                            "'customer withdrew'")
_undo_command("cancel", "Cancel an unfinished run: undo its completed steps, record who; or, "
                        "with filters, every matching unfinished run.\n\n\b\nExample:\n"
                        "  saga cancel ORDER-42 --reason 'duplicate order'\n"
                        "  saga cancel --definition payments --label team=payments --dry-run")


@main.command()
@click.argument("run_id")
@click.option("--verify", is_flag=True, help="Check the scheduler reproduces every decision.")
@click.option("--at", help="Show the run as it was at a version number or an ISO time.")
@json_option
def replay(run_id: str, verify: bool, at: str | None, as_json: bool) -> None:
    """Replay a run's history: verify its decisions, or show it at a point in time.

    \b
    Example:
      saga replay ORDER-42 --verify
      saga replay ORDER-42 --at 5 --json
    """
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


@main.command()
@click.argument("run_id")
@json_option
def status(run_id: str, as_json: bool) -> None:
    """Show a run's status and its steps (read from the run's own history).

    \b
    Example:
      saga status ORDER-42 --json
    """
    summary = _saga().status(run_id)
    if as_json:
        _emit_json(summary)
    else:
        _print_summary(summary)


@main.command(name="list")
@click.option("--status", "status_filter", type=click.Choice(RUN_STATUSES),
              help="Only runs with this status.")
@click.option("--definition", help="Only runs of this composition (its name).")
@click.option("--actor", help="Only runs started by this actor.")
@click.option("--label", "label_pairs", multiple=True, metavar="KEY=VALUE",
              help="Only runs with this label (repeatable: all must match).")
@click.option("--since", help="Only runs started at or after this ISO time.")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True,
              help="At most this many runs (0: all).")
@json_option
def list_runs(status_filter: str | None, definition: str | None, actor: str | None,
              label_pairs: tuple[str, ...], since: str | None, limit: int,
              as_json: bool) -> None:
    """List runs, newest first, from the read model (caught up first).

    \b
    Example:
      saga list --status failed --label team=payments --json
    """
    saga = _saga()
    runs = saga.list_runs(status_filter, limit, since, definition=definition, actor=actor,
                          labels=_labels(label_pairs))
    lag = saga.lag()
    if lag:
        note(f"note: the read model is {lag} events behind the log")
    if as_json:
        _emit_json(runs)
        return
    if not runs:
        click.echo("no runs")
        return
    ids = _short_ids([r["run_id"] for r in runs])
    width = max(len(i) for i in ids)
    click.echo(f"{'RUN':<{width}} {'STATUS':<12} {'DEFINITION':<22} {'ACTOR':<12} STARTED")
    for r, run_id in zip(runs, ids, strict=True):
        click.echo(f"{run_id:<{width}} {r['status']:<12} {_cut(r['definition'], 22):<22} "
                   f"{_cut(r['actor'] or '', 12):<12} {_ago(r['started_at'])}")


def _short_ids(run_ids: list[str]) -> list[str]:
    """Run ids as ``saga list`` shows them, so a row fits 80 columns: a generated id
    (a UUID) by its first 8 characters, more while two shown ones share them, as every
    command finds a run by a unique prefix; a chosen id as it is, up to 20 characters."""
    size = 8
    while size < 36 and len({i[:size] for i in run_ids if _generated(i)}) < \
            len({i for i in run_ids if _generated(i)}):
        size += 4
    return [i[:size] if _generated(i) else _cut(i, 20) for i in run_ids]


def _generated(run_id: str) -> bool:
    return len(run_id) == 36 and run_id.count("-") == 4


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


@main.command()
@click.argument("run_id")
@json_option
def history(run_id: str, as_json: bool) -> None:
    """Print every event of a run, in order.

    \b
    Example:
      saga history ORDER-42 --json
    """
    events = _saga().history(run_id)
    if as_json:
        _emit_json(events)
        return
    for e in events:
        detail = _event_detail(e)
        click.echo(f"{e['version']:>4}  {_clock(e['timestamp'])}  {e['type']:<20} {detail}")


def _decision_command(name: str, approved: bool, doc: str) -> None:
    @main.command(name=name, help=doc)
    @click.argument("run_id")
    @click.argument("step_id")
    @click.option("--comment", help="Recorded with the decision.")
    @click.option("--actor", help="Who decides (default: SAGA_ACTOR or the OS user).")
    @json_option
    def command(run_id: str, step_id: str, comment: str | None, actor: str | None,
                as_json: bool) -> None:
        s = _saga()
        decide = s.approve if approved else s.reject
        run = decide(run_id, step_id, actor=actor, comment=comment)
        done = {"approve": "approved", "reject": "rejected"}[name]
        if as_json:
            _emit_json({"run_id": run.run_id, "step_id": step_id, "decision": done,
                        "status": run.status})
            return
        given = [f" --tools {m}" for m in _started_with(s, run) if m not in s.settings.tools]
        click.echo(f"{step_id} {done} on run {run.run_id}; continue it with: "
                   f"saga resume {run.run_id}{''.join(given)}")


def _started_with(s: Saga, run: Run) -> list[str]:
    """The --tools modules a run was started with (a child run's: its parents'), which a
    resume without them would be refused for."""
    for _ in range(32):  # nesting is bounded: never a loop over a doctored context
        modules = recorded_modules(run)
        parent = (run.context.get("parent") or {}).get("run_id")
        if modules or not parent:
            return modules
        try:
            run = s.get(parent)
        except SagaError:
            return []
    return []


_decision_command("approve", True, "Approve a step that waits for confirmation.\n\n\b\n"
                                  "Example:\n  saga approve ORDER-42 pay --comment 'checked' "
                                  "--actor alice")
_decision_command("reject", False, "Reject a step that waits for confirmation (it fails and "
                                   "follows its on_error).\n\n\b\nExample:\n"
                                   "  saga reject ORDER-42 pay --comment 'amount too high'")


@main.command(name="signal")
@click.argument("run_id")
@click.argument("name")
@click.option("--data", help="The signal's data as JSON (the waiting step's output).")
@click.option("--actor", help="Who sends it (default: SAGA_ACTOR or the OS user).")
@json_option
def signal_command(run_id: str, name: str, data: str | None, actor: str | None,
                   as_json: bool) -> None:
    """Send the signal NAME to a run: the first step waiting for it continues with DATA.

    \b
    Example:
      saga signal ORDER-42 go --data '{"amount": 42}'
    """
    try:
        value = json.loads(data) if data is not None else None
    except ValueError as e:
        raise InputError([Problem("--data", f"not JSON: {e}")]) from None
    run = _saga().signal(run_id, name, value, actor=actor)
    if as_json:
        _emit_json({"run_id": run.run_id, "signal": name, "status": run.status})
    else:
        click.echo(f"signal {name} sent to run {run.run_id}; a worker continues it "
                   f"(or: saga resume {run.run_id})")


def _pause_command(name: str, doc: str) -> None:
    @main.command(name=name, help=doc)
    @click.argument("run_id")
    @click.option("--actor", help="Who does it (default: SAGA_ACTOR or the OS user).")
    @json_option
    def command(run_id: str, actor: str | None, as_json: bool) -> None:
        s = _saga()
        run = s.pause(run_id, actor=actor) if name == "pause" else s.unpause(run_id, actor=actor)
        if as_json:
            _emit_json({"run_id": run.run_id, "status": run.status})
        else:
            click.echo(f"run {run.run_id} is {run.status}")


_pause_command("pause", "Pause a run: no new step starts, attempts in flight finish."
                        "\n\n\b\nExample:\n  saga pause ORDER-42")
_pause_command("unpause", "Let a paused run go on (a worker continues it)."
                          "\n\n\b\nExample:\n  saga unpause ORDER-42")
