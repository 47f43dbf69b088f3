"""What keeps a web page from driving ``saga serve``: the ``Host`` a request names, the
``Origin`` a change or a socket comes from, viewer sessions (an ``HttpOnly`` cookie of a
random id, never the token) with a CSRF token for their changes, and the security headers
of every answer.

A browser signs in once with the token (``GET /?token=...``, the URL ``saga serve``
prints, or the sign-in form); the service keeps the token server-side and hands the
browser a session id. A request that carries a valid session and no ``Authorization``
header is passed on as if it carried the session's token, so the access rules stay those
of :class:`~saga.server.app.Guard`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import APIRouter, HTTPException, Request
from starlette.datastructures import Headers
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saga.config import Settings

#: The session cookie's name (its value is a random id; the token never leaves the server).
SESSION_COOKIE = "saga_session"
#: The header a session's change carries its CSRF token in.
CSRF_HEADER = "x-saga-csrf"
#: Seconds a viewer session lasts after it is made (``SAGA_SESSION_SECONDS`` overrides).
SESSION_SECONDS = 12 * 3600.0
#: Names a loopback service answers to whatever is configured.
LOOPBACK = ("localhost", "127.0.0.1", "::1")
_SAFE = ("GET", "HEAD", "OPTIONS")
_SIGN_IN = "/api/v1/session"


@dataclass
class Session:
    """One signed-in browser: its id (the cookie), its CSRF token, the token it signed in
    with (kept here only) and when it ends."""

    id: str
    csrf: str
    token: str
    created: float
    expires: float
    agent: str = ""

    def to_json(self) -> dict[str, object]:
        """The session as listed: a short id, never the token or the CSRF token."""
        return {"id": self.id[:12], "created": _iso(self.created),
                "expires": _iso(self.expires), "agent": self.agent[:120]}


@dataclass
class Sessions:
    """The service's viewer sessions (in memory: a restart signs every browser out)."""

    seconds: float = SESSION_SECONDS
    clock: Callable[[], float] = time.time
    _by_id: dict[str, Session] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def open(self, token: str, agent: str = "") -> Session:
        """A new session for a browser that presented ``token``."""
        now = self.clock()
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32), token, now,
                          now + self.seconds, agent)
        with self._lock:
            self._by_id[session.id] = session
        return session

    def get(self, ident: str | None) -> Session | None:
        """The live session with this id, or None (unknown, revoked or expired)."""
        if not ident:
            return None
        with self._lock:
            session = self._by_id.get(ident)
            if session is not None and session.expires <= self.clock():
                del self._by_id[ident]
                return None
        return session

    def all(self) -> list[Session]:
        """The live sessions, oldest first."""
        now = self.clock()
        with self._lock:
            for ident in [i for i, s in self._by_id.items() if s.expires <= now]:
                del self._by_id[ident]
            return sorted(self._by_id.values(), key=lambda s: s.created)

    def revoke(self, prefix: str) -> int:
        """End the sessions whose id starts with ``prefix`` (as listed); how many ended."""
        if len(prefix) < 8:
            return 0
        with self._lock:
            gone = [i for i in self._by_id if i.startswith(prefix)]
            for ident in gone:
                del self._by_id[ident]
        return len(gone)


def _iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def allowed_hosts(configured: Iterable[str] = ()) -> frozenset[str]:
    """The names a request's ``Host`` may give: loopback's and the configured ones
    (``[serve] hosts``, ``SAGA_SERVE_HOSTS``); ``*`` allows any."""
    return frozenset([*LOOPBACK, *(h.strip().lower().strip("[]") for h in configured
                                   if h.strip())])


def host_name(value: str) -> str | None:
    """The name in a ``Host`` header without its port (None when it is malformed)."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        return name if sep and (not rest or re.fullmatch(r":\d{1,5}", rest)) else None
    name, _, port = value.partition(":")
    if port and not port.isdigit():
        return None
    return name if re.fullmatch(r"[a-z0-9.-]{1,253}", name) else None


def _script_hashes(viewer: Path) -> str:
    """CSP sources for the viewer's inline scripts (each by its SHA-256)."""
    found: set[str] = set()
    for page in viewer.glob("*.html"):
        for body in re.findall(r"<script>(.*?)</script>", page.read_text(encoding="utf-8"),
                               re.S):
            digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
            found.add(f"'sha256-{digest}'")
    return " ".join(sorted(found))


