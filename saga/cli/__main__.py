"""``python -m saga.cli``: the same as the ``saga`` command."""

from saga.cli import run

run()
