"""Each kind of tool failure is a clear error recorded in the run's history, and what was
done before it (and had a compensation) is undone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from saga.config import Settings
from saga.errors import ConfigError
from tests.tools.test_common import chain, engine
from tests.tools.test_http import Server, server  # noqa: F401 - the fixture


def written(tmp_path: Path) -> dict[str, Any]:
    """A first step that writes a file and restores it on rollback."""
    return {"id": "note", "tool": "file", "compensate": True,
            "args": {"action": "write", "path": str(tmp_path / "note.txt"), "content": "x"}}


def failure(s: Any, plan: dict[str, Any]) -> dict[str, Any]:
    run = s.run(s.load(plan))
    assert run.status == "compensated"
    failed = [e for e in s.history(run.run_id) if e["type"] == "StepFailed"][-1]
    assert [e["type"] for e in s.history(run.run_id)][-1] == "RunCompensated"
    return failed["payload"]


@pytest.mark.parametrize("case", ["shell", "http", "sql", "parameters"])
def test_tool_errors_are_recorded_and_undone(case: str, sqlite_settings: Settings,
                                             tmp_path: Path, server: Server) -> None:  # noqa: F811
    steps = {
        "shell": {"id": "cmd", "tool": "shell", "args": {"argv": ["rm", "-rf", "/nothing"]}},
        "http": {"id": "get", "tool": "http", "args": {"url": f"{server.url}/missing"}},
        "sql": {"id": "q", "tool": "sql", "args": {"connection": "db",
                                                  "statement": "SELECT * FROM no_such_table"}},
        "parameters": {"id": "w", "tool": "file",
                       "args": {"action": "{{ 'explode' }}", "path": str(tmp_path / "y")}},
    }
    expected = {"shell": "NotAllowed", "http": "HTTPStatus", "sql": "SQLError",
                "parameters": "InvalidParameters"}
    with engine(sqlite_settings, shell={"allow": ["echo"]}, file={"root": str(tmp_path)},
                sql={"connections": {"db": f"sqlite:///{tmp_path}/db.db"}}) as s:
        error = failure(s, chain(written(tmp_path), steps[case]))
    assert error["error_type"] == expected[case]
    assert error["message"]  # a readable message, e.g. the status, the driver's text
    assert not (tmp_path / "note.txt").exists()  # the earlier write was undone
    if case == "shell":
        assert "rm" in error["message"]


def test_an_mcp_server_that_will_not_start_is_named(sqlite_settings: Settings) -> None:
    broken = {"servers": {"broken": {"command": "/no/such/mcp-server"}}}
    with engine(sqlite_settings, mcp=broken) as s, pytest.raises(ConfigError, match="broken"):
        s.load(chain({"id": "m", "tool": "mcp.broken.anything"}))
