"""Sending one webhook: the signature, the request, and what its answer means.

The signature is Stripe's scheme: ``Saga-Signature: t=<unix seconds>,v1=<hex>``, where
the hex is HMAC-SHA256 of ``"<t>.<body>"`` under the target's secret. A receiver
recomputes it over the raw body it got, compares in constant time, and refuses a ``t``
too far from its own clock (a replayed request). The body holds no secret.

The request is one ``POST`` over :mod:`http.client`, which follows no redirect: a 3xx
answer is a failed attempt that names where it pointed, so a webhook cannot be bounced
to a host nobody configured.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

#: The most of an answer's body read (and kept, cut to a line, in an attempt's error).
_READ = 4096
USER_AGENT = "saga-webhooks/1"


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Saga-Signature`` header's value for ``body`` sent at ``timestamp``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"t={timestamp},v1={digest.hexdigest()}"


def verify(secret: str, header: str, body: bytes, now: int, tolerance: int = 300) -> bool:
    """True when ``header`` signs ``body`` under ``secret`` within ``tolerance`` seconds
    of ``now`` (what a receiver does; the docs show the same in ten lines)."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    if not parts.get("t", "").isdigit() or abs(now - int(parts["t"])) > tolerance:
        return False
    expected = signature(secret, int(parts["t"]), body).rsplit("v1=", 1)[1]
    return hmac.compare_digest(expected, parts.get("v1", ""))


@dataclass(frozen=True)
class Answer:
    """How one attempt went: delivered (a 2xx), or the error that failed it."""

    delivered: bool
    status_code: int | None = None
    error: str | None = None


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """POST ``body`` to ``url``; never follows a redirect, never raises for the
    network (a refused connection, a timeout, a TLS failure are failed answers)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(host, port, timeout=timeout,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json",
                                          "User-Agent": USER_AGENT, **headers})
        response = conn.getresponse()
        text = response.read(_READ).decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return Answer(False, None, f"{type(e).__name__}: {e}"[:500])
    finally:
        conn.close()
    code = response.status
    if 200 <= code < 300:
        return Answer(True, code)
    if 300 <= code < 400:
        where = response.getheader("Location") or "nowhere"
        return Answer(False, code, f"HTTP {code}: a redirect (to {where}) is not followed")
    line = " ".join(text.split())[:200]
    return Answer(False, code, f"HTTP {code}" + (f": {line}" if line else ""))
