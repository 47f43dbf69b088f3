"""What a web page, a rebound DNS name or a slow client can do to a local ``saga serve``:
nothing. Each attack as a plain client sends it (the browser's own are in
test_browser_attacks.py)."""

from __future__ import annotations

import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.server.conftest import Server


def test_a_forged_host_reaches_nothing(make_server: Any, tmp_path: Path) -> None:
    """DNS rebinding: a page of attacker.example, now resolving to 127.0.0.1, sends its
    own name as Host. Even with the token, nothing is answered or started."""
    server = make_server()
    written = tmp_path / "pwned"
    step = {"name": "rebind", "steps": [{"id": "w", "tool": "file", "args": {
        "action": "write", "path": str(written), "content": "x"}}]}
    with server.client(Host="attacker.example:8080") as rebound:
        started = rebound.post("/api/v1/runs", json={"composition": step})
        assert started.status_code == 421, started.text
        assert rebound.get("/api/v1/runs").status_code == 421
        assert rebound.get("/").status_code == 421
    with server.client(Host=f"localhost:{server.port}") as local:  # loopback's own names
        assert local.get("/api/v1/runs").status_code == 200
        assert local.get("/api/v1/runs").headers["x-content-type-options"] == "nosniff"
    assert not written.exists()


def test_the_browser_session_is_not_the_token(make_server: Any) -> None:
    """Signing in hands out a random HttpOnly SameSite=Strict session id; its changes need
    the CSRF token and this origin; a body-less simple POST changes nothing; sessions are
    listed and revoked; another origin's socket or stream gets nothing."""
    server = make_server()
    with server.client() as c:
        gated = {"name": "gated", "steps": [{"id": "ask", "tool": "echo", "confirm": "ok?"}]}
        run_id = c.post("/api/v1/runs", json={"composition": gated}).json()["run_id"]
        server.wait_for(c, run_id, lambda r: bool(r.get("waiting_for")))
    signed = httpx.get(server.page("/"))
    assert signed.status_code == 303 and signed.headers["location"] == "/"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and server.token not in cookie
    assert "Secure" not in cookie  # plain HTTP on loopback
    session = re.match(r"saga_session=([^;]+)", cookie).group(1)  # type: ignore[union-attr]
    own = server.url
    with httpx.Client(base_url=server.url, cookies={"saga_session": session}) as browser:
        page = browser.get("/")
        assert page.status_code == 200
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        # Swagger UI comes from its CDN: /docs alone may load it
        assert "cdn.jsdelivr.net" in browser.get("/docs").headers["content-security-policy"]
        assert "cdn.jsdelivr.net" not in page.headers["content-security-policy"]
        csrf = browser.get("/api/v1/session").json()["csrf"]
        cancel = f"/api/v1/runs/{run_id}/cancel"
        # what any page can send: a form or a no-cors fetch, with the cookie (same site)
        assert browser.post(cancel, headers={"Origin": "http://127.0.0.1:1"}).status_code == 403
        assert browser.post(cancel, headers={"Content-Type": "text/plain"}).status_code == 403
        assert browser.post(cancel, headers={"X-Saga-CSRF": csrf,
                                             "Origin": "http://localhost:1"}).status_code == 403
        assert browser.get(f"/api/v1/runs/{run_id}").json()["status"] == "waiting"
        with httpx.Client() as anyone:  # no cookie, no token: a simple POST
            assert anyone.post(own + cancel).status_code in (401, 415)
        report = browser.get("/api/v1/report?format=html")
        assert report.headers["content-disposition"].startswith("attachment")
        listed = httpx.get(own + "/api/v1/sessions", headers=server.auth).json()
        assert len(listed) == 1 and session.startswith(listed[0]["id"])
        approve = browser.post(f"/api/v1/runs/{run_id}/approve/ask",
                               headers={"X-Saga-CSRF": csrf, "Origin": own,
                                        "Content-Type": "application/json"})
        assert approve.status_code == 200, approve.text
        assert httpx.delete(own + f"/api/v1/sessions/{listed[0]['id']}",
                            headers=server.auth).status_code == 200
        assert browser.get("/api/v1/runs").status_code == 401  # revoked
    ws = server.url.replace("http", "ws") + "/ws"
    try:
        with connect(ws, origin="http://127.0.0.1:1", additional_headers=server.auth) as s:  # type: ignore[arg-type]
            s.recv(timeout=5)
        raise AssertionError("another origin's socket was served")
    except (InvalidStatus, Exception) as refused:
        assert "4403" in str(refused) or "403" in str(refused)


