"""The http tool against a real HTTP server on loopback."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from saga.config import Settings
from saga.errors import ToolError
from saga.tools.http import make_tool
from tests.tools.test_common import FAIL, call, chain, ctx, engine, undo

TOOL = make_tool({})


class Server:
    """A loopback server that records every request it receives."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes = b"",
                       ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("X-Seen", str(len(recorder.requests)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(size).decode() if size else ""
                recorder.requests.append({"method": self.command, "path": self.path,
                                          "headers": dict(self.headers), "body": body})
                path = self.path.split("?")[0]
                if path == "/json":
                    self._reply(200, json.dumps({"ok": True, "items": [1, 2]}).encode())
                elif path == "/problem":
                    self._reply(200, b'{"type": "x"}', "application/problem+json; charset=utf-8")
                elif path == "/text":
                    self._reply(200, b"hello", "text/plain; charset=utf-8")
                elif path == "/empty":
                    self._reply(200, b"")
                elif path == "/broken":
                    self._reply(500, b'{"error": "boom"}')
                elif path == "/busy":
                    self._reply(429, b"slow down", "text/plain")
                elif path == "/big":
                    self._reply(200, b"x" * 5000, "text/plain")
                elif path == "/away":  # to another origin: the URL in the query
                    self.send_response(302)
                    self.send_header("Location", self.path.split("to=", 1)[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", "/json")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif path == "/items" and self.command == "POST":
                    self._reply(201, json.dumps({"id": 7, "got": json.loads(body)}).encode())
                elif path.startswith("/items/") and self.command == "DELETE":
                    self._reply(204)
                elif path == "/echo":
                    self._reply(200, json.dumps({"body": body, "query": self.path}).encode())
                else:
                    self._reply(404, b"not here", "text/plain")

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)

    def paths(self) -> list[str]:
        return [f"{r['method']} {r['path']}" for r in self.requests]


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


def test_json_and_text_bodies_are_parsed_by_content_type(server: Server) -> None:
    out = call(TOOL, {"url": f"{server.url}/json"})
    assert out["status"] == 200
    assert out["body"] == {"ok": True, "items": [1, 2]}
    assert out["headers"]["content-type"] == "application/json"
    assert call(TOOL, {"url": f"{server.url}/problem"})["body"] == {"type": "x"}
    text = call(TOOL, {"url": f"{server.url}/text"})
    assert text["body"] == "hello" and text["headers"]["content-type"].startswith("text/plain")
    assert call(TOOL, {"url": f"{server.url}/empty"})["body"] is None
    assert call(TOOL, {"url": f"{server.url}/redirect"})["body"]["ok"] is True


def test_request_bodies_headers_and_query(server: Server) -> None:
    out = call(TOOL, {"method": "post", "url": f"{server.url}/items", "json": {"name": "a"},
                      "headers": {"X-Team": "billing"}}, ctx("create"))
    assert out["status"] == 201 and out["body"] == {"id": 7, "got": {"name": "a"}}
    sent = server.requests[-1]
    assert sent["headers"]["X-Team"] == "billing"
    assert sent["headers"]["Idempotency-Key"] == "r1:create:0"
    assert sent["headers"]["Content-Type"] == "application/json"
    out = call(TOOL, {"method": "PUT", "url": f"{server.url}/echo", "body": "raw text",
                      "params": {"q": "x y"}, "idempotency_key": False})
    assert out["body"] == {"body": "raw text", "query": "/echo?q=x+y"}
    assert "Idempotency-Key" not in server.requests[-1]["headers"]
    call(TOOL, {"url": f"{server.url}/json"})
    assert "Idempotency-Key" not in server.requests[-1]["headers"]


def test_unexpected_statuses_fail_with_retryable_flags(server: Server) -> None:
    cases = [("/missing", 404, False), ("/broken", 500, True), ("/busy", 429, True)]
    for path, status, retryable in cases:
        with pytest.raises(ToolError) as failed:
            call(TOOL, {"url": f"{server.url}{path}"})
        assert failed.value.error_type == "HTTPStatus"
        assert failed.value.retryable is retryable
        assert failed.value.details["status"] == status
        assert f"returned {status}" in str(failed.value)
    with pytest.raises(ToolError, match=r"returned 500 Internal Server Error: .*boom"):
        call(TOOL, {"url": f"{server.url}/broken"})
    assert call(TOOL, {"url": f"{server.url}/missing", "expect": [404]})["body"] == "not here"
    with pytest.raises(ToolError, match="returned 200"):
        call(TOOL, {"url": f"{server.url}/json", "expect": [201]})


def test_connection_errors_are_retryable_http_errors() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(ToolError) as refused:
        call(TOOL, {"url": f"http://127.0.0.1:{port}/", "timeout": 2})
    assert refused.value.error_type == "HTTPError" and refused.value.retryable is True
    with pytest.raises(ToolError) as bad_url:
        call(TOOL, {"url": "ftp://example.invalid/x"})
    assert bad_url.value.error_type == "HTTPError" and bad_url.value.retryable is False


def test_parameters_are_checked() -> None:
    assert TOOL.check_parameters({"method": "GET"}) == ["missing required parameter 'url'"]
    assert TOOL.check_parameters({"url": "u", "method": "FETCH"}) == [
        "method 'FETCH' is not one of GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"]
    assert TOOL.check_parameters({"url": "u", "undo": {"method": "DELETE"}}) == [
        "undo: missing required key 'url'"]
    assert TOOL.check_parameters({"url": "u", "expect": ["2xx"]}) == [
        "expect[0]: expected integer, got string"]
    assert TOOL.check_parameters({"url": "{{ inputs.url }}", "method": "{{ inputs.m }}",
                                  "undo": {"url": "{{ inputs.url }}"}}) == []


def test_the_undo_request_is_the_compensation(server: Server) -> None:
    params = {"method": "POST", "url": f"{server.url}/items", "json": {"name": "a"},
              "undo": {"method": "DELETE", "url": f"{server.url}/items/7", "expect": [204]}}
    output = call(TOOL, params)
    assert undo(TOOL, params, output)["status"] == 204
    assert server.paths() == ["POST /items", "DELETE /items/7"]
    assert server.requests[-1]["headers"]["Idempotency-Key"] == "r1:s:0:compensate"
    with pytest.raises(ToolError) as nothing:
        undo(TOOL, {"url": f"{server.url}/json"}, output)
    assert nothing.value.error_type == "NoCompensation"


def test_engine_sends_the_undo_when_a_later_step_fails(server: Server,
                                                       sqlite_settings: Settings) -> None:
    with engine(sqlite_settings) as s:
        run = s.run(s.load(chain(
            {"id": "create", "tool": "http", "compensate": True,
             "args": {"method": "POST", "url": f"{server.url}/items", "json": {"n": 1},
                      "undo": {"method": "DELETE", "url": f"{server.url}/items/7"}}},
            {"id": "note", "tool": "http", "args": {"method": "POST", "url": f"{server.url}/items",
                                                    "json": {"n": 2}},
             "compensate": {"tool": "http", "args": {
                 "method": "DELETE", "url": server.url + "/items/{{ output.body.id }}"}}},
            FAIL)))
    assert run.status == "compensated"
    assert server.paths() == ["POST /items", "POST /items", "DELETE /items/7",
                              "DELETE /items/7"]
    keys = [r["headers"].get("Idempotency-Key") for r in server.requests]
    assert keys == [f"{run.run_id}:create:0", f"{run.run_id}:note:0",
                    f"{run.run_id}:note:0:compensate", f"{run.run_id}:create:0:compensate"]
    assert run.steps["create"]["output"]["body"] == {"id": 7, "got": {"n": 1}}


def test_a_redirect_to_another_origin_carries_no_credentials(server: Server) -> None:
    other = Server()
    other.thread.start()
    try:
        secret_headers = {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y",
                          "Cookie": "session=1", "Accept": "application/json"}
        out = call(TOOL, {"url": f"{server.url}/away?to={other.url}/json",
                          "headers": secret_headers})
        assert out["status"] == 200
        sent = {k.lower() for k in other.requests[0]["headers"]}
        assert not {"authorization", "x-api-key", "cookie"} & sent
        assert "accept" in sent
        same = call(TOOL, {"url": f"{server.url}/redirect", "headers": secret_headers})
        assert same["status"] == 200
        assert server.requests[-1]["headers"].get("X-Api-Key") == "k3y"  # same origin: kept
    finally:
        other.httpd.shutdown()
        other.httpd.server_close()


def test_a_large_body_is_recorded_cut_and_says_so(server: Server) -> None:
    out = call(TOOL, {"url": f"{server.url}/big", "max_body_bytes": 1000})
    assert out["truncated"] is True and out["body_bytes"] == 5000
    assert out["body"] == "x" * 1000
    full = call(TOOL, {"url": f"{server.url}/big"})
    assert full["body"] == "x" * 5000 and "truncated" not in full
