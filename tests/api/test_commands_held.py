"""A command that is recorded stands, whoever then drives the run.

``saga cancel`` (retry, compensate) appends its event and then drives the run here. When a
live worker holds the run's lease, or appends first, that worker takes the command in and
carries it out (saga.executor.incoming): the command succeeded, so it must not report
failure (the conformance simulator's long mode saw exit 5 for a cancel that had landed).
"""

from __future__ import annotations

from dataclasses import replace

from saga.api import Saga
from saga.config import Settings
from saga.store.leases import lease_key
from saga.tools import Registry


def test_a_cancel_a_live_holder_carries_out_is_reported_as_recorded(
        sqlite_settings: Settings, registry: Registry) -> None:
    with Saga(replace(sqlite_settings, lease_seconds=0.5), registry=registry) as saga:
        run = saga.submit(saga.load({"name": "held", "steps": [
            {"id": "a", "tool": "noop", "compensate": {"tool": "noop"}}]}))
        assert saga.leases.claim(lease_key(run.run_id), "a-live-worker", 30)
        after = saga.cancel(run.run_id, reason="not wanted")  # no LeaseHeldError
        assert after.compensation is not None and after.compensation.get("cancel")
        assert [e["type"] for e in saga.history(run.run_id)][-1] == "CompensationStarted"
        assert saga.leases.holder(lease_key(run.run_id))[0] == "a-live-worker"  # type: ignore[index]
