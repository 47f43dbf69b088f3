"""Notifications: derived from the log into the outbox, and delivered by workers.

A :class:`Notifier` runs on a thread of its own in a worker process (never on a thread
that drives runs). Each round it

1. **derives**: reads the log (each partition's) after the outbox's position, only the
   topics news is made of, and for each event finds the targets that want it (saga.toml's
   ``[[notify]]`` and the run's own ``notify:``, by kind and filter). Each (event,
   target) becomes one row keyed by a digest of the event's id (``<run id>:<version>``)
   and the target's URL, written with the new position in one transaction
   (:meth:`~saga.store.outbox.Outbox.derive`): a second worker, a restart or a replay
   derives the same ids and adds nothing;
2. **delivers**: claims the due rows under a lease and POSTs each, signed
   (:mod:`saga.worker.deliver`), recording every attempt. A failed attempt is tried
   again after 1, 2, 4 ... seconds (at most ``backoff_max``) until ``horizon`` after the
   event; then the notification is ``failed`` (``saga notifications retry`` sends it
   again).

Which targets a notification has is decided when it is derived: a worker's saga.toml
``[[notify]]`` applies to the events it derives, so give every worker of a store the
same entries. Events older than the horizon when first derived (a store whose first
notifying worker starts after them) make no notification: they could never be sent.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from eventsourcing.persistence import OperationalError

from saga.composition.notify import NotifyTarget, definition_targets, url_problem
from saga.composition.notify_config import NotifySettings, config_targets, notify_settings
from saga.config import Settings
from saga.domain import TOPIC_PREFIX, event_name, run_uuid
from saga.errors import StoreUnavailableError
from saga.store.application import SagaApplication
from saga.store.encryption import unopened
from saga.store.outbox import Claimed, Outbox, notification_id
from saga.store.partitions import parts_of
from saga.store.reconnect import backoff
from saga.worker.deliver import post, signature

log = logging.getLogger("saga.notify")

#: The events news is made of, and the kind each is (see :func:`kinds_of`).
KINDS = {"RunCompleted": "run.completed", "RunFailed": "run.failed",
         "RunCompensated": "run.compensated", "RunCancelled": "run.cancelled",
         "ApprovalRequested": "run.waiting", "StepWaiting": "run.waiting",
         "StepFailed": "step.failed", "CompensationFailed": "compensation.failed"}
TOPICS = sorted(TOPIC_PREFIX + name for name in KINDS)
#: The run's status after the news, where the kind alone says it.
_STATUS = {"run.completed": "completed", "run.failed": "failed",
           "run.compensated": "compensated", "run.cancelled": "cancelled",
           "run.waiting": "waiting"}
PAGE = 200
#: Notifications one round claims (sent by up to SENDERS threads at once).
CLAIM = 8
SENDERS = 4
_CACHE = 4096  # runs whose notify: targets are kept between rounds


def kinds_of(name: str, event: Any) -> list[str]:
    """The kinds of news an event is, the most specific first: a target gets the first
    it asks for (a quarantined run's end is ``run.quarantined`` to a target that wants
    that, else ``run.failed`` or ``run.compensated``)."""
    kind = KINDS.get(name)
    if kind is None:
        return []
    if name == "StepWaiting" and (not getattr(event, "signal", None)
                                  or getattr(event, "child", None)):
        return []  # a timer (or a child run) is not a wait anyone is told of
    if name in ("RunFailed", "RunCompensated") and \
            (getattr(event, "error", None) or {}).get("type") == "Quarantined":
        return ["run.quarantined", kind]
    return [kind]


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def _error_of(event: Any) -> dict[str, Any] | None:
    error = getattr(event, "error", None)
    if isinstance(error, dict):
        return {k: error[k] for k in ("type", "message") if k in error}
    if hasattr(event, "error_type"):
        return {"type": event.error_type, "message": event.message}
    return None


class Deriver:
    """Follows the log into the outbox (see the module's docs)."""

    def __init__(self, app: SagaApplication, outbox: Outbox, settings: NotifySettings,
                 targets: list[NotifyTarget], clock: Callable[[], datetime]) -> None:
        """Derive for ``app``'s runs with the configured ``targets`` (saga.toml's)."""
        self.app, self.outbox, self.settings = app, outbox, settings
        self.targets, self.clock = targets, clock
        self._own: dict[str, list[NotifyTarget]] = {}  # run id -> its notify: targets

    def round(self) -> int:
        """Derive what the log holds since the last round; how many were added."""
        added = 0
        for index, part in enumerate(parts_of(self.app)):
            name = f"log:{index}"
            position, head = self.outbox.position(name), part.head()
            while position < head:
                notes = part.notifications(position + 1, PAGE, stop=head, topics=TOPICS)
                last = notes[-1].id if len(notes) == PAGE else head
                rows = [r for n in notes for r in self._rows(part, n)]
                if self.outbox.derive(name, position, last, rows):
                    added, position = added + len(rows), last
                else:  # another follower moved it: go on from there
                    position = self.outbox.position(name)
        return added

    def _rows(self, part: SagaApplication, note: Any) -> list[dict[str, Any]]:
        name = event_name(note.topic)
        try:
            event = unopened(part.mapper, note)  # no sealed value is needed here
        except StoreUnavailableError:
            raise
        except Exception as e:  # one unreadable event must not stop the outbox
            log.error("notifications: skipping unreadable event %s of run %s: %s", note.id,
                      note.originator_id, e)
            return []
        kinds = kinds_of(name, event)
        run_id = str(note.originator_id)
        candidates = [t for t in [*self.targets, *self._targets_of(part, run_id)]
                      if any(k in t.events for k in kinds)]
        occurred = event.timestamp
        now = self.clock()
        deadline = occurred + timedelta(seconds=self.settings.horizon)
        if not candidates or deadline < now:
            return []
        try:
            run = part.get_run(run_id, version=note.originator_version)
        except StoreUnavailableError:
            raise
        except Exception as e:  # e.g. sealed inputs and no key here: said, passed over
            log.error("notifications: cannot read run %s at version %s: %s", run_id,
                      note.originator_version, e)
            return []
        labels = (run.context or {}).get("labels") or {}
        rows, seen = [], set()
        run_id = run.run_id  # the id commands and views use: its name, when it has one
        for target in candidates:
            kind = next((k for k in kinds if target.wants(k, run.name, labels)), None)
            if kind is None or target.url in seen:
                continue  # one notification per (event, URL): the first target naming it
            seen.add(target.url)
            event_id = f"{run_id}:{note.originator_version}"
            body: dict[str, Any] = {"id": event_id, "type": kind, "run_id": run_id,
                                    "definition": run.name,
                                    "status": _STATUS.get(kind, run.status),
                                    "occurred_at": _iso(occurred)}
            if getattr(event, "step_id", None):
                body["step_id"] = event.step_id
            if name != "ApprovalRequested" and _error_of(event) is not None:
                body["error"] = _error_of(event)
            if self.settings.url_of_runs:
                body["url_of_run"] = f"{self.settings.url_of_runs}/runs/{run_id}"
            rows.append({"id": notification_id(event_id, target.url), "event_id": event_id,
                         "target": target.url, "run_id": run_id, "type": kind,
                         "body": json.dumps(body, separators=(",", ":"), sort_keys=True),
                         "secret_env": target.secret_env,
                         "allow_insecure": int(target.allow_insecure), "status": "pending",
                         "attempts": 0, "created_at": _iso(now), "next_at": _iso(now),
                         "deadline": _iso(deadline), "lease_until": None, "leased_by": None,
                         "delivered_at": None, "last_error": None})
        return rows

    def _targets_of(self, part: SagaApplication, run_id: str) -> list[NotifyTarget]:
        """The run's own ``notify:`` targets (read once from its ``RunStarted``)."""
        if run_id not in self._own:
            if len(self._own) >= _CACHE:
                self._own.clear()
            stored = part.recorder.select_events(run_uuid(run_id), lte=1)
            started = unopened(part.mapper, stored[0]) if stored else None
            self._own[run_id] = definition_targets(getattr(started, "definition", None))
        return self._own[run_id]


class Notifier:
    """Derives and delivers notifications on a thread of its own (see the module)."""

    def __init__(self, app: SagaApplication, settings: Settings, worker_id: str, *,
                 poll: float = 0.5, env: Mapping[str, str] | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        """A notifier for ``app``'s store; ``env`` holds the targets' secrets (default
        ``os.environ``). ConfigError when saga.toml's notify settings are wrong."""
        self.settings = notify_settings(settings)
        self.worker_id, self.poll, self.clock = worker_id, poll, clock
        self.env = os.environ if env is None else env
        self.outbox = Outbox(settings)
        self.deriver = Deriver(app, self.outbox, self.settings, config_targets(settings), clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._senders = ThreadPoolExecutor(SENDERS, thread_name_prefix="saga-notify-send")

    def start(self) -> Notifier:
        """Start the notifier's thread."""
        self._thread = threading.Thread(target=self._loop, name="saga-notify", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 15.0, *, drain: bool = False) -> None:
        """Stop after the round in flight (whose sends finish), and close; ``drain``:
        one more round first (``saga worker --until-idle`` derives and sends what its
        drives made news of before it exits)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if drain:
            try:
                self.round()
            except Exception as e:  # what is left is sent by the next worker
                log.warning("notifications: the last round failed: %s", e)
        self._senders.shutdown(wait=False)
        self.outbox.close()

    def round(self) -> tuple[int, int]:
        """One round: derive, then send what is due. (derived, sent)."""
        derived = self.deriver.round()
        now = self.clock()
        lease = now + timedelta(seconds=self.settings.timeout + 30)
        claimed = self.outbox.claim(self.worker_id, _iso(now), _iso(lease), CLAIM)
        return derived, sum(self._senders.map(self._send, claimed))

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                derived, sent = self.round()
                failures = 0
            except (StoreUnavailableError, OperationalError) as e:
                # the store went away (or dropped this connection): as for a drive, one
                # line, and the next round reconnects
                failures += 1
                if failures == 1:
                    log.warning("notifications: %s; retrying with backoff", e)
                self._stop.wait(backoff(failures))
                continue
            except Exception:  # a bug must not take the worker down with it
                log.exception("notifications: a round failed; trying again")
                derived = sent = 0
            if not sent and not derived:
                self._stop.wait(self.poll)

    def _send(self, claimed: Claimed) -> int:
        """Send one claimed notification and record the attempt; 1 when delivered."""
        row = claimed.row
        problem = url_problem(row["target"], bool(row["allow_insecure"]))
        secret = self.env.get(row["secret_env"]) or ""
        code: int | None
        error: str | None
        if problem is not None:
            delivered, code, error = False, None, problem
        elif not secret:
            delivered, code, error = False, None, (f"{row['secret_env']} is not set in this "
                                                   "worker's environment: nothing was sent")
        else:
            body = row["body"].encode()
            headers = {"Saga-Event-Id": row["event_id"],
                       "Saga-Signature": signature(secret, int(self.clock().timestamp()), body)}
            answer = post(row["target"], body, headers, self.settings.timeout)
            delivered, code, error = answer.delivered, answer.status_code, answer.error
        now = self.clock()
        wait = min(self.settings.backoff_max, 2.0 ** min(claimed.attempt - 1, 30))
        retry_at = _iso(now + timedelta(seconds=wait))
        again = None if delivered or problem or retry_at > row["deadline"] else retry_at
        if not delivered:
            log.info("notification %s to %s: attempt %d failed: %s", row["id"], row["target"],
                     claimed.attempt, error)
        self.outbox.finish(claimed, self.worker_id, _iso(now), delivered=delivered,
                           status_code=code, error=error, next_at=again)
        return int(delivered)
