"""The HTTP API against a real ``saga serve`` on loopback, with the seeds' bodies as the
seeds write them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from saga.config import Settings
from tests.server.conftest import ROOT, Server, store_env

SEEDS = Path(__file__).resolve().parents[1] / "seeds"

# Seed 000's curl example, as written there.
SEED_000_EXECUTE = {
    "workflow_id": "my-workflow",
    "agent_id": "agent-123",
    "steps": [
        {"step_id": "fetch", "skill_id": "http_get",
         "inputs": {"url": "https://api.example.com"}, "dependencies": []},
        {"step_id": "process", "skill_id": "analyze",
         "inputs": {"algorithm": "sentiment"}, "dependencies": ["fetch"]},
    ],
}


def test_seed_000_execute_merges_dependency_outputs(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        answer = c.post("/api/composition/execute", json=SEED_000_EXECUTE)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["status"] == "completed" and body["workflow_id"] == "my-workflow"
        assert body["agent_id"] == "agent-123"
        # fetch's dict output is merged into process's inputs, beside its own
        assert body["results"]["process"]["given"] == ["algorithm", "body", "content_type",
                                                       "status"]
        assert body["completed_steps"] == ["fetch", "process"]
        status = c.get(f"/api/composition/status/{body['execution_id']}").json()
        assert status["status"] == "completed"
        assert status["results"] == body["results"]


def test_seed_000_a_non_dict_output_goes_under_its_step_name(sqlite_server: Server) -> None:
    body = {"workflow_id": "w", "agent_id": "a", "steps": [
        {"step_id": "word", "skill_id": "echo", "inputs": {}, "dependencies": []},
        {"step_id": "count", "skill_id": "noop", "inputs": {}, "dependencies": []},
        {"step_id": "use", "skill_id": "echo", "inputs": {"x": 1},
         "dependencies": ["word", "count"]}]}
    with sqlite_server.client() as c:
        result = c.post("/api/composition/execute", json=body).json()
    assert result["results"]["use"] == {"x": 1, "count_output": None}


def test_seed_000_validate_reports_cycles_and_missing_dependencies(
        sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        cycle = c.post("/api/composition/validate", json={
            "workflow_id": "test", "agent_id": "agent-123", "steps": [
                {"step_id": "a", "skill_id": "echo", "inputs": {}, "dependencies": ["b"]},
                {"step_id": "b", "skill_id": "echo", "inputs": {}, "dependencies": ["a"]}]})
        assert cycle.json()["valid"] is False
        assert "cycle" in cycle.json()["errors"][0]["message"]
        missing = c.post("/api/composition/validate", json={
            "workflow_id": "t", "steps": [
                {"step_id": "a", "skill_id": "nope", "inputs": {}, "dependencies": ["zz"]}]})
        paths = {e["path"] for e in missing.json()["errors"]}
        assert paths == {"steps[0].depends_on", "steps[0].tool"}, missing.text
        ok = c.post("/api/composition/validate", json=SEED_000_EXECUTE).json()
        assert ok == {"valid": True, "errors": [], "execution_order": ["fetch", "process"],
                      "levels": [["fetch"], ["process"]]}
        assert c.get("/api/composition/status/nope-nope").status_code == 404


def test_seed_001_templates_with_their_metadata(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        c.post("/api/v1/compositions/execute", json={"template_id": "quickstart", "input": {}})
        listed = c.get("/api/v1/compositions/templates").json()
        assert len(listed) >= 10
        quick = next(t for t in listed if t["id"] == "quickstart")
        assert set(quick) >= {"id", "name", "description", "metadata", "validation"}
        assert quick["metadata"]["usage_count"] == 1
        assert quick["metadata"]["success_rate"] == 1.0
        one = c.get("/api/v1/compositions/templates/quickstart").json()
        assert one["composition"]["name"] == "quickstart"
        assert c.get("/api/v1/compositions/templates/no-such").status_code == 404


def test_seed_001_execute_and_validate(sqlite_server: Server) -> None:
    composition = json.loads((SEEDS / "001_search_fold_store.json").read_text())
    with sqlite_server.client() as c:
        result = c.post("/api/v1/compositions/execute", json={
            "composition": composition, "input": {"query": "auth"},
            "options": {"timeout": 30, "max_concurrency": 2}}).json()
        assert result["success"] is True, result
        assert set(result["results"]) == {"search", "fold", "store"}
        assert result["steps_executed"] == 3 and result["errors"] == []
        assert isinstance(result["duration"], float) and result["run_id"]
        undone = c.post("/api/v1/compositions/execute", json={
            "template_id": "quickstart", "input": {"fail_at": "ship"},
            "options": {"error_strategy": "rollback"}}).json()
        assert undone["success"] is False and undone["status"] == "compensated"
        assert undone["errors"] == [{"step_id": "ship", "type": "ToolError",
                                     "message": "no courier available"}]
        dry = c.post("/api/v1/compositions/execute", json={
            "template_id": "quickstart", "options": {"dry_run": True}}).json()
        assert dry["run_id"] is None and dry["dry_run"]["name"] == "quickstart"
        bad = c.post("/api/v1/compositions/validate", json={"composition": {
            "name": "x", "steps": [{"id": "a", "tool": "nope"},
                                   {"id": "a", "tool": "echo", "depends_on": ["b"]}]}})
        assert bad.status_code == 200 and bad.json()["valid"] is False
        assert len(bad.json()["errors"]) >= 2
        assert all(e["path"] for e in bad.json()["errors"])


def test_runs_resource(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        answer = c.post("/api/v1/runs", json={"template": "quickstart", "run_id": "ORDER-42",
                                              "labels": {"team": "pay"}})
        assert answer.status_code == 202, answer.text
        assert answer.json()["run_id"] == "ORDER-42"
        run = sqlite_server.wait_for(c, "ORDER-42")
        assert run["status"] == "completed"
        again = c.post("/api/v1/runs", json={"template": "quickstart", "run_id": "ORDER-42",
                                             "labels": {"team": "pay"}})
        assert again.json()["status"] == "completed"  # the same run: nothing ran again
        conflict = c.post("/api/v1/runs", json={"template": "quickstart", "run_id": "ORDER-42",
                                                "inputs": {"amount": 1}})
        assert conflict.status_code == 409 and conflict.json()["error"] == "RunIdConflictError"
        listed = c.get("/api/v1/runs", params={"label": "team=pay"}).json()
        assert [r["run_id"] for r in listed] == ["ORDER-42"]
        assert c.get("/api/v1/runs", params={"label": "team=ops"}).json() == []
        events = c.get("/api/v1/runs/ORDER-42/events").json()
        assert events[0]["type"] == "RunStarted" and events[-1]["type"] == "RunCompleted"
        assert [e["version"] for e in events] == list(range(1, len(events) + 1))
        graph = c.get("/api/v1/runs/ORDER-42/graph").text
        assert graph.startswith("flowchart TD") and "completed" in graph
        verified = c.get("/api/v1/runs/ORDER-42/verify").json()
        assert verified["ok"] is True and verified["replay"]["ok"] is True
        report = c.get("/api/v1/report", params={"format": "md"})
        assert report.status_code == 200 and "quickstart" in report.text
        assert c.get("/api/v1/runs/NOPE-1").status_code == 404


def test_an_invalid_composition_records_nothing(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        before = c.get("/api/v1/health").json()["position"]
        bad = c.post("/api/v1/runs", json={"composition": {
            "name": "x", "steps": [{"id": "a", "tool": "nope"}, {"id": "b", "tool": "echo",
                                                                  "depends_on": ["zz"]}]}})
        assert bad.status_code == 422
        assert {p["path"] for p in bad.json()["problems"]} == {"steps[0].tool",
                                                              "steps[1].depends_on"}
        wrong_input = c.post("/api/v1/runs", json={"template": "quickstart",
                                                   "inputs": {"order_id": "lowercase"}})
        assert wrong_input.status_code == 422 and wrong_input.json()["problems"]
        too_big = c.post("/api/v1/runs", content=b"{" + b" " * (2 << 20) + b"}",
                         headers={"content-type": "application/json"})
        assert too_big.status_code == 413
        assert c.get("/api/v1/health").json()["position"] == before


def test_approve_and_signal_over_http_record_the_actor(sqlite_server: Server) -> None:
    composition = {"name": "gated", "steps": [
        {"id": "ask", "tool": "echo", "args": {"a": 1}, "confirm": "go ahead?"},
        {"id": "go", "signal": "go", "timeout": 60},
        {"id": "use", "tool": "echo", "args": {"amount": "{{ go.amount }}"}}]}
    with sqlite_server.client(**{"X-Saga-Actor": "alice"}) as c:
        run_id = c.post("/api/v1/runs", json={"composition": composition}).json()["run_id"]
        waiting = sqlite_server.wait_for(c, run_id, lambda r: bool(r.get("waiting_for")))
        assert waiting["waiting_for"] == ["ask"]
        assert c.post(f"/api/v1/runs/{run_id}/approve/ask",
                      json={"comment": "ok"}).status_code == 200
        assert c.post(f"/api/v1/runs/{run_id}/signals/go",
                      json={"amount": 42}).status_code == 200
        done = sqlite_server.wait_for(c, run_id)
        assert done["status"] == "completed", done
        assert done["steps"]["use"]["output"] == {"amount": 42}
        history = c.get(f"/api/v1/runs/{run_id}/events").json()
        granted = next(e for e in history if e["type"] == "ApprovalGranted")
        assert granted["payload"]["actor"] == "api:alice"
        finished = c.post(f"/api/v1/runs/{run_id}/signals/go", json={})
        assert finished.status_code == 409
        assert c.post(f"/api/v1/runs/{run_id}/approve/ask",
                      headers={"X-Saga-Actor": "bad actor!"}).status_code == 422


def test_tokens(make_server: Any) -> None:
    server = make_server(SAGA_API_TOKEN="w-secret", SAGA_API_READ_TOKEN="r-secret",
                         SAGA_API_TOKEN_NAME="ci")
    with server.client(None) as anonymous:
        assert anonymous.get("/api/v1/health").status_code == 200
        assert anonymous.get("/api/v1/runs").status_code == 401
        assert anonymous.get("/openapi.json").status_code == 401
        page = anonymous.get("/", headers={"Accept": "text/html"})
        assert page.status_code == 401 and "API token" in page.text
    with server.client("wrong") as wrong:
        assert wrong.get("/api/v1/runs").status_code == 401
    with server.client("r-secret") as reader:
        assert reader.get("/api/v1/runs").status_code == 200
        refused = reader.post("/api/v1/runs", json={"template": "quickstart"})
        assert refused.status_code == 403
    with server.client("w-secret") as writer:
        run_id = writer.post("/api/v1/runs", json={"template": "quickstart"}).json()["run_id"]
        assert server.wait_for(writer, run_id)["actor"] == "ci"
    with httpx.Client(base_url=server.url, cookies={"saga_token": "w-secret"}) as old:
        # a token in a cookie is no longer anything (any local page could read it)
        assert old.get("/api/v1/runs").status_code == 401
    with httpx.Client(base_url=server.url) as browser:  # a session signed in as a reader
        assert browser.post("/api/v1/session", json={"token": "r-secret"}).status_code == 200
        assert browser.get("/api/v1/runs").status_code == 200
        assert browser.get("/").status_code == 200
        csrf = browser.get("/api/v1/session").json()["csrf"]
        assert browser.post("/api/v1/runs", json={"template": "quickstart"},
                            headers={"X-Saga-CSRF": csrf}).status_code == 403


def test_binding_beyond_loopback_needs_a_token(sqlite_settings: Any) -> None:
    proc = subprocess.run([sys.executable, "-m", "saga", "serve", "--host", "0.0.0.0",
                           "--port", "1"], cwd=ROOT, env=store_env(sqlite_settings),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: refusing to serve on 0.0.0.0 without SAGA_API_TOKEN: set a token, or bind "
        "to 127.0.0.1"]


def test_every_endpoint_is_in_the_openapi_document(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        paths = set(c.get("/openapi.json").json()["paths"])
        assert c.get("/docs").status_code == 200
    assert paths >= {
        "/api/composition/execute", "/api/composition/validate",
        "/api/composition/status/{execution_id}", "/api/v1/compositions/templates",
        "/api/v1/compositions/templates/{template_id}", "/api/v1/compositions/execute",
        "/api/v1/compositions/validate", "/api/v1/runs", "/api/v1/runs/{run_id}",
        "/api/v1/runs/{run_id}/events", "/api/v1/runs/{run_id}/approve/{step_id}",
        "/api/v1/runs/{run_id}/reject/{step_id}", "/api/v1/runs/{run_id}/cancel",
        "/api/v1/runs/{run_id}/retry", "/api/v1/runs/{run_id}/compensate",
        "/api/v1/runs/{run_id}/graph", "/api/v1/runs/{run_id}/verify", "/api/v1/report",
        "/api/v1/health", "/api/v1/events", "/api/v1/runs/{run_id}/signals/{name}",
        "/api/v1/schedules"}


def test_cancel_retry_and_compensate(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        failing = {"name": "flaky", "steps": [
            {"id": "a", "tool": "echo", "args": {"x": 1},
             "compensate": {"tool": "echo", "args": {"undo": 1}}},
            {"id": "b", "tool": "fail", "args": {"message": "down"}}],
            "error_handling": {"rollback_on_failure": False}}
        run_id = c.post("/api/v1/runs", json={"composition": failing}).json()["run_id"]
        assert sqlite_server.wait_for(c, run_id)["status"] == "failed"
        assert c.post(f"/api/v1/runs/{run_id}/retry", json={"reason": "outage over"}
                      ).status_code == 200
        retried = sqlite_server.wait_for(c, run_id, lambda r: r["steps"]["b"]["attempt"] > 1
                                         and r["status"] == "failed")
        assert retried["steps"]["a"]["attempt"] == 1  # completed work kept
        assert c.post(f"/api/v1/runs/{run_id}/compensate").status_code == 200
        undone = sqlite_server.wait_for(c, run_id, lambda r: r["steps"]["a"]["status"]
                                        == "compensated")
        assert undone["steps"]["a"]["status"] == "compensated"
        waiting = {"name": "nap", "steps": [{"id": "nap", "sleep": 60}]}
        nap = c.post("/api/v1/runs", json={"composition": waiting}).json()["run_id"]
        sqlite_server.wait_for(c, nap, lambda r: r["status"] == "waiting")
        assert c.post(f"/api/v1/runs/{nap}/cancel").status_code == 200
        assert sqlite_server.wait_for(c, nap)["status"] == "cancelled"
        assert c.post(f"/api/v1/runs/{nap}/cancel").status_code == 409


def test_schedules_over_http(sqlite_server: Server) -> None:
    with sqlite_server.client() as c:
        added = c.post("/api/v1/schedules", json={"name": "tick", "template": "quickstart",
                                                  "every": "1h"})
        assert added.status_code == 201, added.text
        assert [s["name"] for s in c.get("/api/v1/schedules").json()] == ["tick"]
        assert c.post("/api/v1/schedules/tick/pause").json()["paused"] is True
        assert c.post("/api/v1/schedules/tick/resume").json()["paused"] is False
        assert c.delete("/api/v1/schedules/tick").status_code == 204
        assert c.get("/api/v1/schedules").json() == []


def test_the_documented_curl_examples_work_when_pasted(sqlite_server: Server) -> None:
    section = (ROOT / "docs" / "howto" / "service.md").read_text(encoding="utf-8")
    posts = [b for b in re.findall(r"```console\n(.*?)```", section, re.S)
             if "curl -s -X POST" in b]
    assert len(posts) == 2
    answers = []
    for block in posts:
        command = block.replace("http://127.0.0.1:8080", sqlite_server.url)
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                              timeout=60, cwd=sqlite_server.settings.home.parent)
        assert done.returncode == 0, done.stderr
        answers.append(json.loads(done.stdout))
    assert answers[0]["status"] == "completed"
    assert answers[0]["results"]["process"] == {"algorithm": "sentiment",
                                                "url": "https://api.example.com"}
    assert answers[1]["success"] is False and answers[1]["status"] == "compensated"


def test_seed_000_execute_undoes_every_step_it_built(settings: Settings,
                                                     tmp_path: Path) -> None:
    """Seed 000 builds each dependent step's parameters as one whole-value template (its
    inputs merged with its dependencies' outputs): it is undone by its tool's own
    compensation all the same, not only the root step (issue 38)."""
    config = tmp_path / "saga.toml"
    config.write_text(f"[file]\nroot = {json.dumps(str(tmp_path))}\n", encoding="utf-8")
    files = {name: tmp_path / f"{name}.txt" for name in ("root", "left", "right")}

    def write(name: str) -> dict[str, Any]:
        return {"action": "write", "path": str(files[name]), "content": name}
    body = {"workflow_id": "undo-all", "agent_id": "agent-7", "steps": [
        {"step_id": "root", "skill_id": "file", "inputs": write("root"), "dependencies": []},
        {"step_id": "prep", "skill_id": "echo", "inputs": {}, "dependencies": []},
        {"step_id": "left", "skill_id": "file", "inputs": write("left"),
         "dependencies": ["prep"]},
        {"step_id": "right", "skill_id": "file", "inputs": write("right"),
         "dependencies": ["prep"]},
        {"step_id": "publish", "skill_id": "effect", "inputs": {"fail": True},
         "dependencies": ["left", "right", "root"]}]}
    server = Server(settings, store_env(settings, SAGA_CONFIG=str(config))).start()
    try:
        with server.client() as c:
            answer = c.post("/api/composition/execute", json=body)
            assert answer.status_code == 200, answer.text
            result = answer.json()
            status = c.get(f"/api/v1/runs/{result['execution_id']}").json()
    finally:
        server.stop()
    assert result["status"] == "compensated", result["error"]
    assert sorted(result["rollback_steps"]) == ["left", "right", "root"]
    assert [name for name, path in files.items() if path.exists()] == []
    assert status["not_undone"] == ["prep"]  # echo: nothing to undo, and said so
