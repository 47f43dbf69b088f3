"""Tools on MCP servers, called over stdio with the official ``mcp`` SDK.

Servers are declared in saga.toml (the working directory's, or ``SAGA_CONFIG``)::

    [mcp.servers.files]
    command = "npx"                       # required: the program that starts the server
    args = ["-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]
    env = { LOG_LEVEL = "warn" }          # merged over the SDK's safe default environment
    cwd = "/srv"                          # optional working directory
    startup_timeout = 30                  # seconds to start and initialise (default 30)
    timeout = 120                         # optional per-call read timeout, seconds

and their tools are addressed as ``mcp.SERVER.TOOL`` (``tool: mcp.files.read_file``). A
server is started the first time one of its tools is looked up (when a composition naming
it is loaded, or when every tool is listed); its tool list and input schemas become the
tools' parameter schemas, so parameters are checked when the composition is loaded.

One process per server is started and reused for every call in this Python process. The
sessions live on a dedicated background thread with its own event loop (the executor runs
each drive with ``asyncio.run``, so no executor loop outlives a run); calls are submitted
to it with ``asyncio.run_coroutine_threadsafe``. Sessions are closed at interpreter exit
or by :func:`close` / :meth:`MCPManager.close`. A server that dies is started again on the
next call.

Both majors of the SDK work (``mcp>=1.2,<3``): the few names 2.x changed (camelCase fields
became snake_case, ``McpError`` became ``MCPError``, timeouts are seconds rather than a
``timedelta``, a timed-out request has its own JSON-RPC code) are read through
:func:`_field`, :func:`_mcp_error` and :func:`_read_timeout`, so a server built with
either major serves a client of either major (it is the same protocol).

Results: ``structuredContent`` when the server gives it; otherwise the text content
joined with newlines (parsed as JSON when it is JSON); other content (images, resources)
as ``{"content": [...]}``. A result with ``isError`` fails the step with error type
``MCPError``; a server that cannot start or dies fails it with ``MCPServerError``
(retryable) naming the server, and at load time raises :class:`ConfigError`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib.util
import json
import tempfile
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import version
from typing import IO, Any, TypeVar

from saga.errors import ConfigError, ToolError
from saga.tools.base import Tool, ToolContext

T = TypeVar("T")
_KEYS = {"command", "args", "env", "cwd", "startup_timeout", "timeout"}


@dataclass(frozen=True)
class ServerConfig:
    """One ``[mcp.servers.NAME]`` table, validated (hashable: it keys the sessions)."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] | None = None
    cwd: str | None = None
    startup_timeout: float = 30.0
    timeout: float | None = None

    @property
    def display(self) -> str:
        """The command line, for messages."""
        return " ".join([self.command, *self.args])


def server_configs(config: Mapping[str, Any]) -> list[ServerConfig]:
    """The servers declared in saga.toml data, or ConfigError naming the bad one."""
    section = config.get("mcp") or {}
    servers = section.get("servers", {}) if isinstance(section, dict) else None
    if not isinstance(servers, dict):
        raise ConfigError("[mcp.servers] must be a table of [mcp.servers.NAME] tables")
    out = []
    for name, table in servers.items():
        where = f"[mcp.servers.{name}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table with at least `command`")
        if "." in name or not name:
            raise ConfigError(f"{where}: a server name cannot contain '.'")
        unknown = sorted(set(table) - _KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} "
                              f"(expected: {', '.join(sorted(_KEYS))})")
        command = table.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(f"{where}: `command` (a program name or path) is required")
        args = table.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str | int | float) for a in args):
            raise ConfigError(f"{where}: `args` must be a list of strings")
        env = table.get("env")
        if env is not None and not isinstance(env, dict):
            raise ConfigError(f"{where}: `env` must be a table of strings")
        try:
            startup = float(table.get("startup_timeout", 30))
            timeout = float(table["timeout"]) if table.get("timeout") is not None else None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: timeouts must be numbers of seconds") from e
        out.append(ServerConfig(
            name=name, command=command, args=tuple(str(a) for a in args),
            env=tuple(sorted((str(k), str(v)) for k, v in env.items())) if env else None,
            cwd=str(table["cwd"]) if table.get("cwd") else None,
            startup_timeout=startup, timeout=timeout))
    if out and importlib.util.find_spec("mcp") is None:
        raise ConfigError("saga.toml declares MCP servers, and the MCP tools need the mcp "
                          "extra: pip install 'saga[mcp]'")
    return out


class ServerUnavailable(Exception):
    """A server could not be started or died; the message names it."""


@dataclass
class _Entry:
    """A running (or starting) server, owned by the manager's loop."""

    config: ServerConfig
    ready: asyncio.Future[Any]
    stop: asyncio.Event
    errlog: IO[bytes]
    task: asyncio.Task[None] | None = None
    session: Any = None
    last_stderr: str = ""

    def stderr_tail(self, size: int = 800) -> str:
        if self.errlog.closed:
            return self.last_stderr[-size:]
        try:
            self.errlog.flush()
            self.errlog.seek(0)
            return self.errlog.read().decode("utf-8", "replace").strip()[-size:]
        except (OSError, ValueError):
            return ""


