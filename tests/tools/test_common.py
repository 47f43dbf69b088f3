"""The tool contract: parameter schemas, checks at load time, the lazy registry.

Also the helpers the other ``test_tools_*`` files share: calling a tool or its own
compensation directly, and building a Saga whose registry is configured from saga.toml
data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings
from saga.errors import DefinitionError, Problem, UnknownToolError
from saga.tools import DECORATED, Registry, Tool, ToolContext, load_registry, tool
from saga.tools.schema import check

# -- helpers shared by the test_tools_* files ----------------------------------------------


def ctx(step: str = "s", key: str | None = None) -> ToolContext:
    """A context as the executor would build it."""
    return ToolContext(run_id="r1", step_id=step, iteration=0, attempt=1,
                       idempotency_key=key or f"r1:{step}:0")


def _await(value: Any) -> Any:
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value
        return asyncio.run(wait())
    return value


def call(t: Tool, params: dict[str, Any], context: ToolContext | None = None) -> Any:
    """Call a tool as the executor does (sync or async)."""
    return _await(t.func(params, context or ctx()))


def undo(t: Tool, params: dict[str, Any], output: Any,
         context: ToolContext | None = None) -> Any:
    """Call a tool's own compensation as ``compensate: true`` does."""
    assert t.compensate is not None
    return _await(t.compensate(params, output, context or ctx(key="r1:s:0:compensate")))


def configured(settings: Settings, **file: Any) -> Settings:
    """Settings with this saga.toml data."""
    return dataclasses.replace(settings, file=file)


def engine(settings: Settings, **file: Any) -> Saga:
    """A Saga whose registry is built from this saga.toml data."""
    settings = configured(settings, **file)
    return Saga(settings, registry=load_registry((), settings=settings))


