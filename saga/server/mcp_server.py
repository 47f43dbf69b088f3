"""``saga mcp``: the engine as an MCP server, on the official ``mcp`` SDK's server side.

Its tools: one per composition in the catalog folders (each template, each composition
file, each seed 003 ``SKILL.md``), named and described as the composition is, whose
input schema is built from the declared inputs; and the engine's own: ``skill_run(name,
inputs, run_id?)`` (seed 002's spelling), ``saga_status``, ``saga_list``,
``saga_history``, ``saga_signal``, ``saga_cancel``, and ``saga_approve`` only when the
server was started with ``--allow-approve`` (approvals are people's business).

A call that starts a run drives it here, in a thread of this process (holding its lease,
as ``saga run`` does), and answers when the run ends or waits, or after ``wait`` seconds
with the run's id and how to follow it (the run goes on here; if this process dies, any
worker takes it over). Each step that ends is reported to the client as MCP progress when
the call carried a progress token. Every refusal (an unknown name, an invalid
composition, bad inputs, a store that cannot be reached) is a tool error (``isError``)
with one line, and nothing is recorded for it; the server itself never stops for one.

The SDK is imported only here, when ``saga mcp`` runs (it is the ``mcp`` extra). Both of
its majors are served: 2.x's lowlevel ``Server`` takes its handlers in the constructor,
1.x's by decorators (see :func:`build_server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saga.api import Saga
from saga.composition import compile_any, resolve
from saga.composition.definition import Definition, load_file
from saga.composition.library import saga_version, template_dirs, template_files
from saga.domain import Run
from saga.errors import DefinitionError, InputError, Problem, SagaError

log = logging.getLogger("saga.mcp")

#: The statuses a step ends in, for progress.
_STEP_ENDED = {"completed", "failed", "skipped", "compensated"}
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_ACTOR_PART = re.compile(r"[^\w.@:+/-]+")

_ENGINE_TOOLS: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "skill_run": (
        "Run a composition (a template's or a file's name, as listed by this server) with "
        "its inputs; answers with the run's outcome, or its id while it goes on.",
        {"name": {"type": "string", "description": "the composition or template"},
         "inputs": {"type": "object", "description": "the composition's inputs",
                    "default": {}},
         "run_id": {"type": "string", "description": "your name for the run (ORDER-42): "
                                                     "calling again with it does not run twice"}},
        ["name"]),
    "saga_status": ("A run's status, outputs, error and steps.",
                    {"run_id": {"type": "string"}}, ["run_id"]),
    "saga_list": ("Runs, newest first, optionally by status or label (key=value).",
                  {"status": {"type": "string", "enum": [
                      "running", "waiting", "paused", "completed", "failed", "compensated",
                      "cancelled"]},
                   "label": {"type": "string", "description": "key=value"},
                   "limit": {"type": "integer", "minimum": 1, "maximum": 500,
                             "default": 50}}, []),
    "saga_history": ("Every event of a run, in order.",
                     {"run_id": {"type": "string"}}, ["run_id"]),
    "saga_signal": ("Send a signal to a run: the first step waiting for it continues with "
                    "the data.",
                    {"run_id": {"type": "string"}, "name": {"type": "string"},
                     "data": {"description": "any JSON value"}}, ["run_id", "name"]),
    "saga_cancel": ("Cancel an unfinished run: its completed steps are undone.",
                    {"run_id": {"type": "string"}, "reason": {"type": "string"}},
                    ["run_id", "reason"]),
    "saga_approve": ("Approve a step that waits for a person's confirmation.",
                     {"run_id": {"type": "string"}, "step": {"type": "string"},
                      "comment": {"type": "string"}}, ["run_id", "step"]),
}
#: The tools that change runs (refused to a read-only HTTP token).
_WRITES = {"skill_run", "saga_signal", "saga_cancel", "saga_approve"}


class ToolRefused(Exception):
    """A call answered with an MCP tool error (``isError``) and this one line."""


def input_schema(definition: Definition) -> dict[str, Any]:
    """The JSON Schema of a composition's declared inputs: types, required, defaults,
    enums, patterns, lengths and bounds. One that declares none accepts any object (as
    :func:`~saga.composition.definition.resolve_inputs` does)."""
    properties: dict[str, Any] = {}
    for spec in definition.inputs:
        prop: dict[str, Any] = {} if spec.type == "any" else {"type": spec.type}
        for key, value in (("description", spec.description), ("default", spec.default),
                           ("enum", spec.enum), ("pattern", spec.pattern),
                           ("minLength", spec.min_length), ("maxLength", spec.max_length),
                           ("minimum", spec.minimum), ("maximum", spec.maximum)):
            if value is not None:
                prop[key] = value
        if spec.secret:
            prop["writeOnly"] = True
        properties[spec.name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    required = [s.name for s in definition.inputs if s.required and s.default is None]
    if required:
        schema["required"] = required
    if definition.inputs:
        schema["additionalProperties"] = False
    return schema


@dataclass
class Entry:
    """One composition offered as a tool."""

    name: str
    path: Path
    description: str = ""
    schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    error: str | None = None  # why it cannot run (answered when it is called)


def _tool_name(name: str) -> str:
    """A name MCP clients accept (letters, digits, ``_.-``; at most 64)."""
    return _TOOL_NAME.sub("_", name).strip("_")[:64] or "composition"


def catalog(dirs: list[Path]) -> dict[str, Entry]:
    """The compositions of the folders, by tool name: the composition's own name (a
    seed 001 document's id), else the file's; the first of a name wins, and an engine
    tool's name is never taken."""
    entries: dict[str, Entry] = {}
    for stem, path in template_files(dirs).items():
        try:
            data = load_file(path)
            plan = compile_any(data, source=str(path))
            definition = plan.definition
            title = definition.metadata.get("template_id") or definition.name
            entry = Entry(_tool_name(str(title)), path,
                          " ".join((definition.description or definition.name).split()),
                          input_schema(definition))
        except DefinitionError as e:
            entry = Entry(_tool_name(stem), path, f"(invalid: {_one_line(e)})", error=_one_line(e))
        if entry.name not in entries and entry.name not in _ENGINE_TOOLS:
            entries[entry.name] = entry
    return entries


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())


