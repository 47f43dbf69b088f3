"""``saga token``: the API tokens of tenants (create, list, revoke).

Tokens live in the configured store (``[database]``, or ``SAGA_HOME``), whichever tenant
they act on; ``saga serve`` over that store accepts them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import click

from saga.api import Saga
from saga.cli.app import _emit_json, main, note
from saga.config import load_settings, tenant_names
from saga.errors import ConfigError
from saga.store.tokens import SCOPES, TokenStore, parse_expiry


@contextmanager
def _tokens() -> Iterator[tuple[TokenStore, list[str], str]]:
    """The token table of the configured store (never a tenant's: ``SAGA_TENANT`` is
    ignored here), the tenants' names, and who is acting."""
    settings = load_settings({k: v for k, v in os.environ.items() if k != "SAGA_TENANT"})
    with Saga(settings) as saga:
        yield TokenStore(saga.schedules.db), tenant_names(settings), settings.actor


@main.group(name="token")
def token() -> None:
    """API tokens of tenants: create (the secret is shown once), list, revoke.

    \b
    Example:
      saga token create --tenant default --scope operate --expires 30d
      saga token list
      saga token revoke 3f2a9c01b7de
    """


@token.command(name="create")
@click.option("--tenant", default="default", show_default=True,
              help="The tenant the token acts on ([tenants.NAME] in saga.toml).")
@click.option("--scope", type=click.Choice(SCOPES), required=True,
              help="read reads; operate also starts, approves, cancels, retries; admin "
                   "also manages schedules and tokens.")
@click.option("--name", help="What changes made with it are recorded as, after its id "
                             "(default TENANT-SCOPE).")
@click.option("--expires", metavar="DURATION", help="It is refused after this long: 30d, "
                                                     "12h, 2w, 90m (default: never).")
@click.option("--json", "as_json", is_flag=True, help="Print the token and its secret as JSON.")
def create(tenant: str, scope: str, name: str | None, expires: str | None,
           as_json: bool) -> None:
    """Create a token and print its secret, once (only its hash is kept).

    \b
    Example:
      saga token create --tenant acme --scope operate --name deploy-bot --expires 30d
    """
    lifetime = parse_expiry(expires) if expires else None
    with _tokens() as (store, tenants, actor):
        if tenant not in tenants:
            raise ConfigError(f"no tenant {tenant!r}: saga.toml configures "
                              f"{', '.join(tenants)}")
        made, secret = store.create(tenant, scope, name=name, expires=lifetime, actor=actor)
    if as_json:
        _emit_json({**made.to_json(), "secret": secret})
        return
    click.echo(secret)
    note(f"token {made.id} ({made.name}: {scope} on tenant {tenant}"
         f"{f', until {made.expires_at}' if made.expires_at else ''}); "
         "the secret is shown this once")


@token.command(name="list")
@click.option("--tenant", help="Only this tenant's tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_tokens(tenant: str | None, as_json: bool) -> None:
    """List tokens, without their secrets.

    \b
    Example:
      saga token list --tenant acme
    """
    with _tokens() as (store, _, _actor):
        found = [t.to_json() for t in store.all(tenant)]
    if as_json:
        _emit_json(found)
        return
    for t in found:
        click.echo(f"{t['id']}  {t['tenant']:<12} {t['scope']:<8} {t['state']:<8} "
                   f"{t['name']:<20} expires {t['expires_at'] or 'never'}")
    if not found:
        note("no tokens (saga token create makes one)")


@token.command(name="revoke")
@click.argument("token_id")
@click.option("--json", "as_json", is_flag=True, help="Print the revoked token as JSON.")
def revoke(token_id: str, as_json: bool) -> None:
    """Revoke a token: it is refused from now on.

    \b
    Example:
      saga token revoke 3f2a9c01b7de
    """
    with _tokens() as (store, _, actor):
        done = store.revoke(token_id, actor)
    if as_json:
        _emit_json(done.to_json())
        return
    note(f"token {done.id} ({done.name}) revoked")
