"""Issue 39: the run's ``actions`` are exactly what the API would accept now, a step whose
undo failed is named ``not undone``, the list searches by id prefix and pages, and an
unknown run's page is a 404. Against a real ``saga serve`` over SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx

from tests.server.conftest import ROOT, Server, store_env

CONTROLS = ("retry", "compensate", "cancel", "pause", "unpause")
UNDO_FAILS = {"name": "undo-fails", "steps": [
    {"id": "reserve", "tool": "act", "args": {"value": 1},
     "compensate": {"tool": "undo", "args": {"what": "reserve"}}},
    {"id": "charge", "tool": "act", "args": {"value": 2},
     "compensate": {"tool": "undo", "args": {"what": "charge", "fail": True}}},
    {"id": "ship", "tool": "act", "args": {"fail": True}},
    {"id": "notify", "tool": "act", "args": {"value": 4}}]}
FAILS = {"name": "fails", "steps": [
    {"id": "a", "tool": "act", "args": {"value": 1}},
    {"id": "b", "tool": "act", "args": {"fail": True}}]}
GATED = {"name": "gated", "steps": [
    {"id": "build", "tool": "act", "args": {"value": 1}},
    {"id": "deploy", "tool": "act", "args": {"value": 2}, "confirm": "ship it?"}]}


def offered(run: dict[str, Any]) -> set[str]:
    return {a["action"] for a in run["actions"] if "step" not in a}


def accepted(c: httpx.Client, server: Server, body: dict[str, Any],
             ready: Any = None) -> set[str]:
    """The controls the API accepts for a fresh run of ``body`` once ``ready`` (each
    tried on a run of its own, since one changes the run)."""
    found = set()
    for control in CONTROLS:
        run_id = c.post("/api/v1/runs", json=body).json()["run_id"]
        server.wait_for(c, run_id, ready)
        answer = c.post(f"/api/v1/runs/{run_id}/{control}", json={})
        assert answer.status_code in (200, 409), answer.text
        if answer.status_code == 200:
            found.add(control)
    return found


def test_actions_are_exactly_what_the_endpoints_accept(any_server: Server) -> None:
    waiting = lambda r: bool(r.get("waiting_for"))  # noqa: E731
    cases = [({"template": "quickstart"}, None),
             ({"template": "quickstart", "inputs": {"fail_at": "ship"}}, None),
             ({"composition": FAILS}, None),
             ({"composition": UNDO_FAILS}, None),
             ({"composition": GATED}, waiting)]
    with any_server.client() as c:
        for body, ready in cases:
            run_id = c.post("/api/v1/runs", json=body).json()["run_id"]
            run = any_server.wait_for(c, run_id, ready)
            assert offered(run) == accepted(c, any_server, body, ready), (body, run["status"])
        # what each looks like, for the record: no Retry on a compensated run
        run_id = c.post("/api/v1/runs", json=cases[1][0]).json()["run_id"]
        assert "retry" not in offered(any_server.wait_for(c, run_id))
        run_id = c.post("/api/v1/runs", json={"composition": GATED}).json()["run_id"]
        run = any_server.wait_for(c, run_id, waiting)
        assert {"action": "approve", "step": "deploy"} in run["actions"]
        assert {"action": "reject", "step": "deploy"} in run["actions"]
        assert offered(run) == {"cancel", "compensate", "pause"}


def test_a_step_whose_undo_failed_is_named_not_undone_by_another_process(
        any_server: Server) -> None:
    with any_server.client() as c:
        run_id = c.post("/api/v1/runs", json={"composition": UNDO_FAILS}).json()["run_id"]
        run = any_server.wait_for(c, run_id)
        layout = c.get(f"/api/v1/runs/{run_id}/graph?format=json").json()
        mermaid = c.get(f"/api/v1/runs/{run_id}/graph").text
    assert run["status"] == "failed" and run["not_undone"] == ["charge"]
    status = {n["id"]: n["status"] for n in layout["nodes"]}
    assert status == {"reserve": "compensated", "charge": "not undone", "ship": "failed",
                      "notify": "pending"}
    assert "classDef not_undone" in mermaid
    # a new process reads what the service's worker wrote, and draws it the same way
    graph = subprocess.run([sys.executable, "-m", "saga.cli", "graph", run_id, "--format",
                            "dot"], cwd=ROOT, env=store_env(any_server.settings),
                           capture_output=True, text=True, timeout=120)
    assert graph.returncode == 0, graph.stderr
    assert '"charge" [label="charge: act\\nnot undone", fillcolor="#ff8c42"];' in graph.stdout
    assert '"charge~undo" -> "reserve~undo"' in graph.stdout
    shown = subprocess.run([sys.executable, "-m", "saga.cli", "status", run_id, "--json"],
                           cwd=ROOT, env=store_env(any_server.settings), capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["actions"] == []  # nothing to retry, undo or cancel


def test_the_list_searches_by_id_prefix_and_pages(any_server: Server) -> None:
    with any_server.client() as c:
        ids = [f"page_{i:02d}" for i in range(7)] + ["other-1"]
        for run_id in ids:
            c.post("/api/v1/runs", json={"template": "quickstart", "run_id": run_id})
        for run_id in ids:
            any_server.wait_for(c, run_id)
        found = [r["run_id"] for r in c.get("/api/v1/runs?prefix=page_&limit=100").json()]
        assert sorted(found) == ids[:7]
        assert c.get("/api/v1/runs?prefix=page%25").json() == []  # % is no wildcard
        assert c.get("/api/v1/runs?prefix=pageX").json() == []  # nor is _
        pages = [[r["run_id"] for r in c.get(f"/api/v1/runs?prefix=page&limit=3"
                                             f"&offset={at}").json()] for at in (0, 3, 6, 9)]
    assert [len(p) for p in pages] == [3, 3, 1, 0]
    assert sorted(r for page in pages for r in page) == ids[:7]


def test_an_unknown_run_page_is_a_404_with_a_way_back(sqlite_server: Server) -> None:
    with sqlite_server.client(Accept="text/html") as c:
        page = c.get("/runs/no-such-run")
        assert page.status_code == 404
        assert 'href="/"' in page.text and "No such run" in page.text
        run_id = c.post("/api/v1/runs", json={"template": "quickstart"}).json()["run_id"]
        assert c.get(f"/runs/{run_id}").status_code == 200
