"""The deployment recipes in ops/deploy/: the image installs every service extra, and
compose.yaml starts PostgreSQL, one worker and saga serve with commands saga takes.
(No image is built or pulled here: the compose file is read and checked as data.)"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import click
import yaml

from saga.cli import main

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "ops" / "deploy"
#: Extras that are not a service's: building the docs, developing saga.
NOT_SERVICE = {"docs", "dev"}


def _instructions() -> list[tuple[str, str]]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / "Dockerfile").read_text(encoding="utf-8"))
    rows = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0], line.split(None, 1)[1]) for line in rows
            if line and not line.startswith("#")]


def test_the_image_installs_every_service_extra() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))[
        "project"]["optional-dependencies"]
    installs = [args for kind, args in _instructions()
                if kind == "RUN" and "pip install" in args]
    assert len(installs) == 1, installs
    given = re.search(r"saga-\*\.whl\)\[([a-z,]+)\]", installs[0])
    assert given is not None, installs[0]
    assert set(given.group(1).split(",")) == set(extras) - NOT_SERVICE
    entry = dict(_instructions())
    assert yaml.safe_load(entry["ENTRYPOINT"]) == ["saga"]
    assert yaml.safe_load(entry["CMD"])[0] == "worker"
    assert entry["USER"] == "saga"


def _command(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _parses(args: list[str]) -> None:
    """``saga ARGS`` is a command line saga takes (its command exists, its options exist
    and fit); nothing runs."""
    ctx = click.Context(main, info_name="saga")
    command: click.Command | None = main.get_command(ctx, args[0])
    rest = args[1:]
    assert command is not None, args
    if isinstance(command, click.Group):
        command = command.get_command(ctx, rest[0])
        assert command is not None, args
        rest = rest[1:]
    command.make_context(args[0], list(rest), parent=ctx)


def test_compose_starts_postgres_one_worker_and_the_service() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    services = compose["services"]
    assert {"db", "worker", "serve"} <= set(services)
    assert str(services["db"]["image"]).startswith("postgres:")
    assert "healthcheck" in services["db"]
    images = {services[name]["image"] for name in services if name != "db"}
    assert images == {"saga"}
    for name, service in services.items():
        if name == "db":
            continue
        build = service["build"]
        assert (DEPLOY / "compose.yaml").parent.joinpath(build["context"], build["dockerfile"]) \
            .resolve() == DEPLOY / "Dockerfile"
        url = service["environment"]["SAGA_DATABASE_URL"]
        assert url.startswith("postgresql://") and "@db:5432/" in url, url
        _parses(_command(service))
        depends = service.get("depends_on", {})
        assert depends and all("condition" in c for c in depends.values()), name
    assert _command(services["worker"])[0] == "worker"
    assert services["worker"].get("deploy", {}).get("replicas", 1) == 1
    serve = _command(services["serve"])
    assert serve[0] == "serve" and "--no-worker" in serve
    # beyond loopback saga serve needs a token: compose refuses to start without one
    assert serve[serve.index("--host") + 1] == "0.0.0.0"
    assert services["serve"]["environment"]["SAGA_API_TOKEN"].startswith("${SAGA_API_TOKEN:?")
    port = serve[serve.index("--port") + 1]
    assert any(str(p).endswith(f":{port}") for p in services["serve"]["ports"])
    assert _command(services["init"]) == ["db", "init"]
