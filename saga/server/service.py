"""What the service's routes share: the API tokens, the :class:`Service` (one
:class:`~saga.api.Saga` over the store, and the worker thread that drives submitted runs),
and how a saga error answers over HTTP."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from saga.api import Saga
from saga.composition.notify_config import config_targets, notify_settings
from saga.config import DEFAULT_TENANT, Settings, tenant_names, tenant_settings
from saga.errors import (
    ConfigError,
    DefinitionError,
    InputError,
    Problem,
    RunStateError,
    SagaError,
)
from saga.server.browser import SESSION_SECONDS, Sessions
from saga.store.tokens import TokenStore

log = logging.getLogger("saga.server")
_ACTOR = re.compile(r"^[\w.@:+/-]{1,100}$")
#: How an error's exit code answers over HTTP.
_STATUS = {2: 422, 3: 503, 4: 404, 5: 409, 6: 409}


@dataclass(frozen=True)
class Tokens:
    """The API's bearer tokens: one that may change runs, one that may only read them."""

    write: str | None = None
    read: str | None = None
    name: str = "api"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tokens:
        """``SAGA_API_TOKEN``, ``SAGA_API_READ_TOKEN`` and ``SAGA_API_TOKEN_NAME``."""
        env = os.environ if env is None else env
        return cls(env.get("SAGA_API_TOKEN") or None, env.get("SAGA_API_READ_TOKEN") or None,
                   env.get("SAGA_API_TOKEN_NAME") or "api")

    @property
    def required(self) -> bool:
        """True when requests must present a token."""
        return bool(self.write or self.read)

    def access(self, presented: str | None) -> str | None:
        """``write``, ``read`` or None (refused) for a presented token."""
        if not self.required:
            return "write"
        if presented is None:
            return None
        if self.write and hmac.compare_digest(presented.encode(), self.write.encode()):
            return "write"
        if self.read and hmac.compare_digest(presented.encode(), self.read.encode()):
            return "read"
        return None


def check_bind(host: str, tokens: Tokens) -> None:
    """Refuse to listen beyond loopback with no token: anyone who can reach the port could
    otherwise start and undo runs."""
    if tokens.required:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConfigError(f"refusing to serve on {host} without SAGA_API_TOKEN: set a token, "
                          "or bind to 127.0.0.1")


