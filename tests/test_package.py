"""The package's public surface and what importing it costs."""

from __future__ import annotations

import subprocess
import sys

import saga


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
            "print(sorted(m for m in ('psycopg', 'httpx', 'mcp') if m in sys.modules))")
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
