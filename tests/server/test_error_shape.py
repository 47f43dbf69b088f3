"""Every HTTP error has one shape, ``{error, detail}``, FastAPI's own 404, 405 and 422
included; an unauthenticated answer names no path on the host; and a composition sent
without a name gets one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from saga.config import Settings
from saga.server.app import create_app
from saga.server.service import Tokens


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings, worker=False), base_url="http://127.0.0.1") as c:
        yield c


def _shape(answer: object, status: int, code: int, error: str) -> dict[str, object]:
    assert code == status, answer
    assert isinstance(answer, dict) and {"error", "detail"} <= set(answer), answer
    assert answer["error"] == error, answer
    assert isinstance(answer["detail"], str) and answer["detail"], answer
    return answer


def test_every_error_is_error_and_detail(client: TestClient) -> None:
    r = client.get("/api/v1/no-such-thing")
    _shape(r.json(), 404, r.status_code, "NotFound")
    r = client.delete("/api/v1/health")
    _shape(r.json(), 405, r.status_code, "MethodNotAllowed")
    assert "GET" in r.headers["allow"]
    r = client.post("/api/v1/runs", json={"inputs": "not an object", "bogus": 1})
    answer = _shape(r.json(), 422, r.status_code, "InputError")
    assert {p["path"] for p in answer["problems"]} >= {"body.bogus"}, answer  # type: ignore[union-attr]
    r = client.get("/api/v1/runs", params={"limit": "many"})
    _shape(r.json(), 422, r.status_code, "InputError")
    r = client.get("/api/v1/runs", params={"status": "bogus"})  # not an empty list
    assert "unknown status 'bogus'" in _shape(r.json(), 422, r.status_code,
                                              "InputError")["detail"]  # type: ignore[operator]
    r = client.get("/api/v1/runs/NO-SUCH-RUN")  # a saga error, as before
    _shape(r.json(), 404, r.status_code, "RunNotFoundError")
    r = client.get("/static/nothing.js")
    _shape(r.json(), 404, r.status_code, "NotFound")


def test_unauthenticated_answers_name_no_path(settings: Settings) -> None:
    app = create_app(settings, worker=False, tokens=Tokens(write="secret-admin-token"))
    with TestClient(app, base_url="http://127.0.0.1") as anonymous:
        health = anonymous.get("/api/v1/health")
        assert health.status_code == 200
        body = health.json()
        assert body["store"] == ("postgresql" if settings.is_postgres else "sqlite")
        assert str(settings.home) not in health.text and "/" not in body["store"]
        denied = anonymous.get("/api/v1/runs")
        _shape(denied.json(), 401, denied.status_code, "Unauthorized")
        assert denied.headers["www-authenticate"] == "Bearer"


def test_a_composition_without_a_name_gets_one(client: TestClient) -> None:
    steps = [{"id": "a", "tool": "echo", "args": {"x": 1}}]
    first = client.post("/api/v1/compositions/execute", json={"composition": {"steps": steps}})
    assert first.status_code == 200, first.text
    again = client.post("/api/v1/compositions/execute", json={"composition": {"steps": steps}})
    names = {client.get(f"/api/v1/runs/{r.json()['run_id']}").json()["name"]
             for r in (first, again)}
    assert len(names) == 1 and next(iter(names)).startswith("composition-"), names
    started = client.post("/api/v1/runs", json={"composition": {"steps": steps}})
    assert started.status_code in (200, 201, 202), started.text
    assert client.get(f"/api/v1/runs/{started.json()['run_id']}").json()["name"] == \
        next(iter(names))
