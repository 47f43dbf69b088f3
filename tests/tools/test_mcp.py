"""MCP tools: the test server (tests/standins/mcp_server.py) started over stdio from
saga.toml-like settings, listed with its schemas, called, and reused across runs."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.config import Settings, load_settings
from saga.errors import ConfigError, DefinitionError, Problem, ToolError
from saga.tools import Registry, load_registry
from saga.tools.mcp import MANAGER, ServerConfig, server_configs
from tests.tools.test_common import FAIL, call, chain, configured

SERVER = str(Path(__file__).parents[1] / "standins" / "mcp_server.py")
MCP = {"mcp": {"servers": {
    "t": {"command": sys.executable, "args": [SERVER]},
    "missing": {"command": "no-such-mcp-server-4711"},
    "crash": {"command": sys.executable,
              "args": ["-c", "import sys; sys.stderr.write('cannot start: no token'); "
                             "sys.exit(3)"]},
}}}


@pytest.fixture(scope="module", autouse=True)
def _stop_servers() -> Iterator[None]:
    yield
    MANAGER.close()


@pytest.fixture
def registry() -> Registry:
    return load_registry((), settings=Settings(file=MCP))


def run_tool(registry: Registry, name: str, params: dict[str, Any]) -> Any:
    return call(registry.get(name), params)


def test_server_tools_are_listed_with_their_schemas(registry: Registry) -> None:
    only_t = {"mcp": {"servers": {"t": MCP["mcp"]["servers"]["t"]}}}
    names = load_registry((), settings=Settings(file=only_t)).names()
    assert {"mcp.t.add", "mcp.t.echo", "mcp.t.fail", "mcp.t.kv_put", "mcp.t.kv_get",
            "mcp.t.pid"} <= names
    add = registry.get("mcp.t.add")
    assert add.source == "mcp:t" and add.description == "Adds two integers."
    assert add.params is not None
    assert add.params["required"] == ["a", "b"]
    assert add.params["properties"]["a"]["type"] == "integer"
    assert add.compensate is None
    assert add.check_parameters({"a": 1}) == ["missing required parameter 'b'"]
    assert add.check_parameters({"a": "one", "b": "{{ inputs.b }}"}) == [
        "a: expected integer, got string"]


def test_calls_return_structured_content_or_errors(registry: Registry) -> None:
    assert run_tool(registry, "mcp.t.add", {"a": 2, "b": 3}) == {"result": 5}
    assert run_tool(registry, "mcp.t.echo", {"text": "héllo"}) == {"result": "héllo"}
    assert run_tool(registry, "mcp.t.kv_put", {"key": "k", "value": "v"}) == {
        "key": "k", "value": "v"}
    with pytest.raises(ToolError) as failed:
        run_tool(registry, "mcp.t.fail", {"message": "no such ticket"})
    assert failed.value.error_type == "MCPError"
    assert "no such ticket" in str(failed.value) and "mcp.t.fail" in str(failed.value)
    with pytest.raises(ToolError) as invalid:
        run_tool(registry, "mcp.t.add", {"a": "x", "b": 1})
    assert invalid.value.error_type == "MCPError"


def test_one_server_process_serves_successive_runs(registry: Registry) -> None:
    first = run_tool(registry, "mcp.t.pid", {})["result"]
    run_tool(registry, "mcp.t.kv_put", {"key": "reuse", "value": "same process"})
    # every call above was its own asyncio.run, as every executor drive is
    assert run_tool(registry, "mcp.t.kv_get", {"key": "reuse"}) == {"result": "same process"}
    other_registry = load_registry((), settings=Settings(file=MCP))
    assert run_tool(other_registry, "mcp.t.pid", {})["result"] == first
    assert "t" in MANAGER.running()


def test_a_server_that_cannot_start_is_named(registry: Registry) -> None:
    with pytest.raises(ConfigError) as missing:
        registry.get("mcp.missing.anything")
    assert str(missing.value).startswith(
        "MCP server 'missing' (no-such-mcp-server-4711) could not start: FileNotFoundError")
    with pytest.raises(ConfigError) as crashed:
        _ = "mcp.crash.x" in registry
    assert "MCP server 'crash'" in str(crashed.value)
    assert "its stderr: cannot start: no token" in str(crashed.value)
    config = server_configs(MCP)[1]
    assert isinstance(config, ServerConfig) and config.name == "missing"
    with pytest.raises(ToolError) as at_call:
        MANAGER.call(config, "anything", {})
    assert at_call.value.error_type == "MCPServerError" and at_call.value.retryable is True
    assert "MCP server 'missing'" in str(at_call.value)


def test_servers_start_only_for_the_names_used(tmp_path: Path) -> None:
    broken = {"mcp": {"servers": {"missing": MCP["mcp"]["servers"]["missing"]}}}
    s = Saga(Settings(home=tmp_path / ".saga", file=broken),
             registry=load_registry((), settings=Settings(file=broken)))
    assert s.load(chain({"id": "a", "tool": "echo"})).order == ("a",)
    with pytest.raises(DefinitionError) as unknown:
        s.load(chain({"id": "a", "tool": "mcp.undeclared.x"}))
    assert unknown.value.problems == [Problem("steps[0].tool",
                                              "unknown tool 'mcp.undeclared.x'")]
    with pytest.raises(ConfigError, match="MCP server 'missing'"):
        s.load(chain({"id": "a", "tool": "mcp.missing.x"}))
    s.close()
    # A misspelt tool of a server that starts is offered its server's tools, and the
    # suggestions start no other server.
    both = {"mcp": {"servers": {k: MCP["mcp"]["servers"][k] for k in ("t", "missing")}}}
    s = Saga(Settings(home=tmp_path / ".saga", file=both),
             registry=load_registry((), settings=Settings(file=both)))
    with pytest.raises(DefinitionError) as misspelt:
        s.load(chain({"id": "a", "tool": "mcp.t.ad"}))
    [problem] = misspelt.value.problems
    assert problem.message.startswith("unknown tool 'mcp.t.ad'; did you mean 'mcp.t.add'")
    s.close()


def test_bad_server_declarations_are_config_errors() -> None:
    bad = [({"x": {"args": []}}, "`command`"),
           ({"x": {"command": "c", "argz": []}}, "unknown key(s) argz"),
           ({"x": {"command": "c", "args": "a b"}}, "`args` must be a list"),
           ({"a.b": {"command": "c"}}, "cannot contain '.'"),
           ({"x": {"command": "c", "timeout": "soon"}}, "timeouts must be numbers")]
    for servers, message in bad:
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_registry((), settings=Settings(file={"mcp": {"servers": servers}}))


def test_saga_toml_declares_servers(tmp_path: Path) -> None:
    (tmp_path / "saga.toml").write_text(
        f'[mcp.servers.t]\ncommand = "{sys.executable}"\nargs = ["{SERVER}"]\n'
        f'env = {{ SAGA_TEST = "1" }}\n')
    settings = load_settings(env={}, cwd=tmp_path)
    (config,) = server_configs(settings.file)
    assert config == ServerConfig("t", sys.executable, (SERVER,), (("SAGA_TEST", "1"),))
    registry = load_registry((), settings=settings)
    assert run_tool(registry, "mcp.t.add", {"a": 1, "b": 1}) == {"result": 2}
    assert run_tool(registry, "mcp.t.getenv", {"name": "SAGA_TEST"}) == {"result": "1"}


def test_a_server_that_dies_fails_the_call_and_is_started_again(registry: Registry) -> None:
    before = run_tool(registry, "mcp.t.pid", {})["result"]
    with pytest.raises(ToolError) as died:
        run_tool(registry, "mcp.t.die", {})
    assert died.value.error_type == "MCPServerError" and died.value.retryable is True
    assert "MCP server 't'" in str(died.value)
    after = run_tool(registry, "mcp.t.pid", {})["result"]
    assert after != before


def test_a_step_timeout_cancels_the_call(registry: Registry) -> None:
    tool = registry.get("mcp.t.slow")

    async def go() -> Any:
        return await asyncio.wait_for(tool.func({"seconds": 3}, None), 0.3)

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(go())
    assert time.monotonic() - started < 2
    assert run_tool(registry, "mcp.t.echo", {"text": "still here"}) == {"result": "still here"}


def test_engine_validates_calls_and_compensates_through_the_server(
        sqlite_settings: Settings) -> None:
    settings = configured(sqlite_settings, **MCP)
    with Saga(settings, registry=load_registry((), settings=settings)) as s:
        with pytest.raises(DefinitionError) as wrong:
            s.load(chain({"id": "a", "tool": "mcp.t.add", "args": {"a": 1, "c": 2}}))
        assert wrong.value.problems == [
            Problem("steps[0].parameters", "missing required parameter 'b'")]
        put = {"id": "put", "tool": "mcp.t.kv_put",
               "args": {"key": "{{ inputs.key }}", "value": "draft"},
               "compensate": {"tool": "mcp.t.kv_delete", "args": {"key": "{{ output.key }}"}}}
        get = {"id": "get", "tool": "mcp.t.kv_get", "args": {"key": "{{ inputs.key }}"}}
        inputs = [{"name": "key"}]
        first = s.run(s.load(chain(put, get, inputs=inputs)), {"key": "kept"})
        assert first.status == "completed"
        assert first.steps["get"]["output"] == {"result": "draft"}
        second = s.run(s.load(chain(get, inputs=inputs)), {"key": "kept"})
        assert second.steps["get"]["output"] == {"result": "draft"}  # same server process
        third = s.run(s.load(chain(put, get, FAIL, inputs=inputs)), {"key": "undone"})
        assert third.status == "compensated"
        assert third.steps["put"]["status"] == "compensated"
        assert third.steps["get"]["output"] == {"result": "draft"}
    assert run_tool(load_registry((), settings=settings), "mcp.t.kv_get",
                    {"key": "undone"}) == {"result": None}


def test_a_server_read_timeout_fails_the_call_as_a_timeout() -> None:
    slow = {"mcp": {"servers": {"slowpoke": {"command": sys.executable, "args": [SERVER],
                                             "timeout": 0.5}}}}
    registry = load_registry((), settings=Settings(file=slow))
    with pytest.raises(ToolError) as late:
        run_tool(registry, "mcp.slowpoke.slow", {"seconds": 3})
    assert late.value.error_type == "timeout" and late.value.retryable is True
    assert "MCP server 'slowpoke'" in str(late.value)