class Service:
    """What every route shares: one :class:`Saga` over the store, the tokens, and the
    worker thread that drives the runs the API submits."""

    def __init__(self, settings: Settings, *, tools: tuple[str, ...] = (),
                 tokens: Tokens | None = None, worker: bool = True, concurrency: int = 4,
                 poll: float = 0.1) -> None:
        self.settings, self.tools = settings, tools
        # the environment's tokens, and the store's (saga token create), of any tenant
        from saga.server.tokens import Credentials  # (it builds on this module)
        given = tokens or Tokens.from_env()
        self.tokens = given if isinstance(given, Credentials) else Credentials(
            given.write, given.read, given.name, store=self._token_store)
        self._tokens: TokenStore | None = None
        self._tenants: dict[str, Service] = {}
        self._tenants_lock = threading.Lock()
        # viewer sessions: a browser's cookie holds a random id, never the token
        self.sessions = Sessions(float(os.environ.get("SAGA_SESSION_SECONDS")
                                       or SESSION_SECONDS))
        self.saga = Saga(settings, tools=tools)
        self.with_worker, self.concurrency, self.poll = worker, concurrency, poll
        if worker:  # its worker notifies: a wrong [[notify]] stops serve now, not it later
            config_targets(settings)
            notify_settings(settings)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the worker thread (when this service drives runs)."""
        # Everything the routes share is opened here, once, before request threads race
        # to open it lazily.
        for part in ("app", "registry", "leases", "projection", "schedules", "cache"):
            getattr(self.saga, part)
        if self.settings.tenant == DEFAULT_TENANT:  # each tenant's store has its worker
            for name in tenant_names(self.settings)[1:]:
                self.tenant(name)
        if self.with_worker and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="saga-worker", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop the worker (its runs finish the calls in flight, for up to 30 s, and are
        continued by any worker) and release the store."""
        self._stop.set()
        for child in list(self._tenants.values()):
            child.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self.saga.close()

    def tenant(self, name: str) -> Service:
        """The service of tenant ``name`` (this one for its own), started with this one."""
        if name == self.settings.tenant:
            return self
        with self._tenants_lock:
            child = self._tenants.get(name)
            if child is None:
                child = Service(tenant_settings(self.settings, name), tools=self.tools,
                                tokens=self.tokens, worker=self.with_worker,
                                concurrency=self.concurrency, poll=self.poll)
                child.start()
                self._tenants[name] = child
            return child

    def _token_store(self) -> TokenStore:
        """The token table, in the configured store (tokens of every tenant live there)."""
        with self._tenants_lock:
            if self._tokens is None:
                self._tokens = TokenStore(self.saga.schedules.db)
            return self._tokens

    @property
    def worker_alive(self) -> bool:
        """True while the worker thread runs (False when the service has none)."""
        return self._thread is not None and self._thread.is_alive()

    def _work(self) -> None:
        while not self._stop.is_set():
            try:
                with Saga(self.settings, tools=self.tools) as saga:
                    saga.sync_schedules()
                    loop = saga.worker_loop(concurrency=self.concurrency,
                                            poll_interval=self.poll,
                                            lease_seconds=self.settings.lease_seconds)
                    loop.run(stop=self._stop.is_set,  # webhooks beside it
                             alongside=saga.notifier(loop.worker_id))
            except Exception:  # the store went away: look again shortly
                log.exception("the service's worker stopped; starting it again")
                self._stop.wait(2.0)

    def actor(self, request: Request) -> str:
        """Who a change is recorded as: the token's name, with the caller's
        ``X-Saga-Actor`` after it when given (``api:alice``)."""
        claimed = request.headers.get("x-saga-actor")
        # a store token is recorded by its id and name (token:<id>:<name>)
        found = request.scope.get("state", {}).get("principal")
        name = getattr(found, "actor", None) or self.tokens.name
        if claimed is None:
            return name
        if not _ACTOR.match(claimed):
            raise InputError([Problem("X-Saga-Actor", "letters, digits and ._@:+/- (1 to 100)")])
        return f"{name}:{claimed}"


def http_error(status: int, detail: Any, **extra: Any) -> JSONResponse:
    """Any other error answer in the same shape as a saga error's, ``{error, detail}``:
    the status's name (``NotFound``, ``MethodNotAllowed``) and one line."""
    try:
        kind = HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        kind = "Error"
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    return JSONResponse({"error": kind, "detail": " ".join(text.split()), **extra}, status)


def validation_response(errors: Sequence[Any]) -> JSONResponse:
    """FastAPI's request validation error (a body that is not the model) as a saga
    InputError answers: ``{error, detail, problems}``, each problem a path and a message."""
    problems = [{"path": ".".join(str(p) for p in err.get("loc", ())),
                 "message": str(err.get("msg", ""))} for err in errors]
    detail = "invalid request: " + "; ".join(f"{p['path']}: {p['message']}" for p in problems)
    return JSONResponse({"error": "InputError", "detail": detail, "problems": problems}, 422)


def named(data: dict[str, Any], fallback: str | None = None) -> dict[str, Any]:
    """A composition sent over HTTP without a ``name``, named as the CLI names a file by
    its stem: after its template (``fallback``), else ``composition-`` and the first 8
    hex digits of its content's hash, so the same composition gets the same name."""
    if not isinstance(data, dict) or "name" in data or "nodes" in data:
        return data
    digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
    return {"name": fallback or f"composition-{digest[:8]}", **data}


def error_response(e: SagaError) -> JSONResponse:
    """A saga error as an HTTP answer: its kind, one line, and every problem with its
    path for a definition or input error."""
    status = 409 if isinstance(e, RunStateError) else _STATUS.get(e.exit_code, 500)
    body: dict[str, Any] = {"error": type(e).__name__, "detail": " ".join(str(e).split())}
    if isinstance(e, DefinitionError | InputError):
        body["problems"] = [p.to_json() for p in e.problems]
    return JSONResponse(body, status)
