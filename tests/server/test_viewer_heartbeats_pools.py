"""The web viewer, in a real browser, shows what a long call last reported (its heartbeat
details, re-read every 5 s while a step runs: beats are not events) and that a run waits
for a worker of a pool nobody serves (issue 42).

One ``saga serve --no-worker`` reads; one real ``saga worker`` process (no pools) drives
both runs and writes the heartbeats side table the server reads.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.server.conftest import ROOT, Server, store_env
from tests.server.test_viewer import browser
from tests.server.test_viewer_truth import start, until

__all__ = ["browser"]  # the fixture, used by name

#: A tool that beats {"done": 3}, waits for the file "more", beats {"done": 4}, then
#: waits for "release" (files in the folder its parameters name).
GATED = '''
import time
from pathlib import Path
from saga import tool

def _until(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)

@tool("gated_beats")
def gated_beats(params: dict, ctx) -> dict:
    gate = Path(params["gate"])
    ctx.heartbeat({"done": 3})
    _until(gate / "more")
    ctx.heartbeat({"done": 4})
    _until(gate / "release")
    return {"done": 4}
'''


@pytest.fixture
def gated(tmp_path: Path) -> Path:
    """The folder of the tool's module and of its gate files."""
    (tmp_path / "gated_tools.py").write_text(GATED, encoding="utf-8")
    return tmp_path


@pytest.fixture
def worker(sqlite_settings: Any, gated: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``saga worker`` process (of no pool) with the gated tool."""
    env = store_env(sqlite_settings, SAGA_TOOLS="gated_tools,tests.standins.standins",
                    PYTHONPATH=os.pathsep.join([str(gated), str(ROOT)]))
    proc = subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--poll", "0.05"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    yield proc
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def beat_text(driver: webdriver.Chrome, step: str) -> str:
    """The heartbeat line of a step's row, whitespace flattened ("" when none shows)."""
    found = driver.find_elements(By.CSS_SELECTOR, f'#steps tr[data-step="{step}"] .heartbeat')
    return " ".join(found[0].text.split()) if found else ""


def test_heartbeat_details_update_live_and_a_pool_wait_shows(
        make_server: Any, gated: Path, worker: subprocess.Popen[bytes],
        browser: webdriver.Chrome) -> None:
    server: Server = make_server("--no-worker", "--tools", "gated_tools",
                                 PYTHONPATH=os.pathsep.join([str(gated), str(ROOT)]))
    # (1) a long call: its details show, and change on the page when it beats again
    run = start(server, {"composition": {"name": "long", "steps": [
        {"id": "migrate", "tool": "gated_beats", "args": {"gate": str(gated)}}]}},
        lambda r: bool((r["steps"].get("migrate") or {}).get("heartbeat")))
    assert run["steps"]["migrate"]["heartbeat"]["details"] == {"done": 3}, run
    browser.get(server.page(f"/runs/{run['run_id']}"))
    first = until(browser, lambda d: beat_text(d, "migrate"), 10)
    assert re.fullmatch(r'heartbeat (just now|\d+s ago): \{ "done": 3 \}', first), first
    (gated / "more").touch()
    # no reload: the page re-reads a running step every 5 s (no event comes of a beat;
    # without that re-read this waits in vain, as checked by disabling it)
    later = until(browser, lambda d: '"done": 4' in beat_text(d, "migrate") and
                  beat_text(d, "migrate"), 10)
    assert re.fullmatch(r'heartbeat (just now|\d+s ago): \{ "done": 4 \}', later), later
    (gated / "release").touch()
    until(browser, lambda d: d.find_elements(
        By.CSS_SELECTOR, '#steps tr[data-step="migrate"][data-status="completed"]'), 10)
    assert beat_text(browser, "migrate") == ""  # a finished step shows its output instead
    # (2) a step of pool c, which no worker serves: its run waits, and its page says so
    waiting = start(server, {"composition": {"name": "vpn", "steps": [
        {"id": "tunnel", "tool": "echo", "args": {"x": 1}, "pool": "c"}]}},
        lambda r: bool(r.get("waiting_for_pools")))
    assert waiting["status"] not in ("completed", "failed"), waiting
    browser.get(server.page(f"/runs/{waiting['run_id']}"))
    note = until(browser, lambda d: d.find_elements(By.CSS_SELECTOR,
                                                    '#summary .pool-wait'), 10)[0]
    assert note.get_attribute("data-pool") == "c"
    assert note.text == "waiting: pool c (step tunnel)", note.text
    assert worker.poll() is None
