"""A notification leased to a worker whose process died is sent again at once, not after
its lease: the claim treats a lease whose worker registered its liveness, and whose lock
is gone, as lapsed (SQLite and PostgreSQL, the dead worker a real process SIGKILLed),
also once another worker's clean stop has forgotten the dead one's registration (it
holds no run's lease: the conformance simulator's churn found such a delivery left
pending for its whole lease)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from saga import Saga
from saga.config import Settings
from saga.store.leases import Leases
from saga.store.liveness import Liveness
from saga.store.outbox import Outbox
from saga.store.side_tables import Database
from saga.worker.notify import Notifier
from tests.worker.test_notify import ROOT, SECRET, Receiver, env_of, free_port

#: A worker that registers its liveness, claims every due notification for ten minutes
#: and says how many, then sends nothing (the test kills it mid-send).
CLAIMER = textwrap.dedent("""
    import sys, time
    from datetime import UTC, datetime, timedelta
    from saga.config import load_settings
    from saga.store.leases import Leases
    from saga.store.liveness import Liveness
    from saga.store.outbox import Outbox
    from saga.store.side_tables import Database
    settings = load_settings()
    leases = Leases(Database(settings))
    Liveness(leases.db, "dead", leases.bindings).start(5)
    now = datetime.now(UTC)
    claimed = Outbox(settings).claim("dead", now.isoformat(timespec="microseconds"),
        (now + timedelta(minutes=10)).isoformat(timespec="microseconds"), 8)
    print(len(claimed), flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("forgotten", [False, True], ids=["registered", "forgotten"])
def test_a_dead_workers_notification_is_sent_again_at_once(settings: Settings, tmp_path: Path,
                                                           forgotten: bool) -> None:
    port = free_port()
    receiver = Receiver(port)
    receiver.start()
    settings = replace(settings, file={"notify": [
        {"url": f"http://127.0.0.1:{port}/h", "events": ["run.failed"],
         "secret_env": "HOOK_SECRET"}]})
    config = tmp_path / "saga.toml"
    config.write_text("")
    saga = Saga(settings)
    notifier = Notifier(saga.app, settings, "alive", env={"HOOK_SECRET": SECRET})
    claimer = None
    try:
        saga.run(saga.load({"name": "dies", "steps": [{"id": "a", "tool": "fail"}]}))
        saga.leases  # noqa: B018 - the side tables exist before the claimer starts
        assert notifier.deriver.round() == 1
        claimer = subprocess.Popen([sys.executable, "-c", CLAIMER], cwd=ROOT,
                                   env=env_of(settings, config), stdout=subprocess.PIPE,
                                   text=True)
        assert claimer.stdout is not None
        assert claimer.stdout.readline().strip() == "1"  # leased to "dead" for 10 min
        assert notifier.round() == (0, 0)  # its worker is alive: not sent
        claimer.send_signal(signal.SIGKILL)
        claimer.wait()
        if forgotten:  # another worker stops cleanly: "dead" holds no run's lease
            db = Database(settings)
            other = Liveness(Leases(db).db, "other")
            other.start(5)
            other.stop()
            assert not db.query("SELECT worker FROM saga_workers WHERE worker = 'dead'")
            db.close()
        # Its lock went with it: the notification is due again now, its lease unexpired.
        assert notifier.round() == (0, 1)
        [row] = Outbox(settings).listing()
        assert row["lease_until"] is None or row["lease_until"] < datetime.now(UTC).isoformat()
        shown = saga.notification(row["id"])
        assert [(a["attempt"], a["worker"], a["outcome"]) for a in shown["attempts_log"]] == [
            (1, "dead", "interrupted"), (2, "alive", "delivered")]
        assert len(receiver.got) == 1
    finally:
        if claimer is not None and claimer.poll() is None:
            claimer.kill()
            claimer.wait()
        notifier.stop()
        saga.close()
        receiver.stop()
