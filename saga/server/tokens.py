"""Who a request is: its tenant, its scope, and the actor its changes are recorded as.

Two kinds of credential are accepted. ``SAGA_API_TOKEN`` (and ``SAGA_API_READ_TOKEN``)
from the environment act on the ``default`` tenant as they always have: the first may do
anything (scope ``admin``), the second read. Tokens made with ``saga token create`` are
kept hashed in the store's ``saga_tokens`` table (:mod:`saga.store.tokens`); each names
its tenant and its scope, and a change made with one is recorded as
``token:<id>:<name>``, so the audit chain and reports say which credential made it.

Scopes: ``read`` reads; ``operate`` also starts, approves, signals, cancels, retries,
pauses and compensates; ``admin`` also manages schedules and tokens. A request is served
from its tenant's store only, so another tenant's run is simply not there (404).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ConfigDict
from starlette.requests import HTTPConnection

from saga.config import DEFAULT_TENANT
from saga.server.service import Service, Tokens
from saga.store.partitions import parts_of
from saga.store.tokens import SCOPES, TokenStore, parse_expiry

#: Paths whose changes need ``admin`` (the rest need ``operate``).
ADMIN_PATHS = ("/api/v1/schedules", "/api/v1/tokens")
_SAFE = ("GET", "HEAD", "OPTIONS")
#: The viewer's sessions (:mod:`saga.server.browser`), of every tenant.
SESSIONS = "/api/v1/sessions"
#: The process's Prometheus metrics, of every tenant.
METRICS = "/metrics"


@dataclass(frozen=True)
class Principal:
    """Who presented a credential: the tenant it acts on, its scope, and its actor."""

    tenant: str
    scope: str
    actor: str
    token_id: str | None = None

    @property
    def access(self) -> str:
        """``write`` or ``read``, as :meth:`Tokens.access` says it."""
        return "read" if self.scope == "read" else "write"

    def refusal(self, method: str, path: str) -> str | None:
        """Why this principal may not make this request (None: it may)."""
        if path.startswith(SESSIONS) and (self.scope != "admin"
                                          or self.tenant != DEFAULT_TENANT):
            # the viewer's sessions are the service's, of every tenant: only its operator's
            return "viewer sessions are managed with the default tenant's admin token"
        if path == METRICS and self.tenant != DEFAULT_TENANT:
            # the process's metrics count every tenant's runs
            return "the service's metrics are read with a token of the default tenant"
        admin = path.startswith(ADMIN_PATHS)
        if admin and self.scope != "admin" and (method not in _SAFE or
                                                path.startswith("/api/v1/tokens")):
            return f"a token of scope {self.scope} may not manage schedules or tokens"
        if method not in _SAFE and self.scope == "read":
            return "this token may read but not change runs"
        return None


@dataclass(frozen=True)
class Credentials(Tokens):
    """The environment's tokens (:class:`Tokens`) and the store's (``saga token``)."""

    store: Callable[[], TokenStore] | None = field(default=None, compare=False, repr=False)

    @property
    def required(self) -> bool:
        """True when requests must present a token: one is set in the environment, or
        the store holds one that may be used."""
        return super().required or (self.store is not None and self.store().any_live())

    def access(self, presented: str | None) -> str | None:
        """``write``, ``read`` or None (refused) for a presented token."""
        principal = self.resolve(presented)
        return None if principal is None else principal.access

    def resolve(self, presented: str | None) -> Principal | None:
        """Who ``presented`` is, or None when it is refused (unknown, expired, revoked,
        or missing where a token is required)."""
        if presented is not None and self.store is not None and presented.startswith("saga_"):
            token = self.store().verify(presented, datetime.now(UTC))
            if token is not None:
                return Principal(token.tenant, token.scope, token.actor, token.id)
        return principal_of(self, presented)


def principal_of(tokens: Tokens, presented: str | None) -> Principal | None:
    """The principal of an environment token (the ``default`` tenant): ``write`` is
    ``admin``, as it may do everything a change may."""
    access = Tokens.access(tokens, presented)
    if access is None:
        return None
    return Principal(DEFAULT_TENANT, "admin" if access == "write" else "read", tokens.name)


def resolve(tokens: Tokens, presented: str | None) -> Principal | None:
    """:meth:`Credentials.resolve`, for plain :class:`Tokens` too."""
    if isinstance(tokens, Credentials):
        return tokens.resolve(presented)
    return principal_of(tokens, presented)


def principal(request: HTTPConnection) -> Principal | None:
    """The principal the guard found for this request (None before it ran)."""
    found = request.scope.get("state", {}).get("principal")
    return found if isinstance(found, Principal) else None


def tenant_service(request: HTTPConnection) -> Service:
    """The service of the caller's tenant (its own store: nothing of another's is found
    there, so another tenant's run answers 404 as a missing one does)."""
    svc: Service = request.app.state.service
    who = principal(request)
    return svc.tenant(who.tenant) if who is not None else svc


router = APIRouter(prefix="/api/v1", tags=["tokens"])


class NewToken(BaseModel):
    """``POST /api/v1/tokens``: a token of the caller's tenant."""

    model_config = ConfigDict(extra="forbid")
    scope: str
    name: str | None = None
    expires: str | None = None


def _admin(request: Request) -> tuple[Principal, TokenStore]:
    who = principal(request)
    credentials = request.app.state.service.tokens
    if who is None or not isinstance(credentials, Credentials) or credentials.store is None:
        raise HTTPException(404, "tokens are not kept by this service")
    return who, credentials.store()


@router.get("/tokens")
def list_tokens(request: Request) -> list[dict[str, Any]]:
    """The tokens of the caller's tenant, without their secrets (admin)."""
    who, store = _admin(request)
    return [t.to_json() for t in store.all(who.tenant)]


@router.post("/tokens", status_code=201)
def create_token(request: Request, body: NewToken) -> dict[str, Any]:
    """A new token of the caller's tenant; its ``secret`` is in this answer only (admin)."""
    who, store = _admin(request)
    if body.scope not in SCOPES:
        raise HTTPException(422, f"scope must be one of {', '.join(SCOPES)}")
    token, secret = store.create(who.tenant, body.scope, name=body.name, actor=who.actor,
                                 expires=parse_expiry(body.expires) if body.expires else None)
    return {**token.to_json(), "secret": secret}


@router.delete("/tokens/{token_id}")
def revoke_token(request: Request, token_id: str) -> dict[str, Any]:
    """Revoke a token of the caller's tenant (admin); another tenant's is not found."""
    who, store = _admin(request)
    if not any(t.id == token_id for t in store.all(who.tenant)):
        raise HTTPException(404, f"no token {token_id!r}")
    return store.revoke(token_id, who.actor).to_json()


@router.get("/whoami")
def whoami(request: Request) -> dict[str, Any]:
    """The caller's tenant, scope and actor (the viewer shows the tenant)."""
    who = principal(request)
    if who is None:
        raise HTTPException(401, "a valid bearer token is required")
    # the tenant's log position, where the viewer follows its events from
    position = sum(part.probe() for part in parts_of(tenant_service(request).saga.app))
    return {"tenant": who.tenant, "scope": who.scope, "actor": who.actor,
            "token_id": who.token_id, "position": position}
