"""Commands that revise a run in flight: ``saga migrate``, ``saga reset``, ``saga label``
(see :mod:`saga.executor.revisions`)."""

from __future__ import annotations

import click

from saga.cli.app import FilePath, _emit_json, _saga, json_option, main, tools_option
from saga.cli.render import _finish, _Progress
from saga.domain import RUN_STATUSES
from saga.errors import InputError, MigrationRefusedError, Problem

#: The statuses of a run in flight, which a bulk migration looks at by default.
IN_FLIGHT = ("waiting", "running", "paused")


@main.command()
@click.argument("run_id", required=False)
@click.option("--to", "to", required=True, type=FilePath(), help="The new definition (a file).")
@click.option("--dry-run", is_flag=True, help="Only say whether it would migrate.")
@click.option("--reason", help="Why (recorded).")
@click.option("--actor", help="Who (default: SAGA_ACTOR or the OS user).")
@click.option("--definition", help="Bulk: every run in flight of this composition.")
@click.option("--status", "statuses", default=",".join(IN_FLIGHT), show_default=True,
              help="Bulk: the statuses to look at, comma-separated.")
@tools_option
@json_option
def migrate(run_id: str | None, to: str, dry_run: bool, reason: str | None,
            actor: str | None, definition: str | None, statuses: str,
            tools: tuple[str, ...], as_json: bool) -> None:
    """Move a run in flight to a new definition, when replay proves it safe.

    Its history is folded through the scheduler with the new definition: every recorded
    decision must come out the same. Then DefinitionMigrated is recorded and the run goes
    on with the new definition; otherwise nothing is recorded, the first divergence is
    printed and the exit code is 7.

    \b
    Example:
      saga migrate ORDER-42 --to order-v2.yaml --dry-run
      saga migrate --definition order --to order-v2.yaml
    """
    saga = _saga(tools)
    if (run_id is None) == (definition is None):
        raise click.UsageError("give a RUN, or --definition NAME to migrate many runs")
    if run_id is not None:
        try:
            check = saga.migrate(run_id, to, dry_run=dry_run, reason=reason, actor=actor)
        except MigrationRefusedError as e:
            if as_json and e.check is not None:
                _emit_json(e.check.as_dict())  # type: ignore[attr-defined]
            raise
        if as_json:
            _emit_json(check.as_dict())
        else:
            click.echo(check.describe())
        if dry_run and not check.safe:
            raise SystemExit(MigrationRefusedError.exit_code)
        return
    wanted = tuple(s.strip() for s in statuses.split(",") if s.strip())
    unknown = [s for s in wanted if s not in RUN_STATUSES]
    if unknown:
        raise InputError([Problem("--status", f"unknown status {s!r}; one of "
                                  f"{', '.join(RUN_STATUSES)}") for s in unknown])
    assert definition is not None
    checks = saga.migrate_all(definition, to, statuses=wanted, dry_run=dry_run,
                              reason=reason, actor=actor)
    if as_json:
        _emit_json([c.as_dict() for c in checks])
    else:
        for check in checks:
            click.echo(check.describe())
        safe = sum(1 for c in checks if c.safe)
        click.echo(f"{safe} of {len(checks)} runs {'can' if dry_run else 'did'} migrate",
                   err=True)
    if any(not c.safe for c in checks):
        raise SystemExit(MigrationRefusedError.exit_code)


@main.command()
@click.argument("run_id")
@click.option("--to", "step", required=True, metavar="STEP", help="The step to re-run from.")
@click.option("--reason", help="Why (recorded).")
@click.option("--actor", help="Who (default: SAGA_ACTOR or the OS user).")
@click.option("--no-drive", is_flag=True, help="Record the reset; a worker continues it.")
@tools_option
@json_option
def reset(run_id: str, step: str, reason: str | None, actor: str | None, no_drive: bool,
          tools: tuple[str, ...], as_json: bool) -> None:
    """Re-run a run from STEP: undo the steps from there, then run them again.

    The steps at and downstream of STEP that completed and can be undone are compensated
    first (latest first); then they run again, with new idempotency keys. Works on a
    finished run (failed, compensated, completed) too.

    \b
    Example:
      saga reset ORDER-42 --to charge --reason "card fixed"
    """
    saga = _saga(tools)
    if no_drive:
        run = saga.reset(run_id, step, actor=actor, reason=reason, drive=False)
        if as_json:
            _emit_json({"run_id": run.run_id, "status": run.status})
        else:
            click.echo(f"run {run.run_id} reset to {step}; a worker continues it "
                       f"(or: saga resume {run.run_id})")
        return
    with _Progress(enabled=not as_json) as progress:
        result = saga.reset(run_id, step, actor=actor, reason=reason,
                            on_events=progress.update)
    _finish(result, as_json, ("completed", "waiting"))


@main.command()
@click.argument("run_id")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY=VALUE...")
@click.option("--actor", help="Who (default: SAGA_ACTOR or the OS user).")
@json_option
def label(run_id: str, pairs: tuple[str, ...], actor: str | None, as_json: bool) -> None:
    """Change a run's labels while it runs (KEY= removes a label).

    \b
    Example:
      saga label ORDER-42 team=payments ticket=
    """
    changes: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InputError([Problem(pair, "a label is KEY=VALUE (KEY= removes it)")])
        changes[key] = value
    run = _saga().label(run_id, changes, actor=actor)
    labels = run.context.get("labels") or {}
    if as_json:
        _emit_json({"run_id": run.run_id, "labels": labels})
    else:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(none)"
        click.echo(f"run {run.run_id} labels: {shown}")
