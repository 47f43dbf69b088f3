"""The ``saga`` command line: thin click commands over :class:`saga.api.Saga`.

:mod:`~saga.cli.app` is the group, its shared options and its one error handler; the
commands live in :mod:`~saga.cli.runs`, :mod:`~saga.cli.templates`,
:mod:`~saga.cli.audit` and :mod:`~saga.cli.admin`, and :mod:`~saga.cli.render` shows
what they print. A command's module loads when the command runs (see
:data:`saga.cli.app.COMMANDS`), so ``saga --help`` does not load the engine.
"""

from saga.cli.app import main, run

__all__ = ["main", "run"]
