"""The ASGI app behind ``saga serve``: who may call it, the body limit, the routes, and
the viewer's pages.

Access: with ``SAGA_API_TOKEN`` set, every request but ``/api/v1/health`` carries
``Authorization: Bearer <token>``, or a viewer session's cookie (see
:mod:`saga.server.browser`, which also checks ``Host`` and ``Origin`` in front of this
guard). ``SAGA_API_READ_TOKEN`` reads but cannot change.
``/metrics`` (Prometheus) is behind the same rule.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from saga.config import DEFAULT_TENANT, Settings, load_settings
from saga.errors import ConfigError, RunNotFoundError, SagaError
from saga.server import (
    browser,
    compositions,
    notifications,
    resources,
    revisions,
    runs,
    streams,
)
from saga.server import tokens as api_tokens
from saga.server.browser import serve_hosts
from saga.server.service import (
    Service,
    Tokens,
    error_response,
    http_error,
    validation_response,
)
from saga.telemetry import metrics

VIEWER = Path(__file__).resolve().parent / "viewer"
HEALTH = "/api/v1/health"
#: The largest request body accepted (bytes; ``SAGA_API_MAX_BODY`` overrides).
MAX_BODY = 1 << 20
#: Who asks for the health of the service: anyone, unrefused, so that a method it does
#: not take is a 405 there as anywhere (its one route only reads).
OPEN = api_tokens.Principal(DEFAULT_TENANT, "admin", "anyone")


class Guard:
    """ASGI middleware: tokens, read-only access, and the request body limit."""

    def __init__(self, app: ASGIApp, tokens: Tokens, max_body: int) -> None:
        self.app, self.tokens, self.max_body = app, tokens, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        safe = scope["type"] == "websocket" or scope.get("method") in ("GET", "HEAD")
        presented = _bearer(headers)
        # who it is: a tenant, a scope (read, operate, admin) and an actor
        who = OPEN if scope["path"] == HEALTH else api_tokens.resolve(self.tokens, presented)
        if who is None:
            await _deny(scope, receive, send, 401, "a valid bearer token is required")
            return
        refusal = who.refusal(scope.get("method", "GET"), scope["path"])
        if refusal is not None:
            await _deny(scope, receive, send, 403, refusal)
            return
        scope.setdefault("state", {}).update(access=who.access, principal=who)
        if scope["type"] == "http" and not safe:
            length = headers.get("content-length")
            if length and length.isdigit() and int(length) > self.max_body:
                await _deny(scope, receive, send, 413,
                            f"the request body is over {self.max_body} bytes")
                return
            receive = self._limited(receive)
        await self.app(scope, receive, send)

    def _limited(self, receive: Receive) -> Receive:
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise HTTPException(413, f"the request body is over {self.max_body} bytes")
            return message
        return limited


def _bearer(headers: Headers) -> str | None:
    value = headers.get("authorization", "")
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def _deny(scope: Scope, receive: Receive, send: Send, status: int, detail: str) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 4000 + status})
        return
    accept = Headers(scope=scope).get("accept", "")
    page = status == 401 and not scope["path"].startswith("/api") and "text/html" in accept
    response: Response = (
        HTMLResponse((VIEWER / "login.html").read_text(encoding="utf-8"), status)
        if page else http_error(status, detail))
    if status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    await response(scope, receive, send)


def create_app(settings: Settings | None = None, *, tools: tuple[str, ...] = (),
               tokens: Tokens | None = None, worker: bool = True, concurrency: int = 4,
               max_body: int | None = None, hosts: tuple[str, ...] = ()) -> FastAPI:
    """The service's ASGI app over the configured store."""
    settings = settings or load_settings()
    if settings.tenant != DEFAULT_TENANT:  # its tokens are the configured store's
        raise ConfigError(f"saga serve serves every tenant, {settings.tenant!r} among them: "
                          "leave SAGA_TENANT unset")
    service = Service(settings, tools=tools, tokens=tokens, worker=worker,
                      concurrency=concurrency)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.start()
        try:
            yield
        finally:
            service.stop()

    app = FastAPI(title="saga", version=_version(), lifespan=lifespan,
                  description="Durable sagas on an event-sourced log: runs, their events "
                              "live, approvals, redrive, audit and reports.")
    app.state.service = service
    limit = max_body if max_body is not None else int(os.environ.get("SAGA_API_MAX_BODY",
                                                                     MAX_BODY))
    app.add_middleware(Guard, tokens=service.tokens, max_body=limit)
    app.add_middleware(browser.BrowserGuard, access=service.tokens.access,
                       sessions=service.sessions, viewer=VIEWER,
                       hosts=browser.allowed_hosts([*hosts, *serve_hosts(service.settings)]))

    async def saga_error(_: Request, e: Exception) -> Response:
        assert isinstance(e, SagaError)
        return error_response(e)
    app.add_exception_handler(SagaError, saga_error)

    # FastAPI's own answers (an unknown path, a wrong method, a body that is not the
    # model) in the one shape every error has: {error, detail}
    async def http_exception(_: Request, e: Exception) -> Response:
        assert isinstance(e, StarletteHTTPException)
        answer = http_error(e.status_code, e.detail)
        for name, value in (e.headers or {}).items():
            answer.headers[name] = value
        return answer
    app.add_exception_handler(StarletteHTTPException, http_exception)

    async def invalid_request(_: Request, e: Exception) -> Response:
        assert isinstance(e, RequestValidationError)
        return validation_response(e.errors())
    app.add_exception_handler(RequestValidationError, invalid_request)

    # a value nested deeper than some walker can follow is the caller's error, not ours
    async def too_deep(_: Request, e: Exception) -> Response:
        return http_error(422, "a value is nested too deeply")
    app.add_exception_handler(RecursionError, too_deep)

    app.include_router(runs.router)
    app.include_router(revisions.router)
    app.include_router(notifications.router)
    app.include_router(resources.router)
    app.include_router(compositions.router)
    app.include_router(streams.router)
    app.include_router(browser.router)
    app.include_router(api_tokens.router)
    _metrics_route(app, service)
    _viewer_routes(app)
    return app


def _metrics_route(app: FastAPI, service: Service) -> None:
    """``GET /metrics``: Prometheus metrics of this process (its API and its worker),
    behind the same tokens as the rest (a read token will do)."""
    try:
        exported: metrics.Metrics | None = metrics.enable()
    except ConfigError as e:
        exported, missing = None, str(e)
    if exported is not None:
        exported.watch_lag(service.saga.lag)
        if service.saga.settings.resources:  # slots in use and waiters (the store's)
            exported.watch_resources(service.saga.resource_usage)

    @app.get("/metrics", include_in_schema=False)
    def metrics_page() -> Response:
        if exported is None:
            return http_error(503, missing)
        body, content_type = exported.exposition()
        return Response(body, media_type=content_type)


def _viewer_routes(app: FastAPI) -> None:
    files = {p.name for p in VIEWER.iterdir() if p.suffix in (".js", ".css", ".svg")}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(VIEWER / "index.html")

    @app.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
    def run_page(request: Request, run_id: str) -> Response:
        try:
            request.app.state.service.saga.resolve(run_id)
        except RunNotFoundError:  # a real 404 with a way back, not six empty cards
            return HTMLResponse((VIEWER / "notfound.html").read_text(encoding="utf-8"), 404)
        return FileResponse(VIEWER / "run.html")

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str) -> FileResponse:
        if name not in files:
            raise HTTPException(404, "no such file")
        return FileResponse(VIEWER / name)


def _version() -> str:
    try:
        return version("saga")
    except PackageNotFoundError:
        return "0"

