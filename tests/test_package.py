"""The package's public surface and what importing it costs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
    assert codes["RunIdConflictError"] == 6
    assert all(isinstance(code, int) and 1 <= code <= 6 for code in codes.values())


def test_the_wheel_ships_templates_license_and_types(tmp_path: Path) -> None:
    """Built and installed as a user would get it, run from an empty folder: the templates
    come with it (``saga templates list``), and a template runs by name."""
    import zipfile

    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                            str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("saga-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "saga/py.typed" in names and any(n.endswith("licenses/LICENSE") for n in names)
    site = tmp_path / "site"
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                                "--target", str(site), str(wheel)], capture_output=True,
                               text=True)
    assert installed.returncode == 0, installed.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "SAGA_HOME": str(empty / ".saga")}
    env.pop("SAGA_DATABASE_URL", None)

    def saga(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "saga", *args], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=120)

    where = subprocess.run([sys.executable, "-c", "import saga; print(saga.__file__)"],
                           cwd=empty, env=env, capture_output=True, text=True)
    assert where.stdout.startswith(str(site)), where.stdout  # the wheel, not the checkout
    listed = saga("templates", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) >= 10
    ran = saga("run", "quickstart", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"
