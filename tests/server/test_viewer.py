"""The web viewer in a real browser: Debian's chromium, driven by selenium through
chromedriver, against a real ``saga serve``.

ops/test.sh installs chromium and chromium-driver (ops/ensure-browser.sh). Where neither
can be had, these tests are skipped with the reason, except under CI, where they must run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.server.conftest import Server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
SCREENSHOTS = os.environ.get("SAGA_SCREENSHOTS")  # a folder: keep the pages as PNGs


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are required in CI (ops/ensure-browser.sh)")
        pytest.skip("no chromium/chromedriver here: run ops/ensure-browser.sh")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="saga-chromium-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={profile}", "--window-size=1300,1400"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=DriverService(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: webdriver.Chrome, css: str, seconds: float = 20) -> Any:
    return WebDriverWait(driver, seconds).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, css) or False)


def shot(driver: webdriver.Chrome, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SCREENSHOTS) / name))


def test_the_list_and_a_run_in_a_browser(sqlite_server: Server,
                                         browser: webdriver.Chrome) -> None:
    with sqlite_server.client() as c:
        done = c.post("/api/v1/runs", json={"template": "quickstart",
                                            "inputs": {"fail_at": "ship"}}).json()["run_id"]
        sqlite_server.wait_for(c, done)
    browser.get(sqlite_server.page("/"))
    row = wait(browser, f'tr[data-run="{done}"]')[0]
    assert row.get_attribute("data-status") == "compensated"
    assert "quickstart" in row.text
    # live: a run started after the page loaded appears without a reload
    with sqlite_server.client() as c:
        later = c.post("/api/v1/runs", json={"template": "quickstart"}).json()["run_id"]
    wait(browser, f'tr[data-run="{later}"][data-status="completed"]')
    shot(browser, "runs.png")

    browser.get(sqlite_server.page(f"/runs/{done}"))
    wait(browser, '#graph g.node[data-step="ship"]')
    nodes = {n.get_attribute("data-step"): n.get_attribute("data-status")
             for n in browser.find_elements(By.CSS_SELECTOR, "#graph g.node")}
    assert nodes == {"reserve": "compensated", "charge": "compensated",
                     "charge_declined": "skipped", "ship": "failed", "confirm": "pending"}
    steps = {r.get_attribute("data-step"): r.get_attribute("data-status")
             for r in browser.find_elements(By.CSS_SELECTOR, "#steps tbody tr")}
    assert steps["ship"] == "failed" and steps["reserve"] == "compensated"
    wait(browser, '#audit [data-ok="true"]')
    browser.find_element(By.CSS_SELECTOR, "#history-card > summary").click()  # folded
    history = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")
    assert history[0].text.split()[0] == "1" and "RunCompensated" in history[-1].text
    assert browser.find_elements(By.CSS_SELECTOR, '#timeline .timeline-bar[data-kind="failed"]')
    shot(browser, "run.png")


def test_approve_from_the_page_and_watch_it_finish(sqlite_server: Server,
                                                  browser: webdriver.Chrome) -> None:
    gated = {"name": "release", "steps": [
        {"id": "build", "tool": "echo", "args": {"v": 1}},
        {"id": "deploy", "tool": "echo", "args": {"v": 1}, "confirm": "deploy to prod?"},
        {"id": "notify", "tool": "echo", "args": {"v": 1}}]}
    with sqlite_server.client() as c:
        run_id = c.post("/api/v1/runs", json={"composition": gated}).json()["run_id"]
        sqlite_server.wait_for(c, run_id, lambda r: bool(r.get("waiting_for")))
    browser.get(sqlite_server.page(f"/runs/{run_id}"))
    button = wait(browser, '[data-approval="deploy"] button[data-action="approve"]')[0]
    assert "deploy to prod?" in browser.find_element(By.CSS_SELECTOR,
                                                     '[data-approval="deploy"]').text
    button.click()
    wait(browser, 'dialog#ask[open] [data-answer="yes"]')[0].click()  # it asks first
    # the page follows the run live until it ends
    wait(browser, '#graph g.node[data-step="notify"][data-status="completed"]')
    wait(browser, "#summary .s-completed")
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-approval]")


def test_the_viewer_asks_for_the_token_once(make_server: Any,
                                            browser: webdriver.Chrome) -> None:
    server = make_server(SAGA_API_TOKEN="s3cret")
    with server.client("s3cret") as c:
        run_id = c.post("/api/v1/runs", json={"template": "quickstart"}).json()["run_id"]
        server.wait_for(c, run_id)
    browser.get(server.url + "/")
    field = wait(browser, "input#token")[0]
    field.send_keys("s3cret")
    browser.find_element(By.CSS_SELECTOR, "form#login button").click()
    wait(browser, f'tr[data-run="{run_id}"]')
    browser.get(server.url + f"/runs/{run_id}")  # the session is kept: no second prompt
    wait(browser, '#graph g.node[data-status="completed"]')
