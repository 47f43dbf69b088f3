"""The web viewer, in a real browser, says when a step waits for a resource slot
(saga.toml ``[resources.NAME]``), as ``saga status`` does, and the run goes on once the
slot frees."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from selenium import webdriver

from saga import Saga
from saga.config import Settings, parse_resources
from tests.server.test_viewer import browser, wait
from tests.server.test_viewer_truth import start

__all__ = ["browser"]  # the fixture, used by name


def test_a_step_waiting_for_a_resource_says_so_on_its_page(
        make_server: Any, sqlite_settings: Settings, tmp_path: Path,
        browser: webdriver.Chrome) -> None:
    config = tmp_path / "limits.toml"
    config.write_text("[resources.db]\nconcurrency = 1\n", encoding="utf-8")
    server = make_server(SAGA_CONFIG=str(config))
    limited = dataclasses.replace(sqlite_settings, resources=parse_resources(
        {"db": {"concurrency": 1}}))
    with Saga(limited) as s:  # another call holds the one slot
        assert s.resources.acquire(["db"], "other:x:1", "other", "x", "elsewhere", 120,
                                   120).granted
    run = start(server, {"composition": {"name": "limited", "steps": [
        {"id": "call", "tool": "echo", "args": {"x": 1}, "resource": "db"}]}},
        lambda r: bool(r.get("waiting_for_resources")))
    browser.get(server.page(f"/runs/{run['run_id']}"))
    note = wait(browser, "#summary .resource-wait")[0]
    assert note.get_attribute("data-step") == "call"
    assert note.text.startswith("waiting: resource db (step call, since"), note.text
    with Saga(limited) as s:
        s.resources.release(["other:x:1"])
    with server.client() as c:
        assert server.wait_for(c, run["run_id"])["status"] == "completed"