@dataclass
class Call:
    """What a tool call knows of its caller: who, may it write, and how to report."""

    client: str = "client"
    writes: bool = True
    progress: Callable[[float, float | None, str], Any] | None = None


class SagaMCP:
    """The server's logic, independent of the SDK's shapes: a :class:`Saga` over the
    configured store, the catalog folders, and how long a call waits for its run."""

    def __init__(self, saga: Saga, dirs: list[Path], *, wait: float = 30.0,
                 allow_approve: bool = False, viewer: str | None = None) -> None:
        self.saga, self.dirs, self.wait = saga, dirs, wait
        self.allow_approve, self.viewer = allow_approve, viewer

    def tools(self) -> list[dict[str, Any]]:
        """Every tool as ``{name, description, inputSchema}``."""
        out = [{"name": e.name, "description": e.description, "inputSchema": e.schema}
               for e in catalog(self.dirs).values()]
        for name, (description, props, required) in _ENGINE_TOOLS.items():
            if name == "saga_approve" and not self.allow_approve:
                continue
            schema: dict[str, Any] = {"type": "object", "properties": props,
                                      "additionalProperties": False}
            if required:
                schema["required"] = required
            out.append({"name": name, "description": description, "inputSchema": schema})
        return out

    async def call(self, name: str, arguments: Mapping[str, Any], call: Call) -> Any:
        """Answer one tool call with JSON, or raise :class:`ToolRefused`."""
        args = dict(arguments or {})
        if not call.writes and (name in _WRITES or name not in _ENGINE_TOOLS):
            raise ToolRefused(f"{name}: this token may only read runs")
        try:
            if name == "skill_run":
                return await self._run(str(args.get("name") or ""), args.get("inputs"),
                                       args.get("run_id"), call)
            if name in _ENGINE_TOOLS and (name != "saga_approve" or self.allow_approve):
                answer = await asyncio.to_thread(self._engine, name, args, call)
                if isinstance(answer, Run):  # a signal or an approval: the run goes on here
                    return await self._follow(answer, call)
                return answer
            entries = catalog(self.dirs)
            if name in entries:
                return await self._run(name, args, None, call)
            raise ToolRefused(f"unknown tool {name!r}: call skill_run with a composition's "
                              "name, or list the tools")
        except SagaError as e:
            raise ToolRefused(_one_line(e)) from None

    # -- engine tools -----------------------------------------------------------------------

    def _engine(self, name: str, args: dict[str, Any], call: Call) -> Any:
        saga, actor = self.saga, self._actor(call)
        run_id = str(args.get("run_id") or "")
        if name == "saga_status":
            return self._with_follow(saga.status(run_id))
        if name == "saga_history":
            return saga.history(run_id)
        if name == "saga_list":
            labels = {}
            if args.get("label"):
                key, sep, value = str(args["label"]).partition("=")
                if not sep:
                    raise InputError([Problem("label", "write it as key=value")])
                labels[key] = value
            return saga.list_runs(args.get("status"), int(args.get("limit") or 50),
                                  labels=labels)
        if name == "saga_signal":
            return saga.signal(run_id, str(args.get("name") or ""), args.get("data"),
                               actor=actor)
        if name == "saga_cancel":
            run = saga.cancel(run_id, actor=actor, reason=str(args.get("reason") or ""))
            return self.outcome(run)
        if name == "saga_approve":
            return saga.approve(run_id, str(args.get("step") or ""), actor=actor,
                                comment=args.get("comment"))
        raise ToolRefused(f"unknown tool {name!r}")

    @staticmethod
    def _actor(call: Call) -> str:
        return f"mcp:{_ACTOR_PART.sub('-', call.client)[:90] or 'client'}"

    # -- runs -------------------------------------------------------------------------------

    def _source(self, name: str) -> Path:
        """The composition a ``skill_run`` names: a tool's name, a template's, or a file."""
        entry = catalog(self.dirs).get(name)
        if entry is not None:
            if entry.error is not None:
                raise ToolRefused(f"{name}: {entry.error}")
            return entry.path
        if not name:
            raise InputError([Problem("name", "give the composition to run")])
        files = template_files(self.dirs)
        if name in files:
            return files[name]
        try:
            return resolve(name)
        except DefinitionError as e:
            raise ToolRefused(f"unknown composition {name!r}: {e.problems[0].message}; "
                              "list this server's tools for the ones it offers") from None

    async def _run(self, name: str, inputs: Any, run_id: Any, call: Call) -> dict[str, Any]:
        if inputs is not None and not isinstance(inputs, dict):
            raise InputError([Problem("inputs", "must be an object of the composition's "
                                                "inputs")])
        if run_id is not None and not isinstance(run_id, str):
            raise InputError([Problem("run_id", "must be a string")])
        path = self._source(name)

        def start() -> Run:
            plan = self.saga.load(path)
            return self.saga.start(plan, inputs or {}, actor=self._actor(call),
                                   run_id=run_id or None)

        run = await asyncio.to_thread(start)  # checked, not yet saved: a refusal records nothing
        if not run.pending_events:
            return self.outcome(run)  # started before under this run_id: nothing runs again
        return await self._follow(run, call)

    async def _follow(self, run: Run, call: Call) -> dict[str, Any]:
        """Drive a run here, in a thread, reporting each step that ends; its outcome when
        it ends or waits within :attr:`wait` seconds, else how to follow it."""
        if run.is_finished:
            return self.outcome(run)
        loop = asyncio.get_running_loop()
        ended: asyncio.Future[Run] = loop.create_future()
        steps: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        seen: set[tuple[str, str]] = set()
        total = float(len(self.saga.executor_plan(run).order)) or None

        def on_events(current: Run, events: list[Any]) -> None:
            for key, state in current.steps.items():
                if state.get("status") in _STEP_ENDED and (key, state["status"]) not in seen:
                    seen.add((key, state["status"]))
                    _threadsafe(loop, steps.put_nowait, (len(seen), f"{key} {state['status']}"))

        def drive() -> None:
            try:
                result = self.saga.drive(run, on_events=on_events)
            except BaseException as e:  # handed to the waiting call, which answers it
                _threadsafe(loop, _settle, ended, None, e)
            else:
                _threadsafe(loop, _settle, ended, result, None)

        # A daemon thread: a run still going when the client leaves goes on here, and if
        # this process exits first, its lease lapses and any worker continues it.
        threading.Thread(target=drive, name=f"saga-mcp-{run.run_id}", daemon=True).start()
        deadline = loop.time() + self.wait
        while not ended.done():
            left = deadline - loop.time()
            if left <= 0:
                break
            getter: asyncio.Future[Any] = asyncio.ensure_future(steps.get())
            await asyncio.wait({ended, getter}, timeout=left,
                               return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                count, message = getter.result()
                await self._report(call, count, message, total)
            else:
                getter.cancel()
        while not steps.empty():
            count, message = steps.get_nowait()
            await self._report(call, count, message, total)
        if ended.done():
            return self.outcome(ended.result())
        current = await asyncio.to_thread(self.saga.get, run.run_id)
        return self.outcome(current, still=True)

    @staticmethod
    async def _report(call: Call, done: int, message: str, total: float | None) -> None:
        if call.progress is None:
            return
        try:
            await call.progress(float(done), max(total, float(done)) if total else None,
                                message)
        except Exception:  # a client gone: the run goes on without its progress
            log.debug("progress not delivered", exc_info=True)

    def outcome(self, run: Run, still: bool = False) -> dict[str, Any]:
        """What a call answers about a run: status, outputs, error, the steps that failed
        or were compensated; and, for a run not ended, how to follow it and who must
        approve what it waits for."""
        out: dict[str, Any] = {
            "run_id": run.run_id, "definition": run.name, "status": run.status,
            "outputs": run.outputs, "error": run.error,
            "failed_steps": {k: s.get("error") for k, s in run.steps.items()
                             if s["status"] == "failed"},
            # in the order they were undone (the reverse of their completion)
            "compensated_steps": [k for k in (run.compensation or {}).get("steps", [])
                                  if run.steps.get(k, {}).get("status") == "compensated"]}
        if not run.is_finished:
            out = self._with_follow(out)
            if still:
                out["note"] = (f"still {run.status} after {self.wait:g}s; it goes on: "
                               "call saga_status with its run_id to follow it")
        return out

    def _with_follow(self, summary: dict[str, Any]) -> dict[str, Any]:
        run_id, status = summary["run_id"], summary["status"]
        if status in ("completed", "failed", "compensated", "cancelled"):
            return summary
        summary["follow"] = {"tool": "saga_status", "cli": f"saga status {run_id}",
                             "watch": f"saga watch {run_id}"}
        if self.viewer:
            summary["follow"]["url"] = f"{self.viewer.rstrip('/')}/runs/{run_id}"
        try:
            waiting = self.saga.get(run_id).pending_approvals
        except SagaError:
            waiting = []
        if waiting:
            who = ("call saga_approve, or a person runs" if self.allow_approve else
                   "a person (not the agent) with access to the store runs")
            summary["approval"] = [
                {"step": step, "who": f"{who}: saga approve {run_id} {step} "
                                      f"(or saga reject {run_id} {step})",
                 "command": f"saga approve {run_id} {step}",
                 **({"url": summary["follow"]["url"]} if self.viewer else {})}
                for step in waiting]
        return summary


def _settle(future: asyncio.Future[Run], result: Run | None,
            error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        assert result is not None
        future.set_result(result)


def _threadsafe(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    """Hand a result to the call's loop (gone when the client left: then nobody waits)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def viewer_url(settings_file: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """Where people open the run viewer of ``saga serve``: ``SAGA_VIEWER_URL``, else
    saga.toml ``[serve] url``; None when neither says."""
    serve = settings_file.get("serve")
    url = env.get("SAGA_VIEWER_URL") or (serve.get("url") if isinstance(serve, dict) else None)
    return str(url) if url else None


def default_dirs(saga: Saga) -> list[Path]:
    """The configured templates path (``SAGA_TEMPLATES``, saga.toml ``templates``, the
    built-in templates)."""
    return template_dirs(saga.settings)


# -- the SDK's side -------------------------------------------------------------------------


def _field(obj: Any, name: str, v1_name: str) -> Any:
    """A field by its 2.x (snake_case) name, or its 1.x (camelCase) one."""
    return getattr(obj, name) if hasattr(obj, name) else getattr(obj, v1_name, None)


def _caller(ctx: Any, writes: Callable[[Any], bool]) -> Call:
    """The call's client name, write access and progress reporter, from the SDK's request
    context (either major)."""
    session = getattr(ctx, "session", None)
    info = _field(getattr(session, "client_params", None), "client_info", "clientInfo")
    client = str(getattr(info, "name", "") or "client")
    report = getattr(session, "report_progress", None)  # 2.x: a no-op without a token
    progress: Callable[[float, float | None, str], Any] | None = None
    if report is not None:
        async def progress(done: float, total: float | None, message: str) -> None:
            await report(done, total, message)
    else:  # 1.x: the token is in the request's meta
        token = _field(getattr(ctx, "meta", None), "progress_token", "progressToken")
        if token is not None and session is not None:
            async def progress(done: float, total: float | None, message: str) -> None:
                await session.send_progress_notification(
                    token, done, total, message=message,
                    related_request_id=getattr(ctx, "request_id", None))
    return Call(client, writes(getattr(ctx, "request", None)), progress)


def build_server(logic: SagaMCP, writes: Callable[[Any], bool] = lambda request: True) -> Any:
    """The SDK's lowlevel server answering ``tools/list`` and ``tools/call`` with
    ``logic``; ``writes(request)`` says whether an HTTP request's token may change runs."""
    from mcp import types as sdk_types
    from mcp.server.lowlevel import Server

    types: Any = sdk_types  # camelCase keywords: the wire's names, taken by both majors

    def listed() -> list[Any]:
        return [types.Tool(name=t["name"], description=t["description"],
                           inputSchema=t["inputSchema"]) for t in logic.tools()]

    async def answer(ctx: Any, name: str, arguments: Mapping[str, Any] | None) -> Any:
        try:
            result = await logic.call(name, arguments or {}, _caller(ctx, writes))
        except ToolRefused as e:
            return _error(types, str(e))
        except Exception as e:  # never a crashed server: one line, the trace in the log
            log.exception("tool %s failed", name)
            return _error(types, f"{name}: {type(e).__name__}: {e}")
        text = json.dumps(result, default=str, ensure_ascii=False)
        structured = result if isinstance(result, dict) else {"result": result}
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structuredContent=structured, isError=False)

    async def on_list_tools(ctx: Any, params: Any) -> Any:
        return types.ListToolsResult(tools=listed())

    async def on_call_tool(ctx: Any, params: Any) -> Any:
        return await answer(ctx, params.name, params.arguments)

    try:  # 2.x: handlers in the constructor
        return Server("saga", version=saga_version(), on_list_tools=on_list_tools,
                      on_call_tool=on_call_tool)
    except TypeError:  # 1.x: handlers by decorator, the context in a context variable
        server: Any = Server("saga", version=saga_version())

        async def _list() -> list[Any]:
            return listed()

        async def _call(name: str, arguments: dict[str, Any]) -> Any:
            return await answer(server.request_context, name, arguments)

        server.list_tools()(_list)
        server.call_tool()(_call)
        return server


def _error(types: Any, message: str) -> Any:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)],
                                isError=True)


