"""What a tool is: named callables ``(params, ctx) -> JSON value``, and their registry.

A tool is registered with :func:`tool` (a decorator), from the ``saga.tools``
entry-point group, or by importing a module named with ``--tools``, ``SAGA_TOOLS`` or
``saga.toml``. Built-ins are always present: ``noop``, ``echo``, ``sleep``, ``fail``
(:mod:`saga.tools.builtin`) and the tools that reach real systems, ``shell``, ``http``,
``sql``, ``file`` and ``git`` (one module each). Tools on MCP servers declared in
``saga.toml`` are addressed as ``mcp.SERVER.TOOL`` (:mod:`saga.tools.mcp`); a server is
started only when one of its tools is first looked up.

A tool may declare a parameter schema (``Tool.params``, a JSON-schema-like dict checked
by :mod:`saga.tools.schema`); ``compile_plan`` calls :meth:`Tool.check_parameters` so bad
parameters are reported when a composition is loaded, before anything runs.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from saga.errors import ConfigError, UnknownToolError
from saga.tools import schema as _schema

if TYPE_CHECKING:
    pass

ToolFunc = Callable[..., Any]
#: The output key under which a tool returns what it needs only to undo the call (a file's
#: previous bytes, rows captured before an update). The executor keeps it in the undo store
#: (:mod:`saga.store.undo`), never in the log, and hands it back, checked, to the tool's
#: own compensation as ``output["_undo"]``.
UNDO = "_undo"
#: A JSON-schema-like description of a tool's parameters (see :mod:`saga.tools.schema`).
ParamSchema = dict[str, Any]


@dataclass(frozen=True)
class ToolContext:
    """What a tool knows about the call it serves.

    Attributes:
        run_id: the run's id.
        step_id: the step being executed.
        iteration: the loop iteration (0 outside loops).
        attempt: 1 for the first attempt, 2 for the first retry, ...
        idempotency_key: ``run_id:step_id:iteration``, the same on every attempt and on
            re-execution after a crash, so a tool can deduplicate its effect.
        deadline: the wall-clock time (epoch seconds) after which the attempt is cancelled,
            or None.
        logger: a logger named after the tool (``saga.tool.NAME``); its lines carry the
            run, step and attempt (``saga --log-format json``).
        traceparent: the W3C trace context of this call's span (``00-TRACE-SPAN-01``)
            when tracing is on, to pass downstream (the ``http`` tool sends it as the
            ``traceparent`` header); None when it is off.
        usage: what the tool reported with :meth:`report_usage`, recorded with its output
            under ``_usage`` (an object output only) and summed per layer.
        last_heartbeat: the details an earlier attempt of this step last sent with
            :meth:`heartbeat` (as the log recorded them), so a retry can resume where it
            was; None on a first attempt or when none beat.
        on_heartbeat: where :meth:`heartbeat` reports (set by the executor).
    """

    run_id: str
    step_id: str
    iteration: int
    attempt: int
    idempotency_key: str
    deadline: float | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("saga.tool"))
    traceparent: str | None = None
    usage: dict[str, float] = field(default_factory=dict)
    last_heartbeat: Any = None
    on_heartbeat: Callable[[Any], None] | None = field(default=None, repr=False, compare=False)

    def heartbeat(self, details: Any = None) -> None:
        """Say the call is alive, with ``details`` of its progress (JSON; None keeps the
        last given). Cheap, from any thread: saga keeps the last details, not every beat
        (``saga status`` shows them; a retry gets them as :attr:`last_heartbeat`), and a
        step with ``heartbeat_timeout`` fails when beats stop for that long."""
        if self.on_heartbeat is not None:
            self.on_heartbeat(details)

    def report_usage(self, **amounts: float) -> None:
        """Report what the call used (``ctx.report_usage(tokens=1200)``): added up per
        kind, recorded with the output, and summed per layer in a layered run's outputs."""
        for kind, amount in amounts.items():
            self.usage[kind] = self.usage.get(kind, 0) + amount


