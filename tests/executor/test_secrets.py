"""Secrets come from an allowlist; saga's own settings are never readable."""

from __future__ import annotations

from dataclasses import replace

import pytest

from saga import Saga
from saga.config import Settings
from saga.errors import DefinitionError
from saga.tools import Registry


def echo_secret(name: str) -> dict:
    return {"name": "s", "steps": [{"id": "leak", "tool": "echo",
                                    "parameters": {"v": "{{ secret." + name + " }}"}}]}


@pytest.mark.parametrize("name", ["SAGA_AUDIT_KEY", "SAGA_DATABASE_URL", "saga_api_token"])
def test_sagas_own_settings_are_refused_at_validation(lite: Saga, name: str) -> None:
    with pytest.raises(DefinitionError, match="saga's own settings"):
        lite.load(echo_secret(name))


def test_only_saga_secret_variables_and_declared_names_are_readable(
        sqlite_settings: Settings, registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME_TOKEN", "plain-env-value")
    monkeypatch.setenv("SAGA_SECRET_API", "via-prefix")
    monkeypatch.setenv("SAGA_SECRET_LOWER", "upper-cased-name")
    with Saga(sqlite_settings, registry=registry) as s:
        undeclared = s.run(s.load(echo_secret("HOME_TOKEN")))
        assert undeclared.status == "failed"
        assert undeclared.steps["leak"]["error"]["type"] == "SecretMissing"
        assert s.run(s.load(echo_secret("API"))).status == "completed"
        assert s.run(s.load(echo_secret("lower"))).status == "completed"
    allowed = replace(sqlite_settings, secrets_allow=("HOME_TOKEN",))
    with Saga(allowed, registry=registry) as s:
        run = s.run(s.load(echo_secret("HOME_TOKEN")))
        assert run.status == "completed"
        assert run.outputs["leak"] == {"v": "«secret:HOME_TOKEN»"}  # never the value
