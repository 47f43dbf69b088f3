"""``saga mcp``: the engine as an MCP server, driven by the SDK's own client over stdio and
streamable HTTP, on SQLite and PostgreSQL; and saga calling saga through it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from saga.config import Settings
from tests.server.conftest import ROOT, free_port, store_env

mcp = pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

COMPOSITIONS = Path(__file__).parent / "mcp_compositions"
TOOLS = ["--tools", "tests.standins.standins"]
ENGINE = {"skill_run", "saga_status", "saga_list", "saga_history", "saga_signal",
          "saga_cancel"}


def _args(extra: tuple[str, ...] = ()) -> list[str]:
    return ["-m", "saga.cli", "mcp", "--compositions", str(COMPOSITIONS), *TOOLS, *extra]


@asynccontextmanager
async def stdio_session(env: dict[str, str], *extra: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=_args(extra), env=env,
                                   cwd=str(ROOT))
    with open(os.devnull, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            yield session


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def structured(result: Any) -> Any:
    assert not _is_error(result), result.content[0].text
    content = getattr(result, "structured_content", None)
    if content is None:
        content = result.structuredContent
    return content


def _is_error(result: Any) -> bool:
    return bool(getattr(result, "is_error", getattr(result, "isError", False)))


def _schema(tool: Any) -> dict[str, Any]:
    return dict(getattr(tool, "input_schema", None) or tool.inputSchema)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 180))


async def _runs(session: ClientSession) -> list[dict[str, Any]]:
    return list(structured(await session.call_tool("saga_list", {"limit": 500}))["result"])


def test_stdio_tools_runs_refusals_and_a_waiting_run(settings: Settings) -> None:
    """Over stdio: the tool list and every schema; a run to completion with progress; a
    failing run with its compensation; bad inputs, an unknown name and an invalid
    composition as tool errors recording nothing; a waiting run that names its approver,
    which a new process approves and resumes."""
    env = store_env(settings, SAGA_VIEWER_URL="http://saga.example:8080/")

    async def scenario() -> None:
        async with stdio_session(env) as session:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert set(tools) == ENGINE | {"order", "approval", "signalled", "slow", "broken"}
            assert "saga_approve" not in tools  # approvals are people's business
            assert tools["order"].description.startswith("Reserve, charge and ship")
            assert _schema(tools["order"]) == {
                "type": "object", "additionalProperties": False, "required": ["order_id"],
                "properties": {
                    "order_id": {"type": "string", "pattern": "^[A-Z]-\\d+$",
                                 "description": "the order, like A-1"},
                    "amount": {"type": "number", "default": 10},
                    "fail_at": {"type": "string", "default": "none",
                                "enum": ["none", "ship"]}}}
            assert _schema(tools["approval"]) == {"type": "object", "properties": {}}
            assert _schema(tools["skill_run"])["required"] == ["name"]
            assert set(_schema(tools["skill_run"])["properties"]) == {"name", "inputs",
                                                                      "run_id"}
            assert _schema(tools["saga_cancel"])["required"] == ["run_id", "reason"]
            assert _schema(tools["saga_signal"])["required"] == ["run_id", "name"]
            assert set(_schema(tools["saga_list"])["properties"]) >= {"status", "label"}
            assert "invalid" in tools["broken"].description

            progress: list[tuple[float, str | None]] = []

            async def on_progress(done: float, total: float | None, message: str | None) -> None:
                progress.append((done, message))

            done = structured(await session.call_tool(
                "order", {"order_id": "A-1"}, progress_callback=on_progress))
            assert done["status"] == "completed" and done["outputs"]["order"] == "A-1"
            assert [m for _, m in progress] == ["reserve completed", "charge completed",
                                                "ship skipped"]

            failed = structured(await session.call_tool(
                "skill_run", {"name": "order", "inputs": {"order_id": "B-2",
                                                         "fail_at": "ship"}}))
            assert failed["status"] == "compensated"
            assert failed["failed_steps"]["ship"]["message"] == "no courier available"
            assert failed["compensated_steps"] == ["charge", "reserve"]
            before = await _runs(session)

            refusals = {
                "bad input": await session.call_tool("skill_run", {
                    "name": "order", "inputs": {"order_id": "lowercase"}}),
                "unknown input": await session.call_tool("skill_run", {
                    "name": "order", "inputs": {"order_id": "A-1", "colour": "red"}}),
                "unknown name": await session.call_tool("skill_run", {"name": "no-such"}),
                "unknown tool": await session.call_tool("no_such_tool", {}),
                "invalid": await session.call_tool("broken", {}),
                "unknown run": await session.call_tool("saga_status", {"run_id": "NOPE-1"}),
            }
            texts = {k: r.content[0].text for k, r in refusals.items()}
            assert all(_is_error(r) for r in refusals.values()), texts
            assert "inputs.order_id" in texts["bad input"], texts
            assert "colour" in texts["unknown input"]
            assert "no-such" in texts["unknown name"]
            assert "no_such_tool" in texts["unknown tool"]
            assert "cycle" in texts["invalid"]
            assert "NOPE-1" in texts["unknown run"]
            assert len(await _runs(session)) == len(before)  # nothing written when refused

            waiting = structured(await session.call_tool("approval", {}))
            assert waiting["status"] == "waiting"
            run_id = waiting["run_id"]
            assert waiting["approval"][0]["step"] == "pay"
            assert waiting["approval"][0]["command"] == f"saga approve {run_id} pay"
            assert "person" in waiting["approval"][0]["who"]
            assert waiting["follow"]["cli"] == f"saga status {run_id}"
            assert waiting["approval"][0]["url"] == f"http://saga.example:8080/runs/{run_id}"
            status = structured(await session.call_tool("saga_status", {"run_id": run_id}))
            assert status["actor"].startswith("mcp:")
            history = structured(await session.call_tool("saga_history", {"run_id": run_id}))
            assert history["result"][0]["type"] == "RunStarted"
        # a new process approves and resumes what the server recorded
        assert cli(env, "approve", run_id, "pay").returncode == 0
        resumed = cli(env, "resume", run_id, "--json", *TOOLS)
        assert resumed.returncode == 0, resumed.stderr
        assert json.loads(resumed.stdout)["status"] == "completed"

    run(scenario)


def test_signal_cancel_wait_and_approve_over_stdio(sqlite_settings: Settings,
                                                   tmp_path: Path) -> None:
    """A run waiting for a signal goes on when saga_signal sends it; a run still going
    after --wait answers with its id and how to follow it, and ends; saga_cancel undoes a
    waiting run; with --allow-approve, saga_approve is offered and continues the run; a
    seed 001 template document in another --compositions folder is a tool by its id."""
    env = store_env(sqlite_settings)
    seed = json.loads((ROOT / "tests/seeds/001_templates/search_fold_store_template.json")
                      .read_text())
    seed["validation"]["min_version"] = "0.0.1"  # the seed's 1.0.0 is newer than saga 0.x
    (tmp_path / "seed001.json").write_text(json.dumps(seed))

    async def scenario() -> None:
        async with stdio_session(env, "--wait", "0.5", "--allow-approve",
                                 "--compositions", str(tmp_path)) as session:
            names = {t.name for t in (await session.list_tools()).tools}
            assert "saga_approve" in names
            folded = structured(await session.call_tool("search-fold-store-v1",
                                                        {"query": "invoices"}))
            assert folded["status"] == "completed"
            assert folded["definition"] == "search-fold-store-workflow"
            waiting = structured(await session.call_tool("signalled", {}))
            assert waiting["status"] == "waiting"
            sent = structured(await session.call_tool("saga_signal", {
                "run_id": waiting["run_id"], "name": "go", "data": {"n": 7}}))
            assert sent["status"] == "completed", sent
            assert sent["outputs"]["after"] == {"got": {"n": 7}}

            going = structured(await session.call_tool("slow", {"seconds": 3}))
            assert going["status"] == "running" and "note" in going
            assert going["follow"]["tool"] == "saga_status"
            deadline = time.monotonic() + 60
            while structured(await session.call_tool(
                    "saga_status", {"run_id": going["run_id"]}))["status"] != "completed":
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)

            approval = structured(await session.call_tool("approval", {}))
            assert "saga_approve" in approval["approval"][0]["who"]
            approved = structured(await session.call_tool("saga_approve", {
                "run_id": approval["run_id"], "step": "pay"}))
            assert approved["status"] == "completed"

            other = structured(await session.call_tool("signalled", {}))
            cancelled = structured(await session.call_tool("saga_cancel", {
                "run_id": other["run_id"], "reason": "not needed"}))
            assert cancelled["status"] == "cancelled"
            listed = structured(await session.call_tool("saga_list", {"status": "cancelled"}))
            assert [r["run_id"] for r in listed["result"]] == [other["run_id"]]

    run(scenario)


def test_streamable_http_with_tokens(sqlite_settings: Settings) -> None:
    """Over streamable HTTP: no token is 401; the write token lists and runs; the read
    token reads, and its runs are refused as tool errors."""
    from mcp.client import streamable_http

    connect: Any = getattr(streamable_http, "streamable_http_client", None) or \
        streamable_http.streamablehttp_client  # 1.x's name
    port = free_port()
    env = store_env(sqlite_settings, SAGA_API_TOKEN="w-secret", SAGA_API_READ_TOKEN="r-secret")
    proc = subprocess.Popen([sys.executable, *_args(("--http", f"127.0.0.1:{port}"))],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read()  # type: ignore[union-attr]
            try:
                answer = httpx.post(url, json={}, timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "saga mcp --http did not answer"
                time.sleep(0.1)
        assert answer.status_code == 401

        async def session_with(token: str, scenario: Callable[[ClientSession],
                                                              Awaitable[None]]) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            try:
                transport = connect(url, headers=headers)
            except TypeError:  # 2.x: headers go on the client it is given
                import httpx2  # type: ignore[import-not-found]

                transport = connect(url, http_client=httpx2.AsyncClient(headers=headers))
            async with transport as streams, ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                await scenario(session)

        async def writer(session: ClientSession) -> None:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert _schema(tools["order"])["required"] == ["order_id"]
            done = structured(await session.call_tool("order", {"order_id": "C-3"}))
            assert done["status"] == "completed"
            bad = await session.call_tool("order", {"order_id": 3})
            assert _is_error(bad) and "order_id" in bad.content[0].text

        async def reader(session: ClientSession) -> None:
            listed = structured(await session.call_tool("saga_list", {}))
            assert [r["definition"] for r in listed["result"]] == ["order"]
            refused = await session.call_tool("order", {"order_id": "D-4"})
            assert _is_error(refused) and "only read" in refused.content[0].text
            assert len(structured(await session.call_tool("saga_list", {}))["result"]) == 1

        run(lambda: session_with("w-secret", writer))
        run(lambda: session_with("r-secret", reader))
    finally:
        proc.terminate()
        proc.wait(10)


def test_saga_calls_saga_through_mcp(settings: Settings, tmp_path: Path) -> None:
    """The loop: a composition whose step is ``mcp.self.skill_run`` on a ``saga mcp``
    server declared in saga.toml runs a composition of that server, on the same store."""
    store = {k: v for k, v in store_env(settings).items() if k.startswith("SAGA_")}
    (tmp_path / "saga.toml").write_text(
        "[mcp.servers.self]\n"
        f"command = {json.dumps(sys.executable)}\n"
        f"args = {json.dumps(_args())}\n"
        f"cwd = {json.dumps(str(ROOT))}\n"
        f"env = {{ {', '.join(f'{k} = {json.dumps(v)}' for k, v in store.items())} }}\n",
        encoding="utf-8")
    outer = tmp_path / "outer.yaml"
    outer.write_text(
        "name: outer\n"
        "steps:\n"
        "  - id: inner\n"
        "    tool: mcp.self.skill_run\n"
        "    args: {name: order, inputs: {order_id: E-5}, run_id: INNER-1}\n"
        "outputs:\n"
        "  inner_status: \"{{ steps.inner.status }}\"\n"
        "  inner_order: \"{{ steps.inner.outputs.order }}\"\n", encoding="utf-8")
    env = store_env(settings, SAGA_CONFIG=str(tmp_path / "saga.toml"))
    ran = subprocess.run([sys.executable, "-m", "saga.cli", "run", str(outer), "--json"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["outputs"] == {"inner_status": "completed", "inner_order": "E-5"}
    inner = cli(env, "status", "INNER-1", "--json")
    assert inner.returncode == 0, inner.stderr
    assert json.loads(inner.stdout)["actor"].startswith("mcp:")


def test_a_store_outage_is_a_tool_error_not_a_crash(tmp_path: Path) -> None:
    """A database nobody answers: each call is one clear tool error, and the server goes
    on answering (the tool list needs no store)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/nothing",
            "SAGA_HOME": str(tmp_path / ".saga")}

    async def scenario() -> None:
        async with stdio_session(env) as session:
            for _ in range(2):
                refused = await session.call_tool("order", {"order_id": "A-1"})
                assert _is_error(refused)
                text = refused.content[0].text
                assert "127.0.0.1" in text and len(text.splitlines()) == 1, text
                listed = await session.call_tool("saga_list", {})
                assert _is_error(listed)
            assert "order" in {t.name for t in (await session.list_tools()).tools}

    run(scenario)
