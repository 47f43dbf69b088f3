"""Where news of a run goes: the ``notify:`` targets of a composition and saga.toml's
``[[notify]]`` entries, and the ``[notifications]`` settings their delivery follows.

saga.toml's entries and settings are read by :mod:`saga.composition.notify_config`.
A target is a webhook: a URL, the kinds of news it wants (:data:`NOTIFY_EVENTS`), an
optional filter (definition names, labels) and the environment variable that holds its
signing secret. The secret itself is never written anywhere saga records: only its
variable's name is in the definition, the configuration and the outbox. Plain ``http://``
is accepted only to loopback, unless a target says ``allow_insecure``.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: The kinds of news a target may ask for, each derived from one event of a run.
NOTIFY_EVENTS = ("run.completed", "run.failed", "run.compensated", "run.waiting",
                 "run.cancelled", "run.quarantined", "step.failed", "compensation.failed")
#: The loopback names a plain ``http://`` URL may use without ``allow_insecure``.
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NotifyFilter(_Model):
    """Which runs a target hears of: every one of ``labels`` carried, and (when given)
    a definition of one of these names."""

    definition: str | list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)

    def admits(self, definition: str, labels: dict[str, Any]) -> bool:
        """True when a run of ``definition`` carrying ``labels`` passes."""
        names = [self.definition] if isinstance(self.definition, str) else self.definition
        if names is not None and definition not in names:
            return False
        return all(str(labels.get(k)) == v for k, v in self.labels.items())


class NotifyTarget(_Model):
    """One webhook: POSTed a signed JSON body for each event of a kind in ``events``."""

    url: str = Field(min_length=1, max_length=2000)
    events: list[str] = Field(min_length=1)
    filter: NotifyFilter | None = None
    secret_env: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
                            description="the environment variable holding the signing secret")
    allow_insecure: bool = Field(default=False,
                                 description="allow http:// to a host that is not loopback")

    @model_validator(mode="after")
    def _checked(self) -> NotifyTarget:
        unknown = [e for e in self.events if e not in NOTIFY_EVENTS]
        if unknown:
            raise ValueError(f"unknown event {', '.join(map(repr, unknown))}: the events are "
                             f"{', '.join(NOTIFY_EVENTS)}")
        problem = url_problem(self.url, self.allow_insecure)
        if problem:
            raise ValueError(problem)
        return self

    def wants(self, kind: str, definition: str, labels: dict[str, Any]) -> bool:
        """True when this target is to hear of news ``kind`` of such a run."""
        return kind in self.events and (self.filter is None
                                        or self.filter.admits(definition, labels))


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower().rstrip(".") in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_problem(url: str, allow_insecure: bool = False) -> str | None:
    """Why a target's URL is refused (None when it is not): not http(s), no host, or
    plain http to a host that is not loopback without ``allow_insecure``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError as e:
        return f"bad url {url!r}: {e}"
    if parts.scheme not in ("http", "https") or not host:
        return f"url {url!r} must be an http:// or https:// URL with a host"
    if parts.username or parts.password:
        return f"url {url!r} must not carry credentials (sign with secret_env instead)"
    if parts.scheme == "http" and not allow_insecure and not is_loopback(host):
        return (f"url {url!r} is plain http to a host that is not loopback: use https, "
                "or set allow_insecure = true")
    return None


def definition_targets(definition: Any) -> list[NotifyTarget]:
    """The ``notify:`` targets of a recorded definition (a ``RunStarted`` payload's);
    an entry that no longer validates is left out (it was valid when recorded)."""
    entries = definition.get("notify") if isinstance(definition, dict) else None
    targets = []
    for entry in entries or []:
        try:
            targets.append(NotifyTarget.model_validate(entry))
        except ValidationError:
            continue
    return targets
