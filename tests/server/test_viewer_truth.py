"""Issue 39, the viewer that tells the truth, in a real browser (Debian's chromium via
selenium) against a real ``saga serve``: status words, the controls the API accepts,
confirmations with a comment, the 404 page, search and pages, the graph's fit, zoom,
conditions and undo path, folded outputs, the failed-only filter and relative times."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.server.conftest import Server
from tests.server.test_run_actions import GATED, UNDO_FAILS, offered
from tests.server.test_viewer import browser, shot, wait

__all__ = ["browser"]  # the fixture, used by name

LONG = {"name": "long", "steps": [
    {"id": f"s{i:02d}", "tool": "act", "args": {"value": {"row": i, "text": "x" * 300}},
     **({"depends_on": [f"s{i - 4:02d}"]} if i >= 4 else {})} for i in range(56)]}


def start(server: Server, body: dict[str, Any], done: Any = None) -> dict[str, Any]:
    with server.client() as c:
        run_id = c.post("/api/v1/runs", json=body).json()["run_id"]
        return server.wait_for(c, run_id, done)


def statuses(driver: webdriver.Chrome, css: str) -> dict[str, str]:
    """Each step's status as the page shows it, read in one go (the page redraws live)."""
    return dict(driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]))"
        ".map(e => [e.dataset.step, e.dataset.status]);", css))


def listed(driver: webdriver.Chrome) -> list[str]:
    """The run ids the list shows, in order, read in one go."""
    return list(driver.execute_script(
        "return Array.from(document.querySelectorAll('tr[data-run]'))"
        ".map(r => r.dataset.run);"))


def until(driver: webdriver.Chrome, check: Any, seconds: float = 20) -> Any:
    return WebDriverWait(driver, seconds, ignored_exceptions=(
        StaleElementReferenceException,)).until(lambda d: check(d) or False)


