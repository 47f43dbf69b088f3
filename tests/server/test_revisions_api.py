"""Issue 40 over HTTP: migrate (a dry run, a refusal, the move), the preview and the
reset, and labels, on a running ``saga serve`` whose worker continues each run."""

from __future__ import annotations

from typing import Any

from tests.server.conftest import Server


def composition(**changes: Any) -> dict[str, Any]:
    steps = [{"id": "a", "tool": "echo", "args": {"x": 1},
              "compensate": {"tool": "echo", "args": {"undo": "a"}}},
             {"id": "b", "tool": "echo", "args": {"x": changes.get("b", 2)},
              "depends_on": ["a"], "compensate": {"tool": "echo", "args": {"undo": "b"}}},
             {"id": "c", "tool": "echo", "args": {"x": 3}, "depends_on": ["b"],
              "confirm": "go?"}]
    if changes.get("extra"):
        steps.append({"id": "d", "tool": "echo", "args": {"x": 4}, "depends_on": ["c"]})
    return {"name": "api-order", "version": changes.get("version", "1"), "steps": steps}


def test_migrate_reset_and_label_over_http(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        run_id = c.post("/api/v1/runs", json={"composition": composition()}).json()["run_id"]
        run = sqlite_server.wait_for(c, run_id, lambda r: r["status"] == "waiting")
        version = run["version"]

        refused = c.post(f"/api/v1/runs/{run_id}/migrate",
                         json={"composition": composition(b=5, extra=True)})
        assert refused.status_code == 409, refused.text
        assert refused.json()["error"] == "MigrationRefusedError"
        assert "step b" in refused.json()["detail"]
        new = composition(extra=True, version="2")
        dry = c.post(f"/api/v1/runs/{run_id}/migrate", json={"composition": new,
                                                             "dry_run": True}).json()
        assert (dry["safe"], dry["migrated"]) == (True, False)
        assert c.get(f"/api/v1/runs/{run_id}").json()["version"] == version
        moved = c.post(f"/api/v1/runs/{run_id}/migrate",
                       json={"composition": new, "reason": "add d"}).json()
        assert moved["migrated"] is True

        labelled = c.post(f"/api/v1/runs/{run_id}/labels", json={"labels": {"team": "pay"}})
        assert labelled.json()["labels"] == {"team": "pay"}
        assert [r["run_id"] for r in c.get("/api/v1/runs", params={"label": "team=pay"})
                .json()] == [run_id]

        assert c.post(f"/api/v1/runs/{run_id}/approve/c", json={}).status_code == 200
        done = sqlite_server.wait_for(c, run_id)
        assert done["status"] == "completed" and "d" in done["steps"]
        assert done["definition_version"] == "2" and done["migrations"][0]["reason"] == "add d"

        preview = c.get(f"/api/v1/runs/{run_id}/reset/b").json()
        assert (preview["undo"], preview["reopen"]) == (["b"], ["b", "c", "d"])
        reset = c.post(f"/api/v1/runs/{run_id}/reset", json={"step": "b", "reason": "again"})
        assert reset.status_code == 200, reset.text
        again = sqlite_server.wait_for(c, run_id, lambda r: r["status"] == "waiting")
        assert again["status"] == "waiting" and again["steps"]["b"]["status"] == "completed"
        history = c.get(f"/api/v1/runs/{run_id}/events", params={"after": version}).text
        assert "RunReset" in history and "StepsReopened" in history
        assert c.get(f"/api/v1/runs/{run_id}/verify").json()["ok"] is True
