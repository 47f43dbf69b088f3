"""The package's public surface and what importing it costs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import saga

ROOT = Path(__file__).resolve().parents[1]


def test_the_public_api_is_pinned() -> None:
    # A rename is a deliberate change to this list.
    assert sorted(saga.__all__) == [
        "ConcurrentWriteError", "ConfigError", "DefinitionError", "ExpressionError",
        "InputError", "Problem", "RunNotFoundError", "RunStateError", "Saga", "SagaError",
        "StoreUnavailableError", "Tool", "ToolContext", "ToolError", "UnknownToolError",
        "run_summary", "tool"]
    assert all(hasattr(saga, name) for name in saga.__all__)


def test_importing_saga_loads_no_driver_or_network_client() -> None:
    code = ("import sys, saga, saga.cli; "
            "print(sorted(m for m in ('psycopg', 'httpx', 'mcp', 'opentelemetry', "
            "'prometheus_client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_every_error_has_an_exit_code() -> None:
    from saga import errors

    codes = {name: cls.exit_code for name, cls in vars(errors).items()
             if isinstance(cls, type) and issubclass(cls, errors.SagaError)}
    assert codes["DefinitionError"] == 2 and codes["StoreUnavailableError"] == 3
    assert codes["RunNotFoundError"] == 4 and codes["ConcurrentWriteError"] == 5
    assert codes["RunIdConflictError"] == 6 and codes["MigrationRefusedError"] == 7
    assert all(isinstance(code, int) and 1 <= code <= 7 for code in codes.values())


#: What pip says when it cannot reach the package index (then, outside CI, the wheel test
#: skips: the dependencies cannot be resolved here).
OFFLINE = ("NewConnectionError", "Failed to establish a new connection", "Network is unreachable",
           "Temporary failure in name resolution", "ProxyError", "Could not fetch URL")


def test_the_wheel_installs_into_a_fresh_venv_and_runs(tmp_path: Path) -> None:
    """Built and installed as a user would get it: the wheel into a fresh virtualenv with its
    dependencies resolved by pip (from the package index, or pip's cache), then the
    installed ``saga`` run from an empty folder: the templates come with it, and a template
    runs by name."""
    import zipfile

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True,
                           timeout=120)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("saga-*.whl")
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert "saga/py.typed" in names and any(n.endswith("licenses/LICENSE") for n in names)
    assert sum(n.startswith("saga/templates/") for n in names) >= 10
    assert "saga/tools/demo_mcp.py" in names  # the mcp-tools template's server
    metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    assert b"Project-URL: Homepage, https://" in metadata

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("SAGA_")}  # nothing of the checkout
    installed = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                                "--disable-pip-version-check", str(wheel)], env=env,
                               capture_output=True, text=True, timeout=300)
    if installed.returncode != 0 and not os.environ.get("CI") and any(
            sign in installed.stderr for sign in OFFLINE):
        pytest.skip("pip cannot reach the package index to resolve the wheel's dependencies")
    assert installed.returncode == 0, installed.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    env["SAGA_HOME"] = str(empty / ".saga")

    def saga(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(venv / "bin" / "saga"), *args], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=120)

    where = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import saga; print(saga.__file__)"], cwd=empty, env=env,
                           capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # not the checkout
    listed = saga("templates", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) >= 10
    ran = saga("run", "quickstart", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"
    assert saga("--version").stdout.split()[-1] == saga_version()


def saga_version() -> str:
    import tomllib

    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