def chain(*steps: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A composition of these steps in list order."""
    return {"name": "t", "steps": list(steps), **extra}


FAIL = {"id": "boom", "tool": "fail", "args": {"message": "later step fails",
                                              "retryable": False}}


# -- schemas -------------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {
        "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "n": {"type": "integer", "minimum": 0},
        "opts": {"type": "object", "properties": {"x": {"type": "boolean"}},
                 "required": ["x"], "additionalProperties": False},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "ref": {"$ref": "#/$defs/Point"},
    },
    "required": ["argv"],
    "additionalProperties": False,
    "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}},
                        "required": ["x"]}},
}


def test_schema_accepts_fitting_values_and_templates() -> None:
    assert check(SCHEMA, {"argv": ["echo", "hi"], "mode": "a", "n": 3, "opts": {"x": True},
                          "maybe": None, "ref": {"x": 1.5}}) == []
    assert check(SCHEMA, {"argv": "{{ inputs.argv }}", "n": "{{ inputs.n }}",
                          "opts": {"x": "{{ inputs.flag }}"}}) == []
    assert check(SCHEMA, {"argv": ["echo", "{{ inputs.word }}"]}) == []
    assert check(None, {"anything": 1}) == []


def test_schema_reports_each_problem_with_its_path() -> None:
    problems = check(SCHEMA, {"argv": ["echo", 3], "mode": "c", "n": -1, "opts": {"y": 1},
                              "maybe": "x", "ref": {}, "extra": True})
    assert problems == [
        "argv[1]: expected string, got integer",
        "mode: 'c' is not one of 'a', 'b'",
        "n: must be at least 0",
        "opts: missing required key 'x'",
        "opts: unknown key 'y' (expected: x)",
        "maybe: 'x' matches none of the allowed forms",
        "ref: missing required key 'x'",
        "unknown parameter 'extra' (expected: argv, maybe, mode, n, opts, ref)",
    ]
    assert check(SCHEMA, {}) == ["missing required parameter 'argv'"]
    assert check(SCHEMA, {"argv": "echo hi"}) == ["argv: expected array, got string"]
    assert check(SCHEMA, {"argv": []}) == ["argv: needs at least 1 items"]
    assert check({"type": "integer"}, True) == ["expected integer, got boolean"]


def test_tool_check_parameters_runs_the_schema_then_the_extra_check() -> None:
    t = Tool("t", lambda p, c: None, params=SCHEMA,
             check=lambda p: ["argv and mode together"] if "mode" in p else [])
    assert t.check_parameters({"argv": ["x"]}) == []
    assert t.check_parameters({"argv": ["x"], "mode": "a"}) == ["argv and mode together"]
    assert t.check_parameters({}) == ["missing required parameter 'argv'"]
    assert Tool("free", lambda p, c: None).check_parameters({"x": 1}) == []


def test_decorator_accepts_a_schema() -> None:
    @tool("test_tools_greet", params={"type": "object", "required": ["name"],
                                      "properties": {"name": {"type": "string"}}})
    def greet(params: dict[str, Any], ctx: ToolContext) -> str:
        """Greets."""
        return f"hello {params['name']}"

    registered = DECORATED.get("test_tools_greet")
    assert registered.params == {"type": "object", "required": ["name"],
                                 "properties": {"name": {"type": "string"}}}
    assert registered.check_parameters({"name": 1}) == ["name: expected string, got integer"]
    assert load_registry().get("test_tools_greet").description == "Greets."


# -- the registry --------------------------------------------------------------------------


def test_every_builtin_is_registered_with_a_schema_and_a_compensation() -> None:
    registry = load_registry()
    for name in ("shell", "http", "sql", "file", "git"):
        t = registry.get(name)
        assert t.source == "builtin"
        assert t.params is not None and t.params["type"] == "object"
        assert t.compensate is not None
    assert {"noop", "echo", "sleep", "fail"} <= registry.names()


class Provider:
    """A provider that counts how often it is loaded."""

    prefix = "mcp.fake."

    def __init__(self) -> None:
        self.loads = 0

    def load(self) -> list[Tool]:
        self.loads += 1
        return [Tool("mcp.fake.one", lambda p, c: 1, source="mcp:fake")]


def test_providers_load_only_when_their_names_are_needed() -> None:
    provider = Provider()
    registry = Registry([Tool("plain", lambda p, c: None)], [provider])
    assert "plain" in registry and "mcp.other.x" not in registry
    assert provider.loads == 0
    tools = registry.tools()
    assert "plain" in tools and tools["plain"].name == "plain"
    assert provider.loads == 0
    assert "mcp.fake.one" in tools and "mcp.fake.two" not in tools
    assert registry.get("mcp.fake.one").source == "mcp:fake"
    assert provider.loads == 1
    with pytest.raises(UnknownToolError, match=r"mcp\.fake\.two"):
        registry.get("mcp.fake.two")
    assert provider.loads == 1
    assert sorted(tools) == ["mcp.fake.one", "plain"] and len(tools) == 2
    copy = registry.copy()
    copy.add(Tool("extra", lambda p, c: None))
    assert "extra" in copy and "extra" not in registry
    assert [t.name for t in copy] == ["extra", "mcp.fake.one", "plain"]
    assert provider.loads == 1


# -- parameters are checked when a composition is loaded ----------------------------------


def test_wrong_parameters_are_rejected_at_load_naming_the_path(tmp_path: Path) -> None:
    s = Saga(Settings(home=tmp_path / ".saga"), registry=load_registry())
    with pytest.raises(DefinitionError) as missing:
        s.load(chain({"id": "a", "tool": "shell", "args": {"cwd": "/tmp"}}))
    assert missing.value.problems == [
        Problem("steps[0].parameters", "missing required parameter 'argv'")]
    with pytest.raises(DefinitionError) as unknown:
        s.load(chain({"id": "a", "tool": "file", "args": {"action": "write", "path": "x",
                                                          "content": "y", "mode": 1}}))
    assert unknown.value.problems == [Problem(
        "steps[0].parameters",
        "unknown parameter 'mode' (expected: action, content, encoding, make_parents, path, "
        "source)")]
    with pytest.raises(DefinitionError) as several:
        s.load(chain({"id": "a", "tool": "git", "args": {"repo": ".", "action": "merge"}},
                     {"id": "b", "tool": "http", "args": {"url": "http://x", "json": {},
                                                          "body": "b"}},
                     {"id": "c", "tool": "sql", "args": {"connection": "nowhere",
                                                         "statement": "SELECT 1"}}))
    assert [str(p) for p in several.value.problems] == [
        "steps[0].parameters: action: 'merge' is not one of 'status', 'create_branch', "
        "'delete_branch', 'commit'",
        "steps[1].parameters: give either json or body, not both",
        "steps[2].parameters: unknown SQL connection 'nowhere' (declared in "
        "[sql.connections]: none)",
    ]
    with pytest.raises(DefinitionError) as compensation:
        s.load(chain({"id": "a", "tool": "echo",
                      "compensate": {"tool": "shell", "args": {"argv": "rm -rf /"}}}))
    assert compensation.value.problems == [
        Problem("steps[0].compensate.parameters", "argv: expected array, got string")]
    plan = s.load(chain({"id": "a", "tool": "shell",
                         "args": {"argv": ["echo", "{{ inputs.word }}"],
                                  "timeout": "{{ inputs.seconds }}"}},
                        inputs=[{"name": "word"}, {"name": "seconds", "type": "number"}]))
    assert plan.order == ("a",)
    s.close()


def test_a_compensation_of_the_wrong_shape_is_refused_when_the_tool_is_made() -> None:
    from saga.errors import ConfigError
    from saga.tools import Tool

    def undo_two(params: Any, ctx: Any) -> None:
        return None

    def undo_three(params: Any, output: Any, ctx: Any) -> None:
        return None

    with pytest.raises(ConfigError, match=r"undo_two must take \(params, output, ctx\)"):
        Tool("made", lambda params, ctx: None, compensate=undo_two)
    assert Tool("made", lambda params, ctx: None, compensate=undo_three).compensate is undo_three
