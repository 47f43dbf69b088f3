"""Commands that append to a run another process may be appending to: tried again, for
a while, when that other writer's append lands first."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from saga.errors import ConcurrentWriteError

#: How long a command keeps trying to append against a busy run (seconds): its driver may
#: append every few milliseconds, and on a loaded machine a fixed count of read-then-append
#: tries can all lose (``saga label`` and ``saga migrate`` gave up after 5, exit 5).
PATIENCE = 5.0

T = TypeVar("T")


def patiently(attempt: Callable[[], T], patience: float = PATIENCE) -> T:
    """``attempt()``, tried again while another writer's append beats it
    (ConcurrentWriteError) for ``patience`` seconds. The waits between tries are short and
    jittered, so a command does not fall into step with a driver's appends."""
    deadline = time.monotonic() + patience
    backoff = 0.005
    while True:
        try:
            return attempt()
        except ConcurrentWriteError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(random.uniform(backoff / 2, backoff))
        backoff = min(backoff * 2, 0.1)
