"""Notifications over HTTP, on a running ``saga serve`` whose own worker delivers them:
list, show, a run's own (what the viewer shows), retry, and a 404 for an unknown id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.server.conftest import Server
from tests.server.test_viewer import browser, shot, wait
from tests.worker.test_notify import SECRET, Receiver, docs_verify, free_port, until

__all__ = ["browser"]  # the fixture, used by name


def test_notifications_over_http(make_server: Callable[..., Server]) -> None:
    receiver = Receiver(free_port())
    receiver.start()
    server = make_server(HOOK_SECRET=SECRET)
    composition: dict[str, Any] = {
        "name": "told", "steps": [{"id": "a", "tool": "fail"}],
        "notify": [{"url": f"http://127.0.0.1:{receiver.port}/hook",
                    "events": ["run.failed"], "secret_env": "HOOK_SECRET"}]}
    try:
        with server.client() as c:
            run_id = c.post("/api/v1/runs", json={"composition": composition}).json()["run_id"]
            assert server.wait_for(c, run_id)["status"] == "failed"
            [sent] = until("the delivery", lambda: c.get(
                "/api/v1/notifications", params={"status": "delivered"}).json())
            assert (sent["type"], sent["run_id"], sent["attempts"]) == ("run.failed", run_id, 1)
            [mine] = c.get(f"/api/v1/runs/{run_id}/notifications").json()
            assert [a["outcome"] for a in mine["attempts_log"]] == ["delivered"]
            shown = c.get(f"/api/v1/notifications/{sent['id']}").json()
            assert shown["body"]["id"] == f"{run_id}:{shown['body']['id'].split(':')[1]}"
            [(_, headers, body)] = receiver.got
            assert docs_verify()(SECRET, headers["Saga-Signature"], body)

            again = c.post(f"/api/v1/notifications/{sent['id']}/retry")
            assert again.status_code == 200 and again.json()["status"] == "pending"
            until("the redelivery", lambda: len(receiver.got) == 2)
            assert c.get("/api/v1/notifications/0000ffff").status_code == 404
            assert c.get("/api/v1/notifications", params={"status": "lost"}).status_code == 422
            page = c.get(f"/runs/{run_id}", headers={"Accept": "text/html"}).text
            assert 'id="notifications-card"' in page
    finally:
        receiver.stop()


def test_the_viewer_shows_a_runs_notifications(make_server: Callable[..., Server],
                                               browser: Any) -> None:
    receiver = Receiver(free_port())
    receiver.answers["/down"] = (503, {})
    receiver.start()
    server = make_server(HOOK_SECRET=SECRET)
    hooks = [{"url": f"http://127.0.0.1:{receiver.port}/{path}", "events": ["run.failed"],
              "secret_env": "HOOK_SECRET"} for path in ("up", "down")]
    try:
        with server.client() as c:
            run_id = c.post("/api/v1/runs", json={"composition": {
                "name": "shown", "steps": [{"id": "a", "tool": "fail"}],
                "notify": hooks}}).json()["run_id"]
            server.wait_for(c, run_id)
        browser.get(server.page(f"/runs/{run_id}"))
        delivered = wait(browser, '#notifications tr[data-status="delivered"]')[0]
        pending = wait(browser, '#notifications tr[data-status="pending"]')[0]
        # the card opens by itself: a notification is not delivered yet
        assert "run.failed" in delivered.text and "/up" in delivered.text
        assert "HTTP 503" in pending.text and "/down" in pending.text
        shot(browser, "run-notifications.png")
    finally:
        receiver.stop()
