"""Issue 40 in the viewer (a real browser on a real ``saga serve``): "Migrate…" checks a
dry run before it acts and the run then shows the version it is on and when it moved;
"Reset to this step" lists what it undoes and re-runs, asks for a reason, and resets."""

from __future__ import annotations

import json

from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.server.conftest import Server
from tests.server.test_revisions_api import composition
from tests.server.test_viewer import browser, wait
from tests.server.test_viewer_truth import start, until

__all__ = ["browser"]  # the fixture, used by name


def answer(driver: webdriver.Chrome, title: str, text: str) -> str:
    """Type ``text`` into the confirmation titled ``title``, confirm it; its words."""
    until(driver, lambda d: title in d.find_element(By.ID, "ask").text)
    dialog = driver.find_element(By.ID, "ask")
    words = dialog.text
    dialog.find_element(By.ID, "ask-text").send_keys(text)
    dialog.find_element(By.CSS_SELECTOR, '[data-answer="yes"]').click()
    return words


def test_migrate_and_reset_from_the_viewer(sqlite_server: Server,
                                           browser: webdriver.Chrome) -> None:
    run = start(sqlite_server, {"composition": composition()},
                lambda r: r["status"] == "waiting")
    run_id = run["run_id"]
    browser.get(sqlite_server.page(f"/runs/{run_id}"))
    wait(browser, '#summary [data-action="migrate"]')[0].click()
    new = json.dumps(composition(extra=True, version="2"))
    answer(browser, "Migrate run", new)
    safe = answer(browser, "Migrate run", "add d")
    assert "Safe" in safe
    wait(browser, '#summary [data-migrated="2"]')
    with sqlite_server.client() as c:
        assert c.get(f"/api/v1/runs/{run_id}").json()["definition_version"] == "2"

    wait(browser, '#steps [data-reset="b"]')[0].click()
    words = answer(browser, "Reset to b", "try again")
    assert "Undoes, newest first: b. Then runs again: b." in words
    with sqlite_server.client() as c:
        history = until(browser, lambda d: "StepsReopened" in (text := c.get(
            f"/api/v1/runs/{run_id}/events", params={"after": run["version"]}).text) and text)
        assert "RunReset" in history and "try again" in history
        assert sqlite_server.wait_for(c, run_id, lambda r: r["status"] == "waiting")[
            "steps"]["b"]["status"] == "completed"
