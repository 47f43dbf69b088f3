"""``saga resources``: the limits of saga.toml's ``[resources.NAME]``, as the store holds
them for every worker now: each resource's calls in flight and the calls waiting, in the
order they will be served."""

from __future__ import annotations

import click

from saga.cli.app import _emit_json, _saga, json_option, main, note


@main.command(name="resources")
@json_option
def resources(as_json: bool) -> None:
    """Show each limited resource: its limits, its calls in flight and waiting.

    Limits are saga.toml's [resources.NAME] (concurrency = N, rate = "R/s" or "R/min"),
    held in the store across every worker; a step counts against its resource: NAME
    (or its tool's default, such as http:HOST).

    \b
    Example:
      saga resources
      saga resources --json
    """
    with _saga() as saga:
        report = saga.resource_report()
    if as_json:
        _emit_json(report)
        return
    if not report:
        note("no resources are limited: saga.toml has no [resources.NAME] table")
    for r in report:
        limits = ", ".join(part for part in (
            f"concurrency {r['concurrency']}" if r["concurrency"] else "",
            f"rate {r['rate']} (burst {r['burst']})" if r["rate"] else "") if part)
        click.echo(f"{r['resource']}: {limits}; {r['in_use']} in use, {r['waiting']} waiting")
        for h in r["holders"]:
            click.echo(f"  in use   {h['run_id']} {h['step']} on {h['worker']} "
                       f"since {h['since']}")
        for n, w in enumerate(r["waiters"], 1):
            click.echo(f"  waiting  {n}. {w['run_id']} {w['step']} since {w['since']}")
