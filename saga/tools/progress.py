"""The ``shell`` tool's heartbeats: it beats while its program runs, and passes the lines
of its output that match the step's ``progress`` pattern as the beat's details.

``progress: "^PROGRESS (.*)"`` makes a line ``PROGRESS 40/100`` the details
``{"progress": "40/100"}``; named groups give their names (``^(?P<done>\\d+)/(?P<total>\\d+)``
gives ``{"done": "40", "total": "100"}``); a pattern without groups gives the whole line.
Both stdout and stderr are read, line by line, as the program writes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Any

from saga.tools.base import ToolContext

#: Seconds between the beats a running program sends with no progress line between.
BEAT_EVERY = 1.0
#: Bytes read from a pipe at a time; a line longer than a pipe's cap is not matched.
_CHUNK = 1 << 16


def check(params: dict[str, Any]) -> list[str]:
    """Problems with a step's ``progress`` pattern (found when the composition loads)."""
    pattern = params.get("progress")
    if not isinstance(pattern, str) or "{{" in pattern:
        return []
    try:
        re.compile(pattern)
    except re.error as e:
        return [f"progress: not a regular expression: {e}"]
    return []


def details_of(match: re.Match[str]) -> Any:
    """A matching line as a beat's details."""
    named = {k: v for k, v in match.groupdict().items() if v is not None}
    if named:
        return named
    return {"progress": match.group(1) if match.re.groups else match.group(0)}


async def communicate(proc: asyncio.subprocess.Process, data: bytes | None,
                      ctx: ToolContext | None, pattern: str | None,
                      cap: int) -> tuple[bytes, bytes]:
    """``proc.communicate(data)``, beating ``ctx`` while the program runs and passing
    its lines that match ``pattern`` as details; keeps up to ``cap`` + 1 bytes of each
    stream (the caller marks more as truncated) and reads the rest to its end."""
    if ctx is None:
        return await proc.communicate(data)
    found = re.compile(pattern) if pattern else None
    beating = asyncio.ensure_future(_beat(ctx))
    try:
        _, out, err = await asyncio.gather(_feed(proc, data),
                                           _read(proc.stdout, ctx, found, cap),
                                           _read(proc.stderr, ctx, found, cap))
        await proc.wait()
    finally:
        beating.cancel()
    return out, err


async def _beat(ctx: ToolContext) -> None:
    while True:
        ctx.heartbeat()
        await asyncio.sleep(BEAT_EVERY)


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            proc.stdin.write(data)
            await proc.stdin.drain()
        proc.stdin.close()


async def _read(stream: asyncio.StreamReader | None, ctx: ToolContext,
                found: re.Pattern[str] | None, cap: int) -> bytes:
    if stream is None:
        return b""
    kept = bytearray()
    pending = b""
    while chunk := await stream.read(_CHUNK):
        if len(kept) <= cap:
            kept += chunk[:cap + 1 - len(kept)]
        if found is None:
            continue
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > _CHUNK:
            pending = b""  # a line too long to be progress
        for line in lines:
            _match(line, ctx, found)
    if found is not None and pending:
        _match(pending, ctx, found)
    return bytes(kept)


def _match(line: bytes, ctx: ToolContext, found: re.Pattern[str]) -> None:
    match = found.search(line.decode("utf-8", errors="replace").rstrip("\r"))
    if match is not None:
        ctx.heartbeat(details_of(match))
