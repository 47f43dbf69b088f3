"""Riding out a database that goes away: the one retry policy for lost connections.

A PostgreSQL restart, a failover or a killed backend reaches saga as a connection error
(psycopg's ``OperationalError`` or ``InterfaceError``, which the eventsourcing library
re-raises as its own). Every store operation runs under :meth:`Reconnect.call`: tried
again with exponential backoff and jitter (tenacity) until it succeeds or the budget
(``reconnect_seconds``) is spent, then :class:`StoreUnavailableError` (exit 3). Only what
is safe to repeat runs under it: reads, idempotent statements, and appends whose lost
outcome is first resolved by reading the run back (see
:meth:`saga.store.application.SagaApplication.save_run`). Loops that must outlive any
outage (workers, ``projection run --follow``) wait :func:`backoff` between rounds.

SQLite has no connection to lose (its waits for locks are its own timeout), so there the
policy calls once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from saga.errors import StoreUnavailableError, first_line
from saga.lazy import lazy

if TYPE_CHECKING:
    import tenacity
else:
    tenacity = lazy("tenacity")  # only a lost connection needs it

log = logging.getLogger("saga.store")
T = TypeVar("T")
#: Driver error classes a new connection may cure (psycopg's, and eventsourcing's
#: re-raised forms; psycopg_pool's PoolTimeout is an OperationalError).
_LOST = frozenset({"OperationalError", "InterfaceError"})
_DRIVERS = frozenset({"psycopg", "psycopg_pool", "eventsourcing"})


def connection_lost(error: BaseException) -> bool:
    """True for an error a reconnect may cure (without importing the optional driver):
    a driver's connection error, or a StoreUnavailableError made of one."""
    if isinstance(error, StoreUnavailableError):
        return error.lost
    return any(cls.__name__ in _LOST and cls.__module__.split(".")[0] in _DRIVERS
               for cls in type(error).__mro__)


def _wait() -> tenacity.wait.wait_base:
    return tenacity.wait_exponential(multiplier=0.05, max=2.0) + tenacity.wait_random(0, 0.1)


def backoff(failures: int) -> float:
    """Seconds a loop waits after ``failures`` rounds in a row found the store gone."""
    state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(),
                                    kwargs={})
    state.attempt_number = max(failures, 1)
    return float(_wait()(state))


class Reconnect:
    """Retry an operation while its database connection is lost, for ``seconds`` at most."""

    def __init__(self, seconds: float, *, enabled: bool = True,
                 on_lost: Callable[[], None] | None = None) -> None:
        """``on_lost()`` runs before each new try (to drop a pool's dead connections)."""
        self.seconds = seconds
        self.enabled = enabled
        self.on_lost = on_lost

    def call(self, where: str, operation: Callable[[], T]) -> T:
        """``operation()``, tried again on a lost connection; StoreUnavailableError
        (naming ``where``) when the budget is spent."""
        if not self.enabled:
            return operation()
        try:
            # The first try outside tenacity: nearly every call succeeds at once, and
            # setting up a retry loop costs as much as a small commit's client side.
            return operation()
        except Exception as e:
            if not connection_lost(e):
                raise
            first = e

        def before_retry(state: tenacity.RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome else None
            # Quiet (a command prints one line if it gives up); loops warn on their own.
            level = logging.INFO if state.attempt_number == 1 else logging.DEBUG
            log.log(level, "database connection lost (%s): %s; reconnecting", where,
                    first_line(error) if error else "?")
            if self.on_lost is not None:
                try:
                    self.on_lost()
                except Exception as e:  # the next try reports what matters
                    log.debug("after a lost connection: %s", e)

        failed = [first]

        def attempt() -> T:
            if failed:  # the first try, made above, counts as tenacity's first
                raise failed.pop()
            return operation()

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception(connection_lost), wait=_wait(),
            stop=tenacity.stop_after_delay(self.seconds), before_sleep=before_retry, reraise=True)
        try:
            return retrying(attempt)
        except Exception as e:
            if not connection_lost(e):
                raise
            text = e.message if isinstance(e, StoreUnavailableError) else \
                f"cannot reach the event store ({where}): {first_line(e)}"
            raise StoreUnavailableError(f"{text} (gave up after {self.seconds:g} s)") from e
