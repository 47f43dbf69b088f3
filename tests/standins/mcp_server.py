"""A small MCP server for tests, run over stdio: ``python tests/standins/mcp_server.py``.

Tools: ``add``, ``echo``, ``fail`` (always an error result), ``kv_put`` / ``kv_get`` /
``kv_delete`` (state kept in this process, to prove one server process serves successive
calls), ``getenv``, ``pid``, ``slow``, ``die`` (exits the process mid-call) and
``sdk`` (the major version of the ``mcp`` SDK this server is built with).

It runs on either major of the SDK: ``FastMCP`` in 1.x, ``MCPServer`` in 2.x (same
decorators, same stdio transport).
"""

from __future__ import annotations

import asyncio
import os
from importlib.metadata import version

try:  # mcp 2.x
    from mcp.server.mcpserver import MCPServer as Server
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]

server = Server("saga-test")
_store: dict[str, str] = {}


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Returns the text unchanged."""
    return text


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message (a deliberate failure, whose text 2.x passes on)."""
    raise ToolError(message)


@server.tool()
def kv_put(key: str, value: str) -> dict[str, str]:
    """Stores a value under a key in this server process."""
    _store[key] = value
    return {"key": key, "value": value}


@server.tool()
def kv_get(key: str) -> str | None:
    """Reads a value stored by kv_put in this server process (null when absent)."""
    return _store.get(key)


@server.tool()
def kv_delete(key: str) -> bool:
    """Forgets a key; true when it was there."""
    return _store.pop(key, None) is not None


@server.tool()
def getenv(name: str) -> str | None:
    """An environment variable of the server process."""
    return os.environ.get(name)


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
async def slow(seconds: float) -> str:
    """Sleeps (without blocking other calls), then says so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
def sdk() -> int:
    """The major version of the mcp SDK this server runs on."""
    return int(version("mcp").split(".")[0])


@server.tool()
def die() -> str:
    """Exits the server process without answering."""
    os._exit(7)


if __name__ == "__main__":
    server.run()
