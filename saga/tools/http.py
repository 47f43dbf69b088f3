"""The ``http`` tool: one HTTP request with httpx.

Parameters:
    method: default ``GET``.
    url: required.
    headers: a mapping of header names to values.
    params: query parameters (a mapping).
    json: a JSON body; or ``body``: a text body (not both).
    timeout: seconds (default 30).
    expect: the statuses that count as success (default: any 2xx).
    follow_redirects: default true.
    idempotency_key: send ``Idempotency-Key: <ctx.idempotency_key>`` (the same on every
        attempt; ``...:compensate`` for the undo) unless the headers set one; default true
        for every method but GET, HEAD and OPTIONS.
    undo: the request the tool's own compensation sends (``compensate: true``):
        ``{method, url, headers, params, json | body, expect, timeout}``. It is rendered
        with the step's parameters, before the step runs; to use the response, write an
        explicit compensate block instead (``compensate: {tool: http, args: {url:
        "https://api/items/{{ output.body.id }}", method: DELETE}}``).

With tracing on, the request carries the step's span as a W3C ``traceparent`` header
(unless the headers set one), so the server's spans join the run's trace.

Output: ``{"status", "headers", "body"}``; the body is parsed JSON when the response says
it is JSON (``application/json`` or ``+json``), otherwise text.

Errors: ``HTTPStatus`` for a status outside ``expect`` (retryable for 5xx and 429, not for
other statuses; ``details`` holds status and body), ``HTTPError`` for connection
problems and timeouts (retryable; not for a malformed URL).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from saga.errors import ToolError
from saga.tools.base import Tool, ToolContext
from saga.tools.schema import is_template

if TYPE_CHECKING:
    import httpx

_REQUEST: dict[str, Any] = {
    "method": {"type": "string"},
    "url": {"type": "string", "minLength": 1},
    "headers": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
    "params": {"type": "object"},
    "json": {},
    "body": {"type": "string"},
    "timeout": {"type": "number", "minimum": 0},
    "expect": {"type": "array", "items": {"type": "integer"}},
    "follow_redirects": {"type": "boolean"},
    "idempotency_key": {"type": "boolean"},
    "max_body_bytes": {"type": "integer", "minimum": 1},
}

PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        **_REQUEST,
        "undo": {"type": "object", "properties": _REQUEST, "required": ["url"],
                 "additionalProperties": False},
    },
    "required": ["url"],
    "additionalProperties": False,
}


METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")


def _check(params: dict[str, Any]) -> list[str]:
    problems = []
    for where, spec in (("", params), ("undo: ", params.get("undo"))):
        if not isinstance(spec, dict):
            continue
        if "json" in spec and "body" in spec:
            problems.append(f"{where}give either json or body, not both")
        method = spec.get("method")
        if isinstance(method, str) and not is_template(method) and method.upper() not in METHODS:
            problems.append(f"{where}method {method!r} is not one of {', '.join(METHODS)}")
    return problems


async def request(spec: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Send the request ``spec`` describes; the output dict or ToolError."""
    method = str(spec.get("method") or "GET").upper()
    headers = {str(k): str(v) for k, v in dict(spec.get("headers") or {}).items()}
    use_key = spec.get("idempotency_key")
    if use_key is None:
        use_key = method not in ("GET", "HEAD", "OPTIONS")
    if use_key and not any(k.lower() == "idempotency-key" for k in headers):
        headers["Idempotency-Key"] = ctx.idempotency_key
    if ctx.traceparent and not any(k.lower() == "traceparent" for k in headers):
        headers["traceparent"] = ctx.traceparent  # the call's span, when tracing is on
    kwargs: dict[str, Any] = {"headers": headers}
    if spec.get("params"):
        kwargs["params"] = {str(k): v for k, v in dict(spec["params"]).items()}
    if "json" in spec:
        kwargs["json"] = spec["json"]
    elif spec.get("body") is not None:
        kwargs["content"] = str(spec["body"]).encode()
    timeout = float(spec.get("timeout") or 30)
    url = str(spec.get("url") or "")
    import httpx  # a network client: loaded when a step first calls it, not with saga

    limit = int(spec.get("max_body_bytes") or MAX_BODY)
    try:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as c:
            response, content, size = await _exchange(
                c, method, url, kwargs, bool(spec.get("follow_redirects", True)), limit)
    except (httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
        raise ToolError(f"{method} {url}: {e}", error_type="HTTPError", retryable=False) from e
    except httpx.HTTPError as e:
        raise ToolError(f"{method} {url} failed: {type(e).__name__}: {e}".rstrip(": "),
                        error_type="HTTPError", retryable=True) from e
    result = {"status": response.status_code,
              "headers": {k: ", ".join(response.headers.get_list(k)) for k in response.headers},
              "body": _body(response, content) if size <= limit else
              content[:limit].decode("utf-8", "replace")}
    if size > limit:  # what is recorded is bounded; say that it was cut, and from what
        result.update(truncated=True, body_bytes=size)
    expect = spec.get("expect")
    ok = response.status_code in expect if expect else 200 <= response.status_code < 300
    if not ok:
        text = content.decode("utf-8", "replace").strip()
        tail = (": " + text[-300:]) if text else ""
        status = response.status_code
        raise ToolError(f"{method} {url} returned {status} {response.reason_phrase}{tail}",
                        error_type="HTTPStatus", retryable=status >= 500 or status == 429,
                        details={"status": status, "body": result["body"]})
    return result


#: The most bytes of a response body the tool reads and records (``max_body_bytes``).
MAX_BODY = 1024 * 1024
#: Request headers kept when a redirect leads to another origin (scheme, host, port):
#: every other one (Authorization, Cookie, an API key under any name) stays behind.
_PORTABLE = frozenset({"accept", "accept-encoding", "accept-language", "content-type",
                       "user-agent", "idempotency-key"})


async def _exchange(client: httpx.AsyncClient, method: str, url: str, kwargs: dict[str, Any],
                    follow: bool, limit: int) -> tuple[httpx.Response, bytes, int]:
    """Send the request (following up to 10 redirects when ``follow``); the last response,
    at most ``limit`` + 1 bytes of its body, and how many bytes it had (or more)."""
    import httpx

    origin = httpx.URL(url)
    for _ in range(11):
        response = await client.send(client.build_request(method, url, **kwargs), stream=True)
        try:
            if not (follow and response.is_redirect and response.next_request is not None):
                content, size = b"", 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if len(content) <= limit:
                        content += chunk[:limit + 1 - len(content)]
                return response, content, size
            target = response.next_request.url
        finally:
            await response.aclose()
        if (target.scheme, target.host, target.port) != (origin.scheme, origin.host,
                                                         origin.port):
            kwargs = dict(kwargs, headers={k: v for k, v in kwargs["headers"].items()
                                           if k.lower() in _PORTABLE})
        if response.status_code == 303 or (response.status_code in (301, 302)
                                           and method == "POST"):
            method = "GET"
            kwargs = {k: v for k, v in kwargs.items() if k not in ("json", "content")}
        url = str(target)
        kwargs.pop("params", None)  # the redirect's URL carries its own query
    raise httpx.TooManyRedirects("more than 10 redirects", request=response.request)


def _body(response: httpx.Response, content: bytes) -> Any:
    ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
    text = content.decode(response.encoding or "utf-8", "replace")
    if ctype == "application/json" or ctype.endswith("+json"):
        if not content.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


async def http(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Sends an HTTP request; returns status, headers and body."""
    return await request({k: v for k, v in params.items() if k != "undo"}, ctx)


async def undo(params: dict[str, Any], output: Any, ctx: ToolContext) -> dict[str, Any]:
    """Sends the step's ``undo`` request."""
    spec = params.get("undo")
    if not isinstance(spec, dict) or not spec.get("url"):
        raise ToolError("http step has no undo request to compensate with",
                        error_type="NoCompensation", retryable=False)
    return await request(spec, ctx)


def host_resource(params: dict[str, Any]) -> str | None:
    """The resource an ``http`` call counts against unless its step names one:
    ``http:HOST`` (the URL's host, lowercase, with its port when it has one), so
    saga.toml ``[resources."http:api.example.com"]`` limits the calls to that host."""
    url = params.get("url")
    host = urlsplit(url).netloc.rpartition("@")[2].lower() if isinstance(url, str) else ""
    return f"http:{host}" if host else None


def make_tool(config: Mapping[str, Any]) -> Tool:
    """The ``http`` tool."""
    return Tool("http", http, undo, "Sends an HTTP request; `undo` is the request that "
                "compensates.", "builtin", PARAMS, _check, resource=host_resource)