@dataclass(frozen=True)
class Tool:
    """A registered tool: the function, its optional compensation, where it came from.

    Attributes:
        name: how steps name it (``tool: shell``).
        func: ``func(params, ctx)``, sync (run in a thread) or async.
        compensate: the tool's own compensation ``compensate(params, output, ctx)``, used
            by ``compensate: true`` with the step's recorded parameters and output.
        description: one line for ``saga tools``.
        source: ``builtin``, ``python:MODULE``, ``entry-point:...`` or ``mcp:SERVER``.
        params: the parameter schema (JSON-schema-like dict), or None for "anything".
        check: extra checks ``check(params) -> list[str]`` for rules a schema cannot say
            (e.g. "exactly one of a, b"); called only when the schema found nothing.
        undoes: ``undoes(params) -> bool``: whether the tool's own compensation can undo
            a call with these parameters (a shell call only with ``undo_argv``); None: any
            call it has a compensation for. A step whose call it can undo is undone by it
            on rollback unless the step says ``compensate: false``.
        resource: ``resource(params) -> NAME`` (or a list, or None): the resource a call
            counts against when its step names none (``http``: ``http:HOST``), limited by
            saga.toml ``[resources."NAME"]``; a string is that name for every call.
    """

    name: str
    func: ToolFunc
    compensate: ToolFunc | None = None
    description: str = ""
    source: str = "python"
    params: ParamSchema | None = field(default=None, hash=False)
    check: Callable[[dict[str, Any]], list[str]] | None = None
    undoes: Callable[[dict[str, Any]], bool] | None = None
    resource: Callable[[dict[str, Any]], str | list[str] | None] | str | None = None

    def __post_init__(self) -> None:
        # A compensation of the wrong shape would fail only at rollback, when the effect
        # it should undo is already there: refuse it when the tool is made.
        if self.compensate is not None:
            try:
                inspect.signature(self.compensate).bind(None, None, None)
            except TypeError:
                raise ConfigError(f"tool {self.name!r}: its compensation "
                                  f"{getattr(self.compensate, '__name__', '?')} must take "
                                  "(params, output, ctx)") from None
            except ValueError:  # a builtin without a signature: trust it
                pass

    def can_undo(self, params: dict[str, Any]) -> bool:
        """Whether the tool's own compensation undoes a call with these parameters."""
        return self.compensate is not None and (self.undoes is None or self.undoes(params))

    @property
    def is_async(self) -> bool:
        """True when calling the function returns a coroutine."""
        return inspect.iscoroutinefunction(self.func)

    def check_parameters(self, params: Any) -> list[str]:
        """Problems with a step's parameters (templates count as "known at run time")."""
        problems = _schema.check(self.params, params)
        if not problems and self.check is not None and isinstance(params, dict):
            problems = list(self.check(params))
        return problems


class ToolProvider(Protocol):
    """A lazily loaded family of tools sharing a name prefix (e.g. one MCP server)."""

    prefix: str

    def load(self) -> list[Tool]:
        """The tools (may start a process; raises ConfigError when it cannot)."""
        ...


