"""A real ``saga serve`` process on loopback per test, over a store of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from saga.config import Settings

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ["--tools", "tests.standins.standins", "--tools", "tests.standins.skills"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def store_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a process using this store (and nothing else of saga's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["SAGA_LEASE_SECONDS"] = "2"
    if settings.is_postgres:
        env["SAGA_DATABASE_URL"] = settings.database_url or ""
        env["SAGA_DATABASE_SCHEMA"] = settings.schema or ""
    # the home holds the token a server makes when it is given none (serve-token)
    env["SAGA_HOME"] = str(settings.home)
    env.update(extra)
    return env


@dataclass
class Server:
    """A running ``saga serve``: its URL, a client, and a way to stop or restart it."""

    settings: Settings
    env: dict[str, str]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[str] | None = None
    args: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "saga", "serve", "--port", str(self.port), *TOOLS,
             *self.args], cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"saga serve exited: {self.proc.stdout.read()}")  # type: ignore[union-attr]
            try:
                if httpx.get(self.url + "/api/v1/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("saga serve did not answer within 30 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    @property
    def token(self) -> str:
        """The server's write token: the one it was given, else the one it made."""
        given = self.env.get("SAGA_API_TOKEN")
        if given:
            return given
        return (self.settings.home / "serve-token").read_text(encoding="utf-8").strip()

    @property
    def auth(self) -> dict[str, str]:
        """The header that carries the server's token."""
        return {"Authorization": f"Bearer {self.token}"}

    def page(self, path: str = "/") -> str:
        """A URL of the viewer that signs the browser in on the way (as the URL that
        ``saga serve`` prints does)."""
        return f"{self.url}{path}{'&' if '?' in path else '?'}token={self.token}"

    def client(self, token: str | None = "", **headers: str) -> httpx.Client:
        """A client with the server's token (``""``), another one, or none (None)."""
        if token == "":
            token = self.token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def wait_for(self, client: httpx.Client, run_id: str,
                 done: Callable[[dict[str, Any]], bool] | None = None,
                 seconds: float = 30) -> dict[str, Any]:
        """The run once ``done`` says so (default: it finished)."""
        done = done or (lambda r: r["status"] in ("completed", "failed", "compensated",
                                                  "cancelled"))
        deadline = time.monotonic() + seconds
        while True:
            run = client.get(f"/api/v1/runs/{run_id}").json()
            if done(run) or time.monotonic() > deadline:
                return dict(run)
            time.sleep(0.1)


@pytest.fixture
def sqlite_server(sqlite_settings: Settings) -> Iterator[Server]:
    server = Server(sqlite_settings, store_env(sqlite_settings)).start()
    yield server
    server.stop()


@pytest.fixture
def any_server(settings: Settings) -> Iterator[Server]:
    """A server over SQLite, then over PostgreSQL."""
    server = Server(settings, store_env(settings)).start()
    yield server
    server.stop()


@pytest.fixture
def make_server(sqlite_settings: Settings) -> Iterator[Callable[..., Server]]:
    """Start servers with extra environment or arguments (stopped afterwards)."""
    started: list[Server] = []

    def make(*args: str, **env: str) -> Server:
        server = Server(sqlite_settings, store_env(sqlite_settings, **env), args=args)
        started.append(server.start())
        return server
    yield make
    for server in started:
        server.stop()
