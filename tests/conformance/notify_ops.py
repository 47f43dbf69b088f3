"""The conformance simulator's notifications (issue 42): the **notified** invariant.

Every simulation configures one webhook for every kind of news (``saga.toml`` in the
simulation's folder, which every process it starts reads) to a receiver in this process
that refuses each event's first request (503), so each notification is tried at least
twice while workers are killed, stopped, restarted and taken over. When the run is over,
a notifier in this process sends what is still due (waiting, bounded, for attempts due
soon; a delivery leased to a process gone must come back at once, not after its lease),
then the log, the outbox and the receiver must agree, by an oracle of news written apart
from ``saga.worker.notify``:

- derived exactly once: each event that is news has exactly one notification, keyed by
  its id (``<run id>:<version>``), and nothing else has one;
- delivered at least once: each was received, signed with the secret, with the body the
  outbox holds;
- every attempt recorded: a notification was received no more often than its attempts
  say it was tried, and it is ``delivered``.
"""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from saga.api import Saga
from saga.config import load_settings
from saga.store.outbox import Outbox
from saga.worker.notify import Notifier

SECRET = "sim-hook-secret"
#: News by event, as the documentation lists it (the oracle's own table).
NEWS = {"RunCompleted": "run.completed", "RunFailed": "run.failed",
        "RunCompensated": "run.compensated", "RunCancelled": "run.cancelled",
        "ApprovalRequested": "run.waiting", "StepFailed": "step.failed",
        "CompensationFailed": "compensation.failed"}


def _news(e: dict[str, Any]) -> bool:
    """True when an event (``saga history --json``'s) is news of some kind."""
    if e["type"] == "StepWaiting":  # a wait for a signal; a timer or a child run is not
        return bool(e["payload"].get("signal")) and not e["payload"].get("child")
    return e["type"] in NEWS


class Receiver:
    """The webhook: records each request; refuses the first of each event."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str, bytes]] = []  # (event id, signature, body)
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                event = self.headers.get("Saga-Event-Id", "")
                with outer._lock:
                    first = all(e != event for e, _, _ in outer.got)
                    outer.got.append((event, self.headers.get("Saga-Signature", ""), body))
                self.send_response(503 if first else 200)
                self.end_headers()

            def log_message(self, *_: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def configure(sim: Any) -> Receiver:
    """Start the receiver and point the simulation's processes at it."""
    receiver = Receiver()
    (sim.dir / "saga.toml").write_text(f"""
[[notify]]
url = "http://127.0.0.1:{receiver.port}/sim"
events = {json.dumps(sorted(set(NEWS.values()) | {"run.quarantined"}))}
secret_env = "SIM_HOOK_SECRET"

[notifications]
backoff_max = "0.2s"
""", encoding="utf-8")
    sim.env["SIM_HOOK_SECRET"] = SECRET
    return receiver


def _signed(header: str, body: bytes) -> bool:
    fields = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    mac = hmac.new(SECRET.encode(), fields.get("t", "").encode() + b"." + body,
                   hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, fields.get("v1", ""))


#: How long the drain waits for what is still pending: each attempt is due within
#: ``backoff_max`` (0.2 s) of the last, and a delivery leased to a process gone must come
#: back at once (its liveness lock went with it), so this is well under a lease's length
#: (the request timeout + 30 s): a lease left to lapse is a violation, not waited out.
DRAIN_SECONDS = 30.0


def _drain(saga: Saga, seconds: float = DRAIN_SECONDS) -> dict[str, str]:
    """Derive and send what is still due from this process (the simulation's workers
    are gone), with the simulation's saga.toml (its settings carry the [[notify]]), until
    nothing is pending or ``seconds`` passed; then why each event still pending is (its
    last look: a lease held and whose, or when its next attempt is due)."""
    notifier = Notifier(saga.app, saga.settings, "sim-drain", env={"SIM_HOOK_SECRET": SECRET})
    outbox = Outbox(saga.settings)
    try:
        deadline = time.monotonic() + seconds
        while True:
            notifier.round()
            pending = outbox.listing("pending", limit=None)
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        now = datetime.now(UTC)
        return {row["event_id"]: _why(row, now, seconds) for row in pending}
    finally:
        notifier.stop()
        outbox.close()


def _why(row: dict[str, Any], now: datetime, seconds: float) -> str:
    """Why a notification is still pending after the drain, as its row says."""
    def after(iso: str) -> str:
        return f"{(datetime.fromisoformat(iso) - now).total_seconds():+.1f}s"

    tried, waited = f"{row['attempts']} attempts", f"after {seconds:.0f}s of draining"
    if row["lease_until"] and row["lease_until"] > now.isoformat(timespec="microseconds"):
        return (f"{tried}; {waited} still leased to {row['leased_by']} (a process gone) "
                f"until {after(row['lease_until'])}: a dead holder's lease not taken back")
    if row["next_at"] <= now.isoformat(timespec="microseconds"):
        return f"{tried}; {waited} due since {after(row['next_at'])}, and not claimed"
    return f"{tried}; {waited} its next attempt is due only at {after(row['next_at'])}"


def check(sim: Any, histories: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The notified invariant's violations (see the module's docs)."""
    receiver: Receiver | None = getattr(sim, "receiver", None)
    if receiver is None:
        return []
    try:
        with Saga(load_settings(sim.env, cwd=sim.dir)) as saga:
            stuck = _drain(saga)
            rows = {n["id"]: saga.notification(n["id"])
                    for n in saga.notifications(limit=None)}
    finally:
        receiver.stop()
    bad: list[str] = []
    expected = {f"{run_id}:{e['version']}" for run_id, h in histories.items() for e in h
                if _news(e)}
    derived = Counter(n["event_id"] for n in rows.values())
    for event in sorted(expected - set(derived)):
        bad.append(f"notified: event {event} is news, but no notification was derived")
    for event, count in sorted(derived.items()):
        if event not in expected and event.split(":")[0] in histories:
            bad.append(f"notified: a notification of {event}, which is no news")
        if count != 1:
            bad.append(f"notified: event {event} was derived {count} times")
    heard = Counter(event for event, _, _ in receiver.got)
    for n in rows.values():
        if n["status"] != "delivered" or not heard[n["event_id"]]:
            why = f"; {stuck[n['event_id']]}" if n["event_id"] in stuck else ""
            bad.append(f"notified: {n['event_id']} ({n['type']}) is {n['status']} and was "
                       f"received {heard[n['event_id']]} times (last error: "
                       f"{n['last_error']}){why}")
        if heard[n["event_id"]] > n["attempts"]:
            bad.append(f"notified: {n['event_id']} was received {heard[n['event_id']]} times "
                       f"but {n['attempts']} attempts are recorded")
    bodies = {n["event_id"]: n["body"] for n in rows.values()}
    for event, signature, body in receiver.got:
        if not _signed(signature, body):
            bad.append(f"notified: a request for {event} is not signed with the secret")
        elif event in bodies and json.loads(body) != bodies[event]:
            bad.append(f"notified: {event} was sent a body that is not the outbox's")
    return bad