def security_headers(viewer: Path) -> list[tuple[bytes, bytes]]:
    """The headers every answer carries: no framing, no sniffing, no referrer (a sign-in
    URL holds the token), and nothing loaded or run from anywhere but this service."""
    policy = ("default-src 'self'; script-src 'self' " + _script_hashes(viewer) +
              "; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
              "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
              "form-action 'self'; object-src 'none'")
    return [(b"content-security-policy", policy.encode()), (b"x-frame-options", b"DENY"),
            (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
            (b"cross-origin-opener-policy", b"same-origin"),
            (b"cross-origin-resource-policy", b"same-origin")]


_DOCS_POLICY = (b"default-src 'self'; script-src 'self' 'unsafe-inline' "
                b"https://cdn.jsdelivr.net; style-src 'self' 'unsafe-inline' "
                b"https://cdn.jsdelivr.net; img-src 'self' data: https://fastapi.tiangolo.com; "
                b"worker-src blob:; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")


class BrowserGuard:
    """ASGI middleware in front of :class:`~saga.server.app.Guard`: ``Host``, ``Origin``,
    sessions and CSRF, the sign-in exchange, and the security headers."""

    def __init__(self, app: ASGIApp, access: Callable[[str | None], str | None],
                 sessions: Sessions, hosts: frozenset[str], viewer: Path) -> None:
        self.app, self.access, self.sessions, self.hosts = app, access, sessions, hosts
        self.headers = security_headers(viewer)
        # /docs is FastAPI's Swagger UI, loaded from its CDN with an inline script
        self.docs_headers = [(k, _DOCS_POLICY if k == b"content-security-policy" else v)
                             for k, v in self.headers]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http":
            send = self._with_headers(send, self.docs_headers if scope["path"] in (
                "/docs", "/redoc", "/docs/oauth2-redirect") else self.headers)
        headers = Headers(scope=scope)
        name = host_name(headers.get("host", ""))
        if name is None or ("*" not in self.hosts and name not in self.hosts):
            # a DNS-rebound page reaches us under its own name: answer it nothing
            await _refuse(scope, receive, send, 421, "this service does not answer to "
                          f"the host {headers.get('host', '')!r} (add it to [serve] hosts)")
            return
        origin = headers.get("origin")
        own = origin is not None and _same_origin(origin, scope, headers)
        safe = scope["type"] == "http" and scope["method"] in _SAFE
        if origin is not None and not own and not safe:
            # another site's change or socket, whatever it carries
            await _refuse(scope, receive, send, 403, f"cross-origin request from {origin}")
            return
        if scope["type"] == "http" and scope["path"] == _SIGN_IN:
            await self._session_route(scope, receive, send, headers)
            return
        if scope["type"] == "http" and scope["method"] == "GET" and \
                not scope["path"].startswith("/api/") and "token" in _query(scope):
            await self._sign_in_link(scope, receive, send, headers)
            return
        bearer = headers.get("authorization") is not None
        session = None if bearer else self.sessions.get(_cookie(headers, SESSION_COOKIE))
        if session is not None:
            if not safe and not hmac.compare_digest(
                    headers.get(CSRF_HEADER, "").encode(), session.csrf.encode()):
                await _refuse(scope, receive, send, 403, "a change from the viewer needs "
                              "its CSRF token (X-Saga-CSRF)")
                return
            if origin is not None and not own:  # a stream read from another site's page
                await _refuse(scope, receive, send, 403, f"cross-origin request from {origin}")
                return
            scope = _with_bearer(scope, session.token)
        elif scope.get("method") == "POST" and not bearer and not _json(headers):
            # a body-less form or text/plain POST is what any page can send unasked (any
            # other method needs a preflight, which this service never grants)
            await _refuse(scope, receive, send, 415, "a change is sent as "
                          "Content-Type: application/json (or with a bearer token)")
            return
        await self.app(scope, receive, send)

    def _with_headers(self, send: Send, extra: list[tuple[bytes, bytes]]) -> Send:

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message = {**message, "headers": [*message.get("headers", []),
                                                  *(h for h in extra if h[0] not in present)]}
            await send(message)
        return sending

    async def _sign_in_link(self, scope: Scope, receive: Receive, send: Send,
                            headers: Headers) -> None:
        """``GET PATH?token=T``: a session for a valid token, then PATH without it."""
        query = _query(scope)
        token = (query.pop("token") or [""])[0]
        target = scope["path"] + ("?" + urlencode(query, doseq=True) if query else "")
        if self.access(token) is None:
            await _refuse(scope, receive, send, 401, "that sign-in link's token is not valid")
            return
        response = RedirectResponse(target, 303)
        self._set_cookie(response, scope, self.sessions.open(token, headers.get(
            "user-agent", "")))
        await response(scope, receive, send)

    async def _session_route(self, scope: Scope, receive: Receive, send: Send,
                             headers: Headers) -> None:
        """``POST /api/v1/session {"token": ...}`` signs in (the form's way);
        ``GET`` says who is signed in, with the CSRF token; ``DELETE`` signs out."""
        method = scope["method"]
        session = self.sessions.get(_cookie(headers, SESSION_COOKIE))
        response: Response
        if method == "GET":
            response = (JSONResponse({"signed_in": True, "csrf": session.csrf,
                                      "access": self.access(session.token)})
                        if session is not None else
                        JSONResponse({"signed_in": False, "access": self._open()}))
        elif method == "POST" and _json(headers):
            body = await _read(receive, 4096)
            try:
                token = json.loads(body or b"{}").get("token")
            except (ValueError, AttributeError):
                token = None
            if not isinstance(token, str) or self.access(token) is None:
                response = JSONResponse({"error": "Unauthorized",
                                         "detail": "that token is not valid"}, 401)
            else:
                session = self.sessions.open(token, headers.get("user-agent", ""))
                response = JSONResponse({"signed_in": True, "csrf": session.csrf,
                                         "access": self.access(token)})
                self._set_cookie(response, scope, session)
        elif method == "DELETE" and session is not None and hmac.compare_digest(
                headers.get(CSRF_HEADER, "").encode(), session.csrf.encode()):
            self.sessions.revoke(session.id)
            response = JSONResponse({"signed_in": False})
            response.delete_cookie(SESSION_COOKIE, path="/")
        else:
            response = JSONResponse({"error": "BadRequest", "detail": "sign in with POST "
                                     "{\"token\": ...} as application/json"}, 400)
        response.headers["Cache-Control"] = "no-store"
        await response(scope, receive, send)

    def _open(self) -> str | None:
        return self.access(None)

    def _set_cookie(self, response: Response, scope: Scope, session: Session) -> None:
        response.set_cookie(SESSION_COOKIE, session.id, max_age=int(self.sessions.seconds),
                            path="/", httponly=True, samesite="strict",
                            secure=scope.get("scheme") in ("https", "wss"))


def _same_origin(origin: str, scope: Scope, headers: Headers) -> bool:
    parts = urlsplit(origin)
    scheme = {"ws": "http", "wss": "https"}.get(scope.get("scheme", "http"),
                                                 scope.get("scheme", "http"))
    return parts.scheme == scheme and parts.netloc.lower() == headers.get("host", "").lower()


def _json(headers: Headers) -> bool:
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _query(scope: Scope) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)


