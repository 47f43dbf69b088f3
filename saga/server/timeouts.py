"""A deadline on reading a request's headers, which uvicorn lacks: its keep-alive timeout
only runs between requests, so a client that sends a header line every few seconds
(a slowloris) would hold its connection, and a worker's socket, for ever."""

from __future__ import annotations

import asyncio
import os

from uvicorn.protocols.http.h11_impl import H11Protocol

#: Seconds a client has to send a request's headers (``SAGA_SERVE_HEADER_SECONDS``).
HEADER_SECONDS = 10.0
#: The most bytes of headers h11 buffers before it refuses the request.
MAX_HEADER_BYTES = 32 * 1024


def header_seconds() -> float:
    """The configured header deadline."""
    return float(os.environ.get("SAGA_SERVE_HEADER_SECONDS") or HEADER_SECONDS)


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request headers are not all
    in within :func:`header_seconds` of its first byte (or of the connection)."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._in_request():
            self._disarm()
        elif self._deadline is None:
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _in_request(self) -> bool:
        return self.cycle is not None and not self.cycle.response_complete

    def _arm(self) -> None:
        self._deadline = self.loop.call_later(header_seconds(), self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if not self._in_request() and not self.transport.is_closing():
            self.transport.close()
