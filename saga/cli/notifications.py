"""``saga notifications``: the webhooks derived from runs' events (list, show, retry).

Workers derive and deliver them (:mod:`saga.worker.notify`); these commands read the
outbox and put a notification back in line from any process.
"""

from __future__ import annotations

from typing import Any

import click

from saga.cli.app import _emit_json, _saga, main, note
from saga.store.outbox import STATUSES


@main.group(name="notifications")
def notifications() -> None:
    """Webhooks derived from runs' events: list them, show one, send one again.

    \b
    Example:
      saga notifications list --status failed
      saga notifications show 3f2a9c01
      saga notifications retry 3f2a9c01
    """


def _line(n: dict[str, Any]) -> str:
    """One notification on one line: id, status, attempts, kind, run, target."""
    last = f"  ({n['last_error']})" if n["last_error"] and n["status"] != "delivered" else ""
    return (f"{n['id']}  {n['status']:<9} {n['attempts']:>3}x  {n['type']:<19} "
            f"{n['run_id'][:8]}  {n['target']}{last}")


@notifications.command(name="list")
@click.option("--status", type=click.Choice(STATUSES), help="Only notifications in this state.")
@click.option("--run", "run_id", metavar="RUN", help="Only this run's (its id or name).")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_notifications(status: str | None, run_id: str | None, limit: int,
                       as_json: bool) -> None:
    """List notifications, newest first, with their attempts so far.

    \b
    Example:
      saga notifications list --status pending
      saga notifications list --run nightly-42 --json
    """
    with _saga() as saga:
        found = saga.notifications(status, run_id, limit)
    if as_json:
        _emit_json(found)
        return
    for n in found:
        click.echo(_line(n))
    if not found:
        note("no notifications" + (f" {status}" if status else ""))


@notifications.command(name="show")
@click.argument("notification_id")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(notification_id: str, as_json: bool) -> None:
    """Show a notification: the body it sends and every attempt.

    \b
    Example:
      saga notifications show 3f2a9c01 --json
    """
    with _saga() as saga:
        found = saga.notification(notification_id)
    if as_json:
        _emit_json(found)
        return
    click.echo(_line(found))
    for a in found["attempts_log"]:
        code = f" HTTP {a['status_code']}" if a["status_code"] else ""
        click.echo(f"  attempt {a['attempt']}  {a['started_at']}  {a['outcome']}{code}"
                   f"  by {a['worker']}{'  ' + a['error'] if a['error'] else ''}")


@notifications.command(name="retry")
@click.argument("notification_id")
@click.option("--json", "as_json", is_flag=True, help="Print the notification as JSON.")
def retry(notification_id: str, as_json: bool) -> None:
    """Send a notification again (delivered or failed alike): a worker sends it on its
    next round, and retries it until the horizon from now.

    \b
    Example:
      saga notifications retry 3f2a9c01
    """
    with _saga() as saga:
        found = saga.retry_notification(notification_id)
    if as_json:
        _emit_json(found)
        return
    note(f"notification {found['id']} ({found['type']} to {found['target']}) is due again; "
         "a worker sends it")
