"""The test setup is honest about PostgreSQL: without a server its half of the suite is
skipped with the reason, except in CI, where it must run (so it fails)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = "tests/standins/pg_probe.py"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: nothing listens


def run_probe(**env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "CI"}
    full["SAGA_TEST_DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:{closed_port()}/test"
    full.update(env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           PROBE], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=60)


def test_postgres_tests_skip_with_the_reason_when_the_server_is_unreachable() -> None:
    done = run_probe()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed, 3 skipped" in done.stdout, done.stdout
    assert "is unreachable" in done.stdout and "3 PostgreSQL tests skipped" in done.stdout
    assert "test_either_store[postgres]" not in done.stdout.split("short test summary")[0]


def test_in_ci_the_postgres_tests_fail_instead() -> None:
    done = run_probe(CI="true")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed, 3 errors" in done.stdout, done.stdout  # failed in their set-up
    assert "CI runs the PostgreSQL half of the suite" in done.stdout