class MCPManager:
    """MCP client sessions, one per server, on a background thread's event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._entries: dict[ServerConfig, _Entry] = {}
        self._atexit = False

    # -- the loop thread -----------------------------------------------------------------

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=_run_loop, args=(loop,), name="saga-mcp",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                if not self._atexit:
                    atexit.register(self.close)
                    self._atexit = True
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run a coroutine on the manager's loop."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure_loop())

    def close(self, timeout: float = 10) -> None:
        """Stop every server and the loop thread (a later call starts them again)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close_all(timeout), loop).result(timeout + 1)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)

    # -- blocking and async entry points --------------------------------------------------

    def list_tools(self, config: ServerConfig) -> list[Any]:
        """The server's tools (``mcp.types.Tool``), starting it if needed (blocking)."""
        try:
            return self.submit(self._list(config)).result()
        except (ServerUnavailable, ToolError) as e:
            raise ConfigError(f"cannot list the tools of MCP server {config.name!r}: {e}"
                              if isinstance(e, ToolError) else str(e)) from None

    def call(self, config: ServerConfig, tool: str, arguments: dict[str, Any]) -> Any:
        """Call a tool and return its result as JSON (blocking)."""
        return self.submit(self._call(config, tool, arguments)).result()

    async def call_async(self, config: ServerConfig, tool: str,
                         arguments: dict[str, Any]) -> Any:
        """Call a tool from any event loop; cancelling this cancels the call."""
        return await asyncio.wrap_future(self.submit(self._call(config, tool, arguments)))

    def running(self) -> list[str]:
        """Names of the servers with a live session."""
        return sorted(c.name for c, e in self._entries.items()
                      if e.session is not None and e.task is not None and not e.task.done())

    # -- on the manager loop ---------------------------------------------------------------

    async def _entry(self, config: ServerConfig) -> _Entry:
        entry = self._entries.get(config)
        if entry is not None and entry.stop.is_set() and entry.task is not None:
            await asyncio.wait([entry.task], timeout=5)  # a closing session: let it go
            entry = None
        if entry is None or (entry.task is not None and entry.task.done()):
            loop = asyncio.get_running_loop()
            entry = _Entry(config, loop.create_future(), asyncio.Event(),
                           tempfile.TemporaryFile())  # noqa: SIM115 - closed by _serve
            entry.task = loop.create_task(self._serve(entry))
            self._entries[config] = entry
        try:
            await asyncio.wait_for(asyncio.shield(entry.ready), config.startup_timeout)
        except TimeoutError:
            entry.stop.set()
            if entry.task is not None:
                entry.task.cancel()
            raise ServerUnavailable(self._why(entry, f"it did not initialise within "
                                                     f"{config.startup_timeout:g}s")) from None
        except Exception as e:
            raise ServerUnavailable(self._why(entry, _reason(e))) from None
        return entry

    @staticmethod
    def _why(entry: _Entry, reason: str) -> str:
        config = entry.config
        tail = entry.stderr_tail()
        return (f"MCP server {config.name!r} ({config.display}) could not start: {reason}"
                + (f"; its stderr: {tail}" if tail else ""))

    async def _serve(self, entry: _Entry) -> None:
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client

        config = entry.config
        params = StdioServerParameters(command=config.command, args=list(config.args),
                                       env=dict(config.env) if config.env else None,
                                       cwd=config.cwd)
        try:
            errlog: Any = entry.errlog  # a binary file: the SDK writes text or bytes to it
            async with stdio_client(params, errlog=errlog) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                entry.session = session
                entry.ready.set_result(session)
                await entry.stop.wait()
        except BaseException as e:
            if not entry.ready.done():
                entry.ready.set_exception(e if isinstance(e, Exception)
                                          else RuntimeError("start-up was cancelled"))
            if not isinstance(e, Exception):
                raise
        finally:
            entry.session = None
            if self._entries.get(config) is entry:
                del self._entries[config]
            entry.last_stderr = entry.stderr_tail(4000)
            entry.errlog.close()

    async def _close_all(self, timeout: float) -> None:
        entries = list(self._entries.values())
        for entry in entries:
            entry.stop.set()
        tasks = [e.task for e in entries if e.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=2)

    async def _list(self, config: ServerConfig) -> list[Any]:
        entry = await self._entry(config)
        tools: list[Any] = []
        cursor = None
        while True:
            from mcp.types import PaginatedRequestParams

            page = await self._guard(entry, entry.session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None))
            tools += page.tools
            cursor = _field(page, "next_cursor", "nextCursor")
            if not cursor:
                return tools

    async def _call(self, config: ServerConfig, tool: str, arguments: dict[str, Any]) -> Any:
        try:
            entry = await self._entry(config)
        except ServerUnavailable as e:
            raise ToolError(str(e), error_type="MCPServerError", retryable=True) from None
        # per call, so a short `timeout` does not also bound start-up (startup_timeout does)
        result = await self._guard(entry, entry.session.call_tool(
            tool, arguments, read_timeout_seconds=_read_timeout(config.timeout)))
        return _result(config.name, tool, result)

    async def _guard(self, entry: _Entry, request: Coroutine[Any, Any, T]) -> T:
        """Await a request, failing (instead of hanging) when the server goes away."""
        import anyio
        from mcp import types

        mcp_error = _mcp_error()
        call = asyncio.ensure_future(request)
        assert entry.task is not None
        watch = {call, entry.task}
        try:
            await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            call.cancel()
            raise
        name = entry.config.name
        if not call.done():
            call.cancel()
            tail = entry.stderr_tail()
            raise ToolError(f"MCP server {name!r} exited during the call"
                            + (f"; its stderr: {tail}" if tail else ""),
                            error_type="MCPServerError", retryable=True)
        try:
            return call.result()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError) as e:
            entry.stop.set()
            raise ToolError(f"MCP server {name!r} is gone ({type(e).__name__})",
                            error_type="MCPServerError", retryable=True) from None
        except mcp_error as e:
            error: Any = e.error  # type: ignore[attr-defined]  # both majors' ErrorData
            if error.code == types.CONNECTION_CLOSED:
                entry.stop.set()
                raise ToolError(f"MCP server {name!r} closed the connection: {error.message}",
                                error_type="MCPServerError", retryable=True) from None
            # the session's read timeout: 408 in 1.x, JSON-RPC REQUEST_TIMEOUT in 2.x
            if error.code in (408, getattr(types, "REQUEST_TIMEOUT", 408)):
                raise ToolError(f"MCP server {name!r}: {error.message}",
                                error_type="timeout", retryable=True) from None
            raise ToolError(f"MCP server {name!r}: {error.message}", error_type="MCPError",
                            retryable=False, details={"code": error.code}) from None


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _reason(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, _mcp_error()):
        message = getattr(e, "error").message  # noqa: B009 - both majors' ErrorData
        return f"{message} (the process exited or closed its output)"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _result(server: str, tool: str, result: Any) -> Any:
    """A ``CallToolResult`` as the step's JSON output (or ToolError for ``isError``)."""
    texts = [c.text for c in result.content if getattr(c, "type", None) == "text"]
    structured = _field(result, "structured_content", "structuredContent")
    if _field(result, "is_error", "isError"):
        message = "\n".join(texts).strip() or "the tool reported an error"
        raise ToolError(f"mcp.{server}.{tool}: {message}", error_type="MCPError",
                        retryable=True, details=structured)
    if structured is not None:
        return structured
    if len(texts) == len(result.content):
        text = "\n".join(texts)
        try:
            return json.loads(text)
        except ValueError:
            return text
    # by_alias: the wire's camelCase names (``mimeType``) in both majors
    return {"content": [c.model_dump(mode="json", exclude_none=True, by_alias=True)
                        for c in result.content]}


