"""Attacks as a browser makes them: chromium, signed in to a local ``saga serve``, opens
a page of another web app on another port (the same site to a browser, another origin),
which tries to read the session, change a run and listen to the events."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.support.ui import WebDriverWait

from tests.server.conftest import Server
from tests.server.test_viewer import browser, wait  # noqa: F401 (the fixture)

ATTACK = """<!doctype html><title>cat pictures</title><pre id="out"></pre><script>
var T = "http://%(target)s", out = {cookie: document.cookie, ws: 0, done: 0};
function done() { if (++out.done === 4)
  document.getElementById("out").textContent = JSON.stringify(out); }
// a change as any page can send it: no-cors, with whatever cookies the browser has
fetch(T + "/api/v1/runs/%(run)s/cancel", {method: "POST", mode: "no-cors",
  credentials: "include"}).then(done, done);
fetch(T + "/api/v1/runs/%(run)s/approve/ask", {method: "POST", mode: "no-cors",
  credentials: "include", headers: {"Content-Type": "text/plain"}, body: "{}"}).then(done, done);
// reading: CORS forbids it unless the service allowed it
fetch(T + "/api/v1/runs", {credentials: "include"}).then(function (r) { return r.text(); })
  .then(function (t) { out.read = t.slice(0, 80); done(); },
        function () { out.read = null; done(); });
var ws = new WebSocket("ws://%(target)s/ws?after=0");
ws.onmessage = function () { out.ws += 1; };
ws.onclose = function (e) { out.closed = e.code; done(); };
</script>"""


@pytest.fixture
def attacker() -> Iterator[tuple[ThreadingHTTPServer, dict[str, str]]]:
    """Another web app on loopback, on a port of its own, serving one page."""
    page: dict[str, str] = {}

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page["html"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, page
    httpd.shutdown()


def test_another_local_page_cannot_drive_the_viewers_session(
        make_server: Any, browser: webdriver.Chrome,  # noqa: F811 (the fixture)
        attacker: tuple[ThreadingHTTPServer, dict[str, str]]) -> None:
    server: Server = make_server()
    gated = {"name": "gated", "steps": [{"id": "ask", "tool": "echo", "confirm": "ok?"}]}
    with server.client() as c:
        run_id = c.post("/api/v1/runs", json={"composition": gated}).json()["run_id"]
        server.wait_for(c, run_id, lambda r: bool(r.get("waiting_for")))
    browser.get(server.page(f"/runs/{run_id}"))  # the operator signs in once
    wait(browser, '[data-approval="ask"]')
    httpd, page = attacker
    port = httpd.server_address[1]
    for origin, target in ((f"127.0.0.1:{port}", f"127.0.0.1:{server.port}"),
                           (f"localhost:{port}", f"localhost:{server.port}")):
        page["html"] = ATTACK % {"target": target, "run": run_id}
        browser.get(f"http://{origin}/")
        text = WebDriverWait(browser, 20).until(
            lambda d: d.find_element("id", "out").text or False)
        seen = json.loads(text)
        assert "saga_session" not in seen["cookie"] and server.token not in seen["cookie"]
        assert seen["read"] is None, seen  # nothing read across origins
        assert seen["ws"] == 0 and seen["closed"] != 1000, seen  # the socket was refused
        with server.client() as c:
            assert c.get(f"/api/v1/runs/{run_id}").json()["status"] == "waiting"
    # the operator's own page still works: the approval goes through, with its CSRF token
    browser.get(server.url + f"/runs/{run_id}")
    wait(browser, '[data-approval="ask"] button[data-action="approve"]')[0].click()
    wait(browser, 'dialog#ask[open] [data-answer="yes"]')[0].click()
    wait(browser, "#summary .s-completed")
