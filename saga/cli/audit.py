"""Commands for auditors: ``audit verify``, ``export``, ``report``, ``retention apply``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from saga import audit as audit_log
from saga.api import Saga
from saga.cli.app import (
    FilePath,
    _emit_json,
    json_option,
    main,
)
from saga.cli.runs import _labels
from saga.config import load_settings, tenant_settings
from saga.domain import RUN_STATUSES
from saga.report import build_report, parse_moment, render


@main.group()
def audit() -> None:
    """Tamper checks on the event log: each run's hash chain (and macs, with a key).

    \b
    Example:
      SAGA_AUDIT_KEY=... saga audit verify --all
    """


@audit.command(name="verify")
@click.argument("run_ids", nargs=-1, metavar="[RUN]...")
@click.option("--all", "all_runs", is_flag=True, help="Verify every run in the store.")
@click.option("--file", "file", type=FilePath(),
              help="Verify an export (saga export) offline, without the store.")
@click.option("--head", help="A head known from before (an export's or an earlier verify's): "
                             "the chain must still contain it (catches a deleted tail).")
@json_option
def audit_verify(run_ids: tuple[str, ...], all_runs: bool, file: str | None, head: str | None,
                 as_json: bool) -> None:
    """Verify runs' audit chains: exit 0 when all verify, 1 when one is broken.

    \b
    Example:
      saga audit verify ORDER-42 --json
      saga audit verify --file order-42.json --head <HEAD>
    """
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
def export(run_id: str, fmt: str) -> None:
    """Print a run's complete, verifiable history (check it with saga audit verify --file).

    \b
    Example:
      saga export ORDER-42 > order-42.json && saga audit verify --file order-42.json
    """
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
@click.option("--output", "-o", type=FilePath(writable=True),
              help="Write the report to FILE instead of standard output.")
@click.option("--label", "label_pairs", multiple=True, metavar="KEY=VALUE",
              help="Only runs with this label (repeatable: all must match).")
@click.option("--tenant", metavar="NAME",
              help="The runs of this tenant ([tenants.NAME] in saga.toml; SAGA_TENANT).")
def report_command(since: str | None, until: str | None, definition: str | None,
                   actor: str | None, status_filter: str | None, fmt: str,
                   output: str | None, label_pairs: tuple[str, ...],
                   tenant: str | None) -> None:
    """A compliance report: outcomes, failures, compensations, durations, who did what, and
    whether each run's audit chain verifies.

    \b
    Example:
      saga report --since 2026-11-01 --label team=payments --format html -o report.html
    """

    for name, value in (("--since", since), ("--until", until)):
        try:  # checked here so a bad bound is a usage error (exit 2), not a failure
            parse_moment(value, name)
        except ValueError as e:
            raise click.UsageError(str(e)) from None
    settings = tenant_settings(load_settings(), tenant) if tenant else load_settings()
    with Saga(settings) as saga:
        built = build_report(saga, since=since, until=until, definition=definition,
                             actor=actor, status=status_filter, labels=_labels(label_pairs))
    text = render(built, fmt)
    if output is None:
        click.echo(text, nl=False)
        return
    # newline="": the csv module already wrote its own line ends.
    Path(output).write_text(text, encoding="utf-8", newline="")
    click.echo(f"wrote {output} ({built.summary['runs']} runs)", err=True)


@main.group()
def retention() -> None:
    """Remove user data from old finished runs, keeping their audit chains verifiable.

    \b
    Example:
      saga retention apply --older-than 365 --dry-run
    """


@retention.command(name="apply")
@click.option("--older-than", "days", type=click.FloatRange(min=0), required=True,
              metavar="DAYS", help="Finished runs whose last event is older than this.")
@click.option("--dry-run", is_flag=True, help="Only list the runs that would be redacted.")
@click.option("--shred", is_flag=True,
              help="Delete each run's data key instead of rewriting its events (payloads "
                   "encrypted at rest): unreadable in every copy, backups included.")
@json_option
def retention_apply(days: float, dry_run: bool, shred: bool, as_json: bool) -> None:
    """Redact inputs, parameters and outputs of finished runs older than DAYS.

    \b
    Example:
      saga retention apply --older-than 90 --json
    """
    ids = audit_log.apply_retention(load_settings(), days, dry_run=dry_run, shred=shred)
    if as_json:
        _emit_json({"dry_run": dry_run, "older_than_days": days, "runs": ids,
                    "shred": shred})
        return
    done = "shredded" if shred else "redacted"
    for run_id in ids:
        click.echo(f"{('would ' + ('shred' if shred else 'redact')) if dry_run else done} "
                   f"{run_id}")
    verb = f"would be {done}" if dry_run else done
    click.echo(f"{len(ids)} run(s) {verb} (finished more than {days:g} days ago)")
