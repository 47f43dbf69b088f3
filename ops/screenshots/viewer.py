"""Screenshots of the viewer in every state a run can be in, for a person to look at.

    python ops/screenshots/viewer.py [OUT]     (default: /tmp/saga-screenshots)

It starts ``saga serve`` over a fresh SQLite store (with the test stand-in tools), makes
one run of each kind through the API (completed; failed with a step not undone;
compensated; cancelled; waiting for approval; a 56-step run), and saves each page, the
list, and an unknown run's page as PNGs in OUT. The PNGs are not kept in the repository.
Needs Debian's chromium and chromedriver (ops/ensure-browser.sh).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ["--tools", "tests.standins.standins"]
FINISHED = ("completed", "failed", "compensated", "cancelled")

#: A run whose second step's undo fails: it ends failed with that step not undone.
UNDO_FAILS = {"name": "undo-fails", "steps": [
    {"id": "reserve", "tool": "act", "args": {"value": 1},
     "compensate": {"tool": "undo", "args": {"what": "reserve"}}},
    {"id": "charge", "tool": "act", "args": {"value": 2},
     "compensate": {"tool": "undo", "args": {"what": "charge", "fail": True}}},
    {"id": "ship", "tool": "act", "args": {"fail": True}},
    {"id": "notify", "tool": "act", "args": {"value": 4}}]}
#: A run that waits for a person between two steps.
GATED = {"name": "release", "steps": [
    {"id": "build", "tool": "act", "args": {"value": 1},
     "compensate": {"tool": "undo", "args": {"what": "build"}}},
    {"id": "deploy", "tool": "act", "args": {"value": 2}, "confirm": "deploy to production?"},
    {"id": "notify", "tool": "act", "args": {"value": 3}}]}


def long_run(n: int = 56) -> dict[str, Any]:
    """``n`` steps in four lanes, each with a long output."""
    steps: list[dict[str, Any]] = []
    for i in range(n):
        step: dict[str, Any] = {"id": f"s{i:02d}", "tool": "act",
                                "args": {"value": {"row": i, "text": "x" * 300}}}
        if i >= 4:
            step["depends_on"] = [f"s{i - 4:02d}"]
        steps.append(step)
    return {"name": "long", "steps": steps}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(client: httpx.Client, run_id: str, done: Any) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = client.get(f"/api/v1/runs/{run_id}").json()
        if done(run):
            return run
        time.sleep(0.1)
    raise SystemExit(f"run {run_id} did not get there: {run['status']}")


def make_runs(client: httpx.Client) -> dict[str, str]:
    """One run of each kind, by the name of its screenshot."""
    def start(body: dict[str, Any]) -> str:
        answer = client.post("/api/v1/runs", json=body)
        answer.raise_for_status()
        return str(answer.json()["run_id"])

    ended = lambda r: r["status"] in FINISHED  # noqa: E731
    waiting = lambda r: bool(r.get("waiting_for"))  # noqa: E731
    runs = {"completed": start({"template": "quickstart"}),
            "compensated": start({"template": "quickstart", "inputs": {"fail_at": "ship"}}),
            "not-undone": start({"composition": UNDO_FAILS}),
            "waiting": start({"composition": GATED}),
            "cancelled": start({"composition": GATED}),
            "long": start({"composition": long_run()})}
    for name in ("completed", "compensated", "not-undone", "long"):
        wait_until(client, runs[name], ended)
    wait_until(client, runs["waiting"], waiting)
    wait_until(client, runs["cancelled"], waiting)
    client.post(f"/api/v1/runs/{runs['cancelled']}/cancel",
                json={"reason": "not today"}).raise_for_status()
    wait_until(client, runs["cancelled"], ended)
    return runs


def browser() -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1300,1000"):
        options.add_argument(flag)
    driver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    return webdriver.Chrome(options=options, service=DriverService(driver))


def full_page(driver: webdriver.Chrome, path: Path) -> None:
    """The whole page, not only the window."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1300, min(max(int(height) + 100, 600), 6000))
    time.sleep(0.3)  # let the layout settle at the new size (a screenshot, not a test)
    driver.save_screenshot(str(path))
    driver.set_window_size(1300, 1000)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="saga-shots-"))
    port = free_port()
    token = secrets.token_urlsafe(24)
    env = {**os.environ, "SAGA_HOME": str(home), "PYTHONPATH": str(ROOT),
           "SAGA_API_TOKEN": token}
    env.pop("SAGA_DATABASE_URL", None)
    server = subprocess.Popen([sys.executable, "-m", "saga", "serve", "--port", str(port),
                               *TOOLS], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    driver = None
    try:
        with httpx.Client(base_url=url, timeout=10,
                          headers={"Authorization": f"Bearer {token}"}) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.get("/api/v1/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    if time.monotonic() > deadline:
                        raise
                time.sleep(0.2)
            runs = make_runs(client)
        driver = browser()
        driver.get(url + f"/?token={token}")  # signs the browser in, as saga serve's URL
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "tr[data-run]"))
        full_page(driver, out / "runs.png")
        for name, run_id in runs.items():
            driver.get(f"{url}/runs/{run_id}")
            WebDriverWait(driver, 20).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, "#graph g.node"))
            full_page(driver, out / f"run-{name}.png")
        driver.get(f"{url}/runs/{runs['long']}")  # its graph zoomed in and panned
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#graph g.node"))
        for _ in range(4):
            driver.find_element(By.ID, "zoom-in").click()
        driver.save_screenshot(str(out / "run-long-zoomed.png"))
        driver.get(f"{url}/runs/{runs['waiting']}")
        WebDriverWait(driver, 20).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, '[data-action="approve"]'))
        driver.find_element(By.CSS_SELECTOR, '[data-approval] [data-action="approve"]').click()
        driver.save_screenshot(str(out / "run-waiting-approve-dialog.png"))
        driver.get(f"{url}/runs/no-such-run")
        full_page(driver, out / "unknown-run.png")
        print("\n".join(str(p) for p in sorted(out.glob("*.png"))))
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(10)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/saga-screenshots"))
