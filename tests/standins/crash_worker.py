"""A `saga worker` that SIGKILLs itself right after its Nth commit to the event store.

Usage: python tests/standins/crash_worker.py N [worker options...]
N = 0 never crashes. The kill comes after the commit is durable and before the worker acts
on it, which is exactly an event boundary.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from saga.cli import main
from saga.store.application import SagaApplication

limit = int(sys.argv[1])
commits = 0
_save_run = SagaApplication.save_run


def save_run(self: SagaApplication, run: object) -> None:
    """Commit, then die if this was commit number ``limit``."""
    global commits
    _save_run(self, run)
    commits += 1
    if commits == limit:
        os.kill(os.getpid(), signal.SIGKILL)


SagaApplication.save_run = save_run  # type: ignore[method-assign]
main(["worker", "--until-idle", "--tools", "tests.standins.standins", *sys.argv[2:]])