def _field(obj: Any, name: str, v1_name: str) -> Any:
    """A protocol field by its 2.x (snake_case) name, or its 1.x (camelCase) one."""
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, v1_name, None)


def _mcp_error() -> type[Exception]:
    """The SDK's error for an error response: ``MCPError`` (2.x) or ``McpError`` (1.x)."""
    from mcp.shared import exceptions

    found: type[Exception] = (getattr(exceptions, "MCPError", None)
                              or getattr(exceptions, "McpError"))  # noqa: B009
    return found


def _sdk_major() -> int:
    return int(version("mcp").split(".")[0])


def _read_timeout(seconds: float | None) -> Any:
    """A call's read timeout as the installed SDK takes it (2.x: seconds, 1.x: a
    ``timedelta``)."""
    if not seconds:
        return None
    return seconds if _sdk_major() >= 2 else timedelta(seconds=seconds)


#: The process-wide manager every MCP tool uses.
MANAGER = MCPManager()


def close() -> None:
    """Stop every MCP server this process started."""
    MANAGER.close()


class MCPServer:
    """A registry provider: the tools of one server, listed when first needed."""

    def __init__(self, config: ServerConfig, manager: MCPManager | None = None) -> None:
        self.config = config
        self.manager = manager or MANAGER
        self.prefix = f"mcp.{config.name}."

    def load(self) -> list[Tool]:
        """The server's tools as saga tools (starts the server; ConfigError if it cannot)."""
        return [self.tool(t) for t in self.manager.list_tools(self.config)]

    def tool(self, listed: Any) -> Tool:
        """One listed MCP tool as a saga tool named ``mcp.SERVER.TOOL``."""
        config, manager, name = self.config, self.manager, listed.name

        async def call(params: dict[str, Any], ctx: ToolContext) -> Any:
            return await manager.call_async(config, name, dict(params))

        description = (listed.description or listed.title or "").strip().split("\n")[0]
        schema = dict(_field(listed, "input_schema", "inputSchema") or {}) or None
        return Tool(f"{self.prefix}{name}", call, None, description, f"mcp:{config.name}",
                    schema)


def providers(config: Mapping[str, Any],
              manager: MCPManager | None = None) -> list[MCPServer]:
    """One provider per server declared in saga.toml data."""
    return [MCPServer(c, manager) for c in server_configs(config)]
