"""Commands that run the service's parts: ``worker``, ``schedule``, ``projection``,
``db init``."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import click

from saga.cli.app import (
    _emit_json,
    _saga,
    json_option,
    main,
    note,
    tools_option,
)
from saga.cli.render import _ago
from saga.cli.runs import _parse_inputs
from saga.executor.pools import Pools
from saga.telemetry import metrics


@main.command()
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Runs driven at once.")
@click.option("--until-idle", is_flag=True, help="Exit when nothing is runnable.")
@click.option("--id", "worker_id", help="This worker's name (default host:pid).")
@click.option("--lease", "lease_seconds", type=click.FloatRange(0.5, 3600),
              help="Lease length in seconds (default SAGA_LEASE_SECONDS or 30).")
@click.option("--poll", type=click.FloatRange(0.05, 60), default=0.5, show_default=True,
              help="Seconds between looks for new work.")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (0: any free port, "
                   "printed); needs the metrics extra.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="The address the metrics listen on.")
@click.option("--pool", "pools", metavar="NAME", multiple=True,
              help="Run the steps of this pool (a step's pool: NAME); repeatable.")
@click.option("--only-pools", is_flag=True,
              help="Run only the steps of its --pool pools, no unpooled step.")
@tools_option
@click.option("--json", "as_json", is_flag=True,
              help="When it stops, print what it did as JSON (worker, store, drives).")
def worker(concurrency: int, until_idle: bool, worker_id: str | None,
           lease_seconds: float | None, poll: float, metrics_port: int | None,
           metrics_host: str, pools: tuple[str, ...], only_pools: bool,
           tools: tuple[str, ...], as_json: bool) -> None:
    """Claim runnable runs and drive them (new, interrupted, approved, redriven).

    Highest priority first, then oldest, within saga.toml's [queues.NAME] limits.
    SIGTERM or Ctrl-C: the steps in flight finish and are recorded, then it stops; a
    second signal stops it at once.

    \b
    Example:
      saga worker --concurrency 8 --id worker-1 --metrics-port 9464
      saga worker --until-idle --json       # drain what is runnable, then exit
      saga worker --pool vpn --only-pools   # only the steps with pool: vpn
    """
    if only_pools and not pools:
        raise click.BadParameter("needs at least one --pool NAME (it would run nothing)",
                                 param_hint="--only-pools")
    served = Pools.of(pools, only_pools)
    saga = _saga(tools)
    if metrics_port is not None:
        exported = metrics.enable()
        exported.watch_lag(saga.lag)
        if saga.settings.resources:  # slots in use and waiters, as the store holds them
            exported.watch_resources(saga.resource_usage)
        server = exported.serve(metrics_port, metrics_host)
        note(f"metrics on http://{metrics_host}:{server.server_port}/metrics")
    saga.sync_schedules()
    w = saga.worker_loop(worker_id=worker_id, concurrency=concurrency, poll_interval=poll,
                         lease_seconds=lease_seconds or saga.settings.lease_seconds,
                         pools=served)
    stopping: list[int] = []

    def on_signal(*_: Any) -> None:
        # The first SIGTERM or Ctrl-C: the calls in flight finish and are recorded;
        # the second: stop now.
        stopping.append(1)
        if len(stopping) > 1:
            w.halt()
    signal.signal(signal.SIGTERM, on_signal)
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # a background job's is
        signal.signal(signal.SIGINT, on_signal)
    note(f"worker {w.worker_id} on {saga.settings.store_description}"
         + (f" ({served.describe()})" if pools else ""))
    try:  # webhooks, on a thread of their own, while the worker's liveness lock is held
        driven = w.run(until_idle=until_idle, stop=lambda: bool(stopping),
                       alongside=saga.notifier(w.worker_id))
    except KeyboardInterrupt:
        driven = w.driven
    note(f"worker {w.worker_id} stopped after {driven} drives")
    if as_json:
        _emit_json({"worker": w.worker_id, "store": saga.settings.store_description,
                    "drives": driven})


@main.group()
def projection() -> None:
    """The read model: tables saga_runs and saga_steps, maintained from the log.

    \b
    Example:
      saga projection run --follow
    """


@projection.command(name="run")
@click.option("--follow", is_flag=True, help="Keep applying new events until interrupted.")
@click.option("--poll", type=click.FloatRange(0.05, 60), default=0.5, show_default=True)
@json_option
def projection_run(follow: bool, poll: float, as_json: bool) -> None:
    """Apply the events the read model has not seen yet (and, with --follow, keep going).

    \b
    Example:
      saga projection run --json
    """
    saga = _saga()
    applied = saga.projection.catch_up()
    position = saga.projection.position()
    if not as_json:
        click.echo(f"applied {applied} events; position {position}", err=True)
    if follow:
        stopping: list[int] = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        with contextlib.suppress(KeyboardInterrupt):
            saga.projection.follow(poll_interval=poll, stop=lambda: bool(stopping))
        position = saga.projection.position()
        if not as_json:
            click.echo(f"stopped at position {position}", err=True)
    if as_json:
        _emit_json({"applied": applied, "position": position, "followed": follow})


@projection.command(name="rebuild")
@json_option
def projection_rebuild(as_json: bool) -> None:
    """Drop the read model and rebuild it from the first event.

    \b
    Example:
      saga projection rebuild --json
    """
    saga = _saga()
    applied = saga.projection.rebuild()
    position = saga.projection.position()
    if as_json:
        _emit_json({"rebuilt_from": applied, "position": position})
    else:
        click.echo(f"rebuilt from {applied} events; position {position}")


@main.group()
def db() -> None:
    """The store's tables.

    \b
    Example:
      SAGA_DATABASE_URL=postgresql://app@db:5432/saga saga db init
    """


@db.command(name="init")
@json_option
def db_init(as_json: bool) -> None:
    """Create every table once (run it before starting many workers at once).

    \b
    Example:
      saga db init --json
    """
    saga = _saga()
    saga.leases  # noqa: B018 - creating the store and its side tables is the point
    saga.projection.create_tables()
    if as_json:
        _emit_json({"initialised": True, "store": saga.settings.store_description,
                    "position": saga.projection.position()})
    else:
        click.echo(f"initialised {saga.settings.store_description}")


@main.group()
def schedule() -> None:
    """Compositions started on a cron expression or every N seconds, fired by workers.

    \b
    Example:
      saga schedule add nightly backup.yaml --cron "0 2 * * *" --timezone Europe/Paris
      saga schedule add ping quickstart --every 30s
    """


@schedule.command(name="add")
@click.argument("name")
@click.argument("file")
@click.option("--cron", help="A cron expression, e.g. '*/5 * * * *'.")
@click.option("--every", help="An interval, e.g. 30s, 5m, 2h.")
@click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE",
              help="An input of every run it starts (repeatable).")
@click.option("--timezone", default="UTC", show_default=True, help="The cron's time zone.")
@click.option("--catch-up", type=click.Choice(["skip", "all"]), default="skip",
              show_default=True, help="Missed times (no worker ran): the latest, or all.")
@click.option("--replace", is_flag=True, help="Change a schedule of this name.")
@tools_option
@json_option
def schedule_add(name: str, file: str, cron: str | None, every: str | None,
                 pairs: tuple[str, ...], timezone: str, catch_up: str, replace: bool,
                 tools: tuple[str, ...], as_json: bool) -> None:
    """Add a schedule NAME that starts FILE (a file or a template's name).

    \b
    Example:
      saga schedule add nightly backup.yaml --cron "0 2 * * *" -i target=db1
    """
    saga = _saga(tools)
    plan = saga.load(file)
    inputs = _parse_inputs(pairs, None, {s.name: s for s in plan.definition.inputs})
    saga.start(plan, inputs)  # the inputs must start a run, checked now, not at 2 am
    added = saga.schedules.add(name, file, plan.record(), inputs, cron=cron, every=every,
                               timezone=timezone, catch_up=catch_up, replace=replace)
    if as_json:
        _emit_json(added.to_json())
    else:
        click.echo(f"schedule {name}: next run at {added.next_due}")


@schedule.command(name="list")
@json_option
def schedule_list(as_json: bool) -> None:
    """List the schedules and when each fires next.

    \b
    Example:
      saga schedule list --json
    """
    rows = [s.to_json() for s in _saga().schedules.all()]
    if as_json:
        _emit_json(rows)
        return
    if not rows:
        click.echo("no schedules")
        return
    click.echo(f"{'NAME':<20} {'WHEN':<22} {'NEXT':<10} STATE")
    for r in rows:
        when = r["cron"] or f"every {r['every_seconds']:g}s"
        click.echo(f"{r['name']:<20} {when:<22} {_ago(r['next_due']):<10} "
                   f"{'paused' if r['paused'] else 'active'}")


def _schedule_command(name: str, doc: str) -> None:
    @schedule.command(name=name, help=doc)
    @click.argument("schedule_name")
    @json_option
    def command(schedule_name: str, as_json: bool) -> None:
        schedules = _saga().schedules
        if name == "remove":
            schedules.remove(schedule_name)
            if as_json:
                _emit_json({"name": schedule_name, "removed": True})
            else:
                click.echo(f"schedule {schedule_name} removed")
            return
        changed = schedules.set_paused(schedule_name, name == "pause")
        done = {"pause": "paused", "resume": "resumed"}[name]
        if as_json:
            _emit_json(changed.to_json())
        else:
            click.echo(f"schedule {schedule_name} {done}; next run at {changed.next_due}")


_schedule_command("remove", "Remove a schedule (the runs it started are kept)."
                           "\n\n\b\nExample:\n  saga schedule remove nightly")
_schedule_command("pause", "Stop a schedule firing until it is resumed."
                          "\n\n\b\nExample:\n  saga schedule pause nightly")
_schedule_command("resume", "Let a paused schedule fire again (missed times are skipped)."
                           "\n\n\b\nExample:\n  saga schedule resume nightly --json")
