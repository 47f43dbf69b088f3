"""A small MCP server to try saga's MCP tools with: ``python -m saga.tools.demo_mcp``.

It speaks MCP over stdio and is what the ``mcp-tools`` template's saga.toml stanza starts
(``[mcp.servers.demo] command = "python3", args = ["-m", "saga.tools.demo_mcp"]``). Its
tools: ``echo``, ``add``, ``fail`` (always an error result), and ``kv_put`` / ``kv_get`` /
``kv_delete`` over a store kept in this process, so successive calls of one run see each
other's writes. Needs the ``mcp`` extra (``pip install 'saga[mcp]'``).
"""

from __future__ import annotations

from typing import Any


def build() -> Any:
    """The demo server, on either major of the ``mcp`` SDK (``FastMCP`` in 1.x,
    ``MCPServer`` in 2.x: same decorators, same stdio transport)."""
    try:  # mcp 2.x
        from mcp.server.mcpserver import MCPServer as Server
        from mcp.server.mcpserver.exceptions import ToolError
    except ImportError:  # mcp 1.x
        from mcp.server.fastmcp import FastMCP as Server  # type: ignore[no-redef,attr-defined,unused-ignore]
        from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef,import-not-found,unused-ignore]

    server = Server("saga-demo")
    store: dict[str, str] = {}

    @server.tool()
    def echo(text: str) -> str:
        """Returns the text unchanged."""
        return text

    @server.tool()
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    @server.tool()
    def fail(message: str) -> str:
        """Always fails with the message (a deliberate failure)."""
        raise ToolError(message)

    @server.tool()
    def kv_put(key: str, value: str) -> dict[str, str]:
        """Stores a value under a key in this server process."""
        store[key] = value
        return {"key": key, "value": value}

    @server.tool()
    def kv_get(key: str) -> str | None:
        """Reads a value stored by kv_put (null when absent)."""
        return store.get(key)

    @server.tool()
    def kv_delete(key: str) -> bool:
        """Forgets a key; true when it was there."""
        return store.pop(key, None) is not None

    return server


if __name__ == "__main__":
    build().run()