async def serve_stdio(server: Any) -> None:
    """Serve one client over stdin/stdout until it closes them."""
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def http_app(server: Any, host: str, tokens: Any) -> Any:
    """The streamable HTTP app at ``/mcp``, behind ``saga serve``'s bearer tokens
    (:class:`saga.server.service.Tokens`): none or a wrong one is 401; a read token may
    only call the tools that read."""
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from mcp.server.transport_security import TransportSecuritySettings
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    local = host in ("127.0.0.1", "localhost", "::1")
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=local,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"] if local else [],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
        if local else [])
    manager = StreamableHTTPSessionManager(app=server, security_settings=security)
    handle = getattr(manager, "asgi_app", None) or manager.handle_request

    class Endpoint:
        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            headers = dict(scope.get("headers") or [])
            presented = _bearer(headers.get(b"authorization", b"").decode("latin-1"))
            if tokens.access(presented) is None:
                await JSONResponse({"error": "Unauthorized", "detail": "a valid bearer token "
                                    "(SAGA_API_TOKEN or SAGA_API_READ_TOKEN) is required"},
                                   401)(scope, receive, send)
                return
            await handle(scope, receive, send)

    def lifespan(app: Any) -> Any:
        return manager.run()

    return Starlette(routes=[Route("/mcp", endpoint=Endpoint(), methods=["GET", "POST",
                                                                          "DELETE"])],
                     lifespan=lifespan)


def _bearer(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def token_writes(tokens: Any) -> Callable[[Any], bool]:
    """Whether an HTTP request's token may change runs (stdio, with no request: yes)."""
    def writes(request: Any) -> bool:
        if request is None or not hasattr(request, "headers"):
            return True
        return bool(tokens.access(_bearer(request.headers.get("authorization", ""))) == "write")
    return writes