def test_serve_without_a_token_makes_one_for_this_user(make_server: Any) -> None:
    """No token configured: the server makes one, keeps it 0600 under the saga home,
    prints a sign-in URL once, and answers nobody without it."""
    server: Server = make_server()
    kept = server.settings.home / "serve-token"
    assert stat.S_IMODE(os.stat(kept).st_mode) == 0o600
    with server.client(None) as anonymous:
        assert anonymous.get("/api/v1/runs").status_code == 401
        assert anonymous.get("/api/v1/health").status_code == 200
    with server.client() as c:
        assert c.get("/api/v1/runs").status_code == 200
    server.stop()
    printed = server.proc.stdout.read()  # type: ignore[union-attr]
    assert printed.count(f"/?token={server.token}") == 1


def test_a_slow_header_sender_is_cut_off(make_server: Any) -> None:
    """A slowloris: a header line every 3 s. The server closes the connection at its header
    deadline instead of waiting for ever."""
    server = make_server(SAGA_SERVE_HEADER_SECONDS="2")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.setblocking(False)
        closed_after = None
        for line in range(4):
            time.sleep(3)  # the attack's own pace
            try:
                sock.sendall(f"X-Slow-{line}: 1\r\n".encode())
                if sock.recv(1) == b"":  # the server closed the connection
                    closed_after = line
                    break
            except BlockingIOError:  # still open, nothing said
                continue
            except ConnectionError:
                closed_after = line
                break
        assert closed_after is not None and closed_after <= 1


def test_odd_event_ids_and_deep_bodies_are_the_callers_error(sqlite_server: Server) -> None:
    """``Last-Event-ID: ²``, 5,000 digits or 20 digits, and a body nested 500 deep, each a
    422 at once (not a 500, nor a stream that retries in silence)."""
    deep: dict[str, Any] = {}
    for _ in range(500):
        deep = {"a": deep}
    with sqlite_server.client() as c:
        run_id = c.post("/api/v1/runs", json={"template": "quickstart"}).json()["run_id"]
        for last in ("²".encode("latin-1"), b"9" * 5000, b"9" * 20):
            answer = c.get(f"/api/v1/runs/{run_id}/events", timeout=10,
                           headers={"Accept": "text/event-stream", "Last-Event-ID": last})
            assert answer.status_code == 422, answer.text
            assert "Last-Event-ID" in answer.json()["detail"]
        assert c.get("/api/v1/events?after=" + "9" * 20).status_code == 422
        composition = {"name": "deep", "steps": [{"id": "a", "tool": "echo", "args": deep}]}
        assert c.post("/api/v1/runs", json={"composition": composition}).status_code == 422
        assert c.post("/api/v1/runs", json={"template": "quickstart",
                                            "inputs": deep}).status_code == 422


def test_sessions_expire_and_are_revoked_by_the_listed_id() -> None:
    from saga.server.browser import Sessions

    now = [1000.0]
    sessions = Sessions(seconds=60, clock=lambda: now[0])
    first, second = sessions.open("t", "chromium"), sessions.open("t")
    assert sessions.get(first.id) is first and first.csrf != first.id
    listed = [s.to_json() for s in sessions.all()]
    assert [s["id"] for s in listed] == [first.id[:12], second.id[:12]]
    assert all(set(s) == {"id", "created", "expires", "agent"} for s in listed)  # no token
    assert sessions.revoke(first.id[:4]) == 0  # too short to name one
    assert sessions.revoke(first.id[:12]) == 1 and sessions.get(first.id) is None
    now[0] += 61
    assert sessions.get(second.id) is None and sessions.all() == []
