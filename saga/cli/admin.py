"""Commands that run the service's parts: ``worker``, ``projection``, ``db init``."""

from __future__ import annotations

import contextlib
import signal

import click

from saga.cli.app import (
    _saga,
    main,
    tools_option,
)


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
def worker(concurrency: int, until_idle: bool, worker_id: str | None,
           lease_seconds: float | None, poll: float, tools: tuple[str, ...]) -> None:
    """Claim runnable runs and drive them (new, interrupted, approved, redriven)."""


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


@main.group()
def projection() -> None:
    """The read model: tables saga_runs and saga_steps, maintained from the log."""


@projection.command(name="run")
@click.option("--follow", is_flag=True, help="Keep applying new events until interrupted.")
@click.option("--poll", type=click.FloatRange(0.05, 60), default=0.5, show_default=True)
def projection_run(follow: bool, poll: float) -> None:
    """Apply the events the read model has not seen yet (and, with --follow, keep going)."""


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
def projection_rebuild() -> None:
    """Drop the read model and rebuild it from the first event."""
    saga = _saga()
    applied = saga.projection.rebuild()
    click.echo(f"rebuilt from {applied} events; position {saga.projection.position()}")


@main.group()
def db() -> None:
    """The store's tables."""


@db.command(name="init")
def db_init() -> None:
    """Create every table once (run it before starting many workers at once)."""
    saga = _saga()
    saga.leases  # noqa: B018 - creating the store and its side tables is the point
    saga.projection.create_tables()
    click.echo(f"initialised {saga.settings.store_description}")