def test_a_step_whose_undo_failed_is_not_undone_everywhere(sqlite_server: Server,
                                                          browser: webdriver.Chrome) -> None:
    run = start(sqlite_server, {"composition": UNDO_FAILS})
    browser.get(sqlite_server.page(f"/runs/{run['run_id']}"))
    wait(browser, '#steps tbody tr[data-step="notify"]')
    want = {"reserve": "compensated", "charge": "not undone", "ship": "failed",
            "notify": "pending"}  # the step never started is listed, as pending
    assert statuses(browser, "#graph g.node") == want
    assert statuses(browser, "#steps tbody tr") == want
    header = browser.find_element(By.CSS_SELECTOR, "#summary [data-not-undone]")
    assert header.get_attribute("data-not-undone") == "charge"
    assert header.text == "1 step not undone"
    assert "3 of 4 steps finished" in browser.find_element(By.ID, "progress").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#summary [data-action]")  # none apply
    # failed only: the failed step and the one not undone
    browser.find_element(By.ID, "failed-only").click()
    until(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#steps tbody tr")) == 2)
    assert set(statuses(browser, "#steps tbody tr")) == {"charge", "ship"}
    shot(browser, "not-undone.png")


def test_only_the_controls_the_api_accepts_are_offered(sqlite_server: Server,
                                                       browser: webdriver.Chrome) -> None:
    compensated = start(sqlite_server, {"template": "quickstart",
                                        "inputs": {"fail_at": "ship"}})
    failed = start(sqlite_server, {"composition": {"name": "fails", "steps": [
        {"id": "a", "tool": "act", "args": {"fail": True}}]}})
    for run in (compensated, failed):
        browser.get(sqlite_server.page(f"/runs/{run['run_id']}"))
        wait(browser, "#graph g.node")
        shown = {b.get_attribute("data-action")
                 for b in browser.find_elements(By.CSS_SELECTOR, "#summary [data-action]")}
        assert shown == offered(run), run["status"]
    assert "retry" not in offered(compensated)  # the button the API answered 409 to


def test_approve_and_reject_confirm_first_and_record_the_comment(
        sqlite_server: Server, browser: webdriver.Chrome) -> None:
    waiting = lambda r: bool(r.get("waiting_for"))  # noqa: E731
    for verb, comment, ends in (("approve", "checked the diff", "completed"),
                                ("reject", "not on a Friday", "failed")):
        run = start(sqlite_server, {"composition": GATED}, waiting)
        browser.get(sqlite_server.page(f"/runs/{run['run_id']}"))
        wait(browser, '#graph g.node[data-step="deploy"][data-status="waiting"]')
        assert statuses(browser, "#steps tbody tr")["deploy"] == "waiting"  # as the graph
        button = f'[data-approval="deploy"] [data-action="{verb}"]'
        wait(browser, button)[0].click()
        dialog = wait(browser, "dialog#ask[open]")[0]
        assert "ship it?" in dialog.text
        dialog.find_element(By.CSS_SELECTOR, '[data-answer="no"]').click()  # back: nothing
        with sqlite_server.client() as c:
            assert c.get(f"/api/v1/runs/{run['run_id']}").json()["status"] == "waiting"
        browser.find_element(By.CSS_SELECTOR, button).click()
        dialog = wait(browser, "dialog#ask[open]")[0]
        dialog.find_element(By.ID, "ask-text").send_keys(comment)
        if verb == "approve":
            shot(browser, "approve-dialog.png")
        dialog.find_element(By.CSS_SELECTOR, '[data-answer="yes"]').click()
        with sqlite_server.client() as c:
            assert sqlite_server.wait_for(c, run["run_id"])["status"] == ends
            wait(browser, f"#summary .s-{ends}")  # the page followed it to its end
            history = c.get(f"/api/v1/runs/{run['run_id']}/events").json()
        decision = next(e for e in history if e["type"].startswith("Approval")
                        and e["type"] != "ApprovalRequested")
        assert decision["payload"]["comment"] == comment


def test_an_unknown_run_is_a_404_page_with_a_way_back(sqlite_server: Server,
                                                      browser: webdriver.Chrome) -> None:
    browser.get(sqlite_server.page("/runs/no-such-run"))
    assert "No such run" in wait(browser, "#notfound")[0].text
    assert browser.find_element(By.ID, "wanted").text == "no-such-run"
    assert not browser.find_elements(By.CSS_SELECTOR, ".card h2")  # no empty cards
    shot(browser, "unknown-run.png")
    browser.find_element(By.ID, "back").click()
    wait(browser, "#filters")


def test_the_list_searches_by_prefix_and_pages(sqlite_server: Server,
                                               browser: webdriver.Chrome) -> None:
    ids = [f"batch-{i}" for i in range(5)] + ["solo-1"]
    with sqlite_server.client() as c:
        for run_id in ids:
            c.post("/api/v1/runs", json={"template": "quickstart", "run_id": run_id})
        for run_id in ids:
            sqlite_server.wait_for(c, run_id)
    browser.get(sqlite_server.page("/?limit=2"))
    wait(browser, "tr[data-run]")
    seen: list[str] = []
    for _ in range(3):
        seen += listed(browser)
        older = browser.find_element(By.CSS_SELECTOR, '[data-page="older"]')
        if older.get_attribute("disabled"):
            break
        older.click()
        before = list(seen)
        until(browser, lambda d, before=before: listed(d) and listed(d)[0] not in before)
    assert sorted(seen) == sorted(ids) and len(seen) == 6
    assert browser.find_element(By.CSS_SELECTOR, '[data-page="older"]').get_attribute("disabled")
    box = browser.find_element(By.CSS_SELECTOR, 'input[name="prefix"]')
    box.send_keys("batch-")
    browser.find_element(By.CSS_SELECTOR, '#filters button[type="submit"]').click()
    until(browser, lambda d: listed(d) == ["batch-4", "batch-3"])  # newest first
    assert "prefix=batch-" in browser.current_url
    # relative times, the exact one on hover
    title, text = browser.execute_script(
        "var t = document.querySelector('tr[data-run] time'); return [t.title, t.textContent];")
    assert "UTC" in title and (text == "just now" or text.endswith("ago")) and "." not in text


def test_the_graph_fits_zooms_and_draws_conditions_and_undo(sqlite_server: Server,
                                                            browser: webdriver.Chrome) -> None:
    run = start(sqlite_server, {"template": "quickstart", "inputs": {"fail_at": "ship"}})
    browser.get(sqlite_server.page(f"/runs/{run['run_id']}"))
    wait(browser, "#graph g.node")
    undo = browser.find_elements(By.CSS_SELECTOR, '#graph g.link[data-kind="undo"]')
    assert [(u.get_attribute("data-from"), u.get_attribute("data-to")) for u in undo] == \
        [("charge", "reserve")]
    conditional = browser.find_element(By.CSS_SELECTOR, '#graph g.link[data-to="charge"]')
    assert conditional.get_attribute("data-condition") == "when inputs.fail_at != 'charge'"
    node = browser.find_element(By.CSS_SELECTOR, '#graph g.node[data-step="charge"]')
    assert "when inputs.fail_at" in node.text and "undo: echo" in node.text

    long = start(sqlite_server, {"composition": LONG})
    browser.get(sqlite_server.page(f"/runs/{long['run_id']}"))
    wait(browser, "#graph g.node")
    box = browser.find_element(By.ID, "graph")
    svg = box.find_element(By.TAG_NAME, "svg")
    assert svg.size["width"] <= box.size["width"]  # fitted: nothing cut off
    assert box.get_attribute("data-zoom") == "1.00"
    browser.find_element(By.ID, "zoom-in").click()
    browser.find_element(By.ID, "zoom-in").click()
    assert float(box.get_attribute("data-zoom")) > 1.5
    browser.find_element(By.ID, "zoom-fit").click()
    assert box.get_attribute("data-zoom") == "1.00"
    # a long run: every step listed, outputs folded, a progress line
    rows = browser.find_elements(By.CSS_SELECTOR, "#steps tbody tr")
    assert len(rows) == 56
    assert "56 of 56 steps finished" in browser.find_element(By.ID, "progress").text
    folded = browser.find_elements(By.CSS_SELECTOR, "#steps details.fold")
    assert len(folded) == 56 and not any(f.get_attribute("open") for f in folded)
    assert not browser.find_element(By.ID, "timeline-card").get_attribute("open")
    shot(browser, "long.png")


def test_cancelled_is_not_painted_as_failed(sqlite_server: Server,
                                            browser: webdriver.Chrome) -> None:
    run = start(sqlite_server, {"composition": GATED}, lambda r: bool(r.get("waiting_for")))
    with sqlite_server.client() as c:
        c.post(f"/api/v1/runs/{run['run_id']}/cancel", json={}).raise_for_status()
        sqlite_server.wait_for(c, run["run_id"])
    browser.get(sqlite_server.page(f"/runs/{run['run_id']}"))
    cancelled = wait(browser, "#summary .badge.s-cancelled")[0]
    failed = browser.execute_script(  # a failed badge's colour, on this page's style sheet
        "var s = document.createElement('span'); s.className = 'badge s-failed';"
        "document.body.appendChild(s); return getComputedStyle(s).backgroundColor;")
    assert browser.execute_script(
        "return getComputedStyle(arguments[0]).backgroundColor;", cancelled) != failed


def test_a_parent_waiting_for_its_child_links_to_the_child(make_server: Any, tmp_path: Path,
                                                           browser: webdriver.Chrome) -> None:
    folder = tmp_path / "templates"
    folder.mkdir()
    (folder / "gated_child.yaml").write_text(json.dumps(GATED), encoding="utf-8")
    server = make_server(SAGA_TEMPLATES=str(folder))
    parent = start(server, {"composition": {"name": "parent", "steps": [
        {"id": "nested", "use": "gated_child"}]}},
        lambda r: bool(r.get("waiting_for_children")))
    browser.get(server.page(f"/runs/{parent['run_id']}"))
    note = wait(browser, "#summary .child-wait")[0]
    child = parent["waiting_for_children"][0]["run_id"]
    assert note.get_attribute("data-child") == child
    assert "waits for approval of deploy" in note.text
    assert not browser.find_elements(By.CSS_SELECTOR, "[data-approval]")  # decided there
    note.find_element(By.TAG_NAME, "a").click()
    wait(browser, '[data-approval="deploy"] [data-action="approve"]')