class Registry:
    """Tools by name, plus providers whose tools are loaded on first use.

    A provider (an MCP server; the entry-point group, whose prefix is empty) is asked for
    its tools only when a name with its prefix that no tool has yet is looked up
    (``get``, ``in``, ``tools()[name]``) or when every tool is listed (iteration,
    ``names()``, ``len(tools())``).
    """

    def __init__(self, tools: Iterable[Tool] = (),
                 providers: Iterable[ToolProvider] = ()) -> None:
        self._tools: dict[str, Tool] = {t.name: t for t in tools}
        self._providers: list[ToolProvider] = list(providers)
        self._loaded: set[int] = set()
        self._lock = threading.RLock()

    def add(self, tool: Tool) -> Tool:
        """Register a tool (a later registration of the same name replaces the earlier)."""
        self._tools[tool.name] = tool
        return tool

    def add_provider(self, provider: ToolProvider) -> None:
        """Register a family of tools loaded when a name with its prefix is first used."""
        self._providers.append(provider)

    @property
    def providers(self) -> list[ToolProvider]:
        """The registered providers."""
        return list(self._providers)

    def _load(self, provider: ToolProvider) -> None:
        with self._lock:
            if id(provider) in self._loaded:
                return
            for t in provider.load():
                self._tools.setdefault(t.name, t)
            self._loaded.add(id(provider))

    def _lookup(self, name: str) -> Tool | None:
        found = self._tools.get(name)
        if found is None:
            for provider in self._providers:
                if name.startswith(provider.prefix) and id(provider) not in self._loaded:
                    self._load(provider)
            found = self._tools.get(name)
        return found

    def load_all(self) -> None:
        """Load every provider's tools now."""
        for provider in self._providers:
            self._load(provider)

    def get(self, name: str) -> Tool:
        """The tool with this name, or UnknownToolError."""
        found = self._lookup(name)
        if found is None:
            raise UnknownToolError(f"unknown tool {name!r}")
        return found

    def tools(self) -> Mapping[str, Tool]:
        """Every tool by name (what validation checks steps against), as a read-only
        mapping that loads providers only for the names looked up in it."""
        return _ToolMap(self)

    def names(self) -> set[str]:
        """Every tool name (loads every provider)."""
        self.load_all()
        return set(self._tools)

    def loaded_names(self) -> set[str]:
        """The names of the tools registered or loaded so far (starts no provider)."""
        with self._lock:
            return set(self._tools)

    def __iter__(self) -> Iterator[Tool]:
        self.load_all()
        return iter(sorted(self._tools.values(), key=lambda t: t.name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._lookup(name) is not None

    def copy(self) -> Registry:
        """A registry with the same tools that can be extended separately."""
        other = Registry(self._tools.values(), self._providers)
        other._loaded = set(self._loaded)
        return other


class _ToolMap(Mapping[str, Tool]):
    """A live, lazy view of a registry's tools."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry

    def __getitem__(self, name: str) -> Tool:
        found = self._registry._lookup(name) if isinstance(name, str) else None
        if found is None:
            raise KeyError(name)
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._registry

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._registry.names()))

    def loaded(self) -> set[str]:
        """The names looked up or registered so far, without loading any provider: what a
        misspelt name is compared with (listing every name would start every MCP server)."""
        return self._registry.loaded_names()

    def __len__(self) -> int:
        return len(self._registry.names())


#: Tools registered with the :func:`tool` decorator anywhere in the process.
DECORATED = Registry()


def tool(name: str, *, compensate: ToolFunc | None = None,
         description: str | None = None,
         params: ParamSchema | None = None,
         resource: str | Callable[[dict[str, Any]], str | list[str] | None] | None = None,
         ) -> Callable[[ToolFunc], ToolFunc]:
    """Register a Python function as a tool.

    ``params`` is an optional parameter schema (``{"type": "object", "properties": {...},
    "required": [...], "additionalProperties": False}``) checked when a composition is
    loaded. ``resource`` names the resource its calls count against by default (a name,
    or a function of the parameters; see :attr:`Tool.resource`). Example::

        from saga import tool

        @tool("greet", params={"type": "object", "required": ["name"],
                               "properties": {"name": {"type": "string"}}})
        def greet(params: dict, ctx) -> dict:
            return {"message": f"hello {params['name']}", "key": ctx.idempotency_key}
    """

    def register(func: ToolFunc) -> ToolFunc:
        doc = description if description is not None else (inspect.getdoc(func) or "")
        DECORATED.add(Tool(name, func, compensate, doc.split("\n")[0],
                           f"python:{func.__module__}", params, resource=resource))
        return func

    return register
