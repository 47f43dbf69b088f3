"""MCP servers built with the other major version of the ``mcp`` SDK than the one this
suite runs with (1.x and 2.x speak the same protocol, and saga's client supports both).

The test server (tests/standins/mcp_server.py) runs under a virtualenv of its own with the
other major installed from the package index. The virtualenv is made once and kept in a
cache folder (``SAGA_TEST_CACHE``, default ``~/.cache/saga-tests``), so later runs need
no network; without it (and not in CI) the test is skipped with the reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from saga import Saga
from saga.config import Settings
from saga.errors import ToolError
from saga.tools import load_registry
from saga.tools.mcp import MANAGER
from tests.tools.test_common import FAIL, chain, configured
from tests.tools.test_mcp import SERVER, run_tool

MAJOR = int(version("mcp").split(".")[0])
OTHER = 1 if MAJOR >= 2 else 2
SPEC = {1: "mcp>=1.2,<2", 2: "mcp>=2,<3"}[OTHER]


def _cache() -> Path:
    root = os.environ.get("SAGA_TEST_CACHE") or Path.home() / ".cache" / "saga-tests"
    return Path(root) / f"mcp{OTHER}-py{sys.version_info.major}{sys.version_info.minor}"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"a virtualenv with {SPEC} is required in CI: {reason}")
    pytest.skip(f"no virtualenv with {SPEC} (made once, then cached): {reason}")


@pytest.fixture(scope="session")
def other_python() -> Path:
    """The interpreter of a cached virtualenv that has the other major of mcp."""
    venv = _cache()
    python = venv / "bin" / "python"
    if (venv / "ready").exists() and python.exists():
        return python
    building = venv.with_name(f"{venv.name}.{uuid.uuid4().hex[:8]}")  # then renamed: atomic
    try:
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True,
                       capture_output=True, timeout=60)
        done = subprocess.run([str(building / "bin" / "python"), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", SPEC],
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            _unavailable(f"pip install {SPEC} failed: {done.stderr.strip()[-300:]}")
        (building / "ready").write_text(SPEC + "\n")
        if not (venv / "ready").exists():
            shutil.rmtree(venv, ignore_errors=True)
            building.rename(venv)
    except (OSError, subprocess.SubprocessError) as e:
        _unavailable(f"{type(e).__name__}: {e}")
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return python


@pytest.fixture
def servers(other_python: Path) -> Iterator[dict[str, object]]:
    yield {"mcp": {"servers": {
        "other": {"command": str(other_python), "args": [SERVER]},
        "same": {"command": sys.executable, "args": [SERVER]},
    }}}
    MANAGER.close()


def test_servers_of_both_majors_are_listed_and_called(servers: dict[str, object]) -> None:
    registry = load_registry((), settings=Settings(file=servers))
    assert run_tool(registry, "mcp.other.sdk", {}) == {"result": OTHER}
    assert run_tool(registry, "mcp.same.sdk", {}) == {"result": MAJOR}
    for name in ("other", "same"):
        add = registry.get(f"mcp.{name}.add")
        assert add.description == "Adds two integers."
        assert add.params is not None and add.params["required"] == ["a", "b"]
        assert run_tool(registry, f"mcp.{name}.add", {"a": 2, "b": 3}) == {"result": 5}
        assert run_tool(registry, f"mcp.{name}.kv_put", {"key": "k", "value": "v"}) == {
            "key": "k", "value": "v"}
        assert run_tool(registry, f"mcp.{name}.kv_get", {"key": "k"}) == {"result": "v"}
        with pytest.raises(ToolError) as failed:
            run_tool(registry, f"mcp.{name}.fail", {"message": "no such ticket"})
        assert failed.value.error_type == "MCPError" and "no such ticket" in str(failed.value)
        with pytest.raises(ToolError) as died:
            run_tool(registry, f"mcp.{name}.die", {})
        assert died.value.error_type == "MCPServerError"


def test_a_run_compensates_through_a_server_of_the_other_major(
        servers: dict[str, object], sqlite_settings: Settings) -> None:
    settings = configured(sqlite_settings, **servers)
    put = {"id": "put", "tool": "mcp.other.kv_put", "args": {"key": "x", "value": "draft"},
           "compensate": {"tool": "mcp.other.kv_delete", "args": {"key": "{{ output.key }}"}}}
    with Saga(settings, registry=load_registry((), settings=settings)) as s:
        run = s.run(s.load(chain(put, FAIL)), {})
    assert run.status == "compensated" and run.steps["put"]["status"] == "compensated"
    registry = load_registry((), settings=settings)
    assert run_tool(registry, "mcp.other.kv_get", {"key": "x"}) == {"result": None}