def _cookie(headers: Headers, name: str) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed cookie header is no session
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None and morsel.value else None


def _with_bearer(scope: Scope, token: str) -> Scope:
    kept = [(k, v) for k, v in scope["headers"] if k.lower() not in (b"authorization",
                                                                     b"cookie")]
    return {**scope, "headers": [*kept, (b"authorization", f"Bearer {token}".encode())]}


async def _read(receive: Receive, limit: int) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit or not message.get("more_body"):
            return bytes(body[:limit + 1])


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int,
                  detail: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4000 + status})
        return
    kind = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden",
            415: "UnsupportedMediaType", 421: "MisdirectedRequest"}.get(status, "Error")
    await JSONResponse({"error": kind, "detail": detail}, status)(scope, receive, send)


def serve_hosts(settings: Settings, env: Mapping[str, str] | None = None) -> list[str]:
    """The names configured beyond loopback: ``[serve] hosts`` in saga.toml and
    ``SAGA_SERVE_HOSTS`` (separated by commas)."""
    env = os.environ if env is None else env
    table = settings.file.get("serve")
    listed = table.get("hosts", []) if isinstance(table, dict) else []
    if isinstance(listed, str):
        listed = [listed]
    return [str(h) for h in listed] + [h for h in env.get("SAGA_SERVE_HOSTS", "").split(",")
                                       if h.strip()]


def generate_token(home: Path) -> tuple[str, Path]:
    """A fresh write token for a service started without one, kept in ``HOME/serve-token``
    readable by this user only (0600), as Jupyter keeps its own."""
    token = secrets.token_urlsafe(32)
    home.mkdir(parents=True, exist_ok=True)
    path = home / "serve-token"
    temporary = path.with_name(f".serve-token.{os.getpid()}")
    # created 0600 from the start, so no other user can read it in between
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(token + "\n")
    os.replace(temporary, path)
    return token, path


router = APIRouter(prefix="/api/v1/sessions", tags=["sessions"])


def _sessions(request: Request) -> Sessions:
    if request.scope.get("state", {}).get("access") != "write":
        raise HTTPException(403, "listing and ending viewer sessions needs the write token")
    sessions: Sessions = request.app.state.service.sessions
    return sessions


@router.get("")
def list_sessions(request: Request) -> list[dict[str, object]]:
    """The viewer sessions signed in now (short ids; never a token)."""
    return [s.to_json() for s in _sessions(request).all()]


@router.delete("/{session_id}")
def revoke_session(request: Request, session_id: str) -> dict[str, object]:
    """Sign a viewer session out (by the id as listed)."""
    ended = _sessions(request).revoke(session_id)
    if not ended:
        raise HTTPException(404, f"no session {session_id}")
    return {"revoked": ended}
