"""``saga keys``: the keys that seal payloads at rest (:mod:`saga.store.encryption`)."""

from __future__ import annotations

import base64
import os

import click

from saga.cli.app import _emit_json, json_option, main
from saga.config import load_settings
from saga.errors import ConfigError
from saga.store.encryption import kek_id, kek_of, rotate


@main.group()
def keys() -> None:
    """The encryption keys of payloads at rest: generate a key, rotate it.

    \b
    Example:
      saga keys rotate --new-key-env NEW_KEY
    """


@keys.command(name="generate")
@json_option
def keys_generate(as_json: bool) -> None:
    """Print a new random key (base64 of 32 bytes), for [encryption] key_env.

    \b
    Example:
      saga keys generate > kek.txt
    """
    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    if as_json:
        _emit_json({"key": key, "key_id": kek_id(kek_of(key))})
        return
    click.echo(key)


@keys.command(name="rotate")
@click.option("--new-key-env", "variable", required=True, metavar="VAR",
              help="The variable that holds the new key.")
@json_option
def keys_rotate(variable: str, as_json: bool) -> None:
    """Wrap every run's data key with a new key (no event is rewritten).

    The configured key unwraps them; afterwards point [encryption] key_env (or
    SAGA_ENCRYPTION_KEY_ENV) at VAR, and destroy the old key once no backup of the key
    table needs it.

    \b
    Example:
      saga keys rotate --new-key-env NEW_KEY
    """
    new = os.environ.get(variable, "").strip()
    if not new:
        raise ConfigError(f"the variable {variable} is not set")
    count = rotate(load_settings(), new)
    if as_json:
        _emit_json({"rewrapped": count, "key_id": kek_id(kek_of(new)), "key_env": variable})
        return
    click.echo(f"rewrapped {count} data key(s) with key {kek_id(kek_of(new))}; now set "
               f"SAGA_ENCRYPTION_KEY_ENV={variable} (or [encryption] key_env)")
