"""The notification outbox through :class:`~saga.api.Saga`: list, show and redeliver
webhooks, and the notifier a worker runs (see :mod:`saga.worker.notify`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from saga.composition.notify_config import notify_settings
from saga.config import Settings
from saga.lazy import lazy
from saga.store.outbox import Outbox
from saga.store.side_tables import Row

if TYPE_CHECKING:
    from saga.store.application import SagaApplication
    from saga.worker import notify as notify_
else:
    notify_ = lazy("saga.worker.notify")  # a worker's part: loaded when one starts

#: What a listing shows of a notification (its body and lease are left out).
SHOWN = ("id", "type", "run_id", "event_id", "target", "status", "attempts", "created_at",
         "next_at", "deadline", "delivered_at", "last_error", "secret_env")


def notification_json(row: Row, *, full: bool = False) -> dict[str, Any]:
    """A notification as the CLI and the HTTP API show it (``full``: with the body sent
    and every attempt)."""
    out = {k: row.get(k) for k in SHOWN}
    if out["status"] == "pending" and row.get("lease_until") and row.get("leased_by"):
        out["sending_by"] = row["leased_by"]
    if full:
        out["body"] = json.loads(row["body"])
        out["attempts_log"] = row.get("attempts_log", [])
    return out


class NotificationCommands:
    """The outbox's commands (mixed into :class:`~saga.api.Saga`)."""

    settings: Settings

    if TYPE_CHECKING:
        @property
        def app(self) -> SagaApplication: ...

        def resolve(self, run_id: str) -> str: ...

    def _outbox(self) -> Outbox:
        self.app  # noqa: B018 - the store (and its schema) exists before its side tables
        return Outbox(self.settings)

    def notifications(self, status: str | None = None, run_id: str | None = None,
                      limit: int | None = 100, *, attempts: bool = False
                      ) -> list[dict[str, Any]]:
        """Notifications newest first: of one ``status`` (pending, delivered, failed)
        and one run when given; ``attempts``: each with its ``attempts_log``."""
        run = self.app.get_run(self.resolve(run_id)).run_id if run_id else None
        outbox = self._outbox()
        try:
            found = [notification_json(r) for r in outbox.listing(status, run, limit)]
            if attempts:
                logs = outbox.attempts_of([n["id"] for n in found])
                for n in found:
                    n["attempts_log"] = logs[n["id"]]
            return found
        finally:
            outbox.close()

    def notification(self, ident: str) -> dict[str, Any]:
        """One notification (by id or a unique prefix), with its body and attempts."""
        outbox = self._outbox()
        try:
            return notification_json(outbox.get(ident), full=True)
        finally:
            outbox.close()

    def retry_notification(self, ident: str) -> dict[str, Any]:
        """Send a notification again (delivered, failed or pending): due now, retried
        until the horizon from now at least; the next worker round sends it."""
        now = datetime.now(UTC)
        horizon = timedelta(seconds=notify_settings(self.settings).horizon)
        outbox = self._outbox()
        try:
            return notification_json(outbox.retry(
                ident, now.isoformat(timespec="microseconds"),
                (now + horizon).isoformat(timespec="microseconds")), full=True)
        finally:
            outbox.close()

    def notifier(self, worker_id: str, **kwargs: Any) -> notify_.Notifier:
        """The notifier a worker starts beside its drives (not started yet)."""
        return notify_.Notifier(self.app, self.settings, worker_id, **kwargs)
