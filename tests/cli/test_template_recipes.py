"""Every built-in template's recipe works as a newcomer would paste it: in a new empty
folder, the ``setup`` commands ``saga templates show NAME --json`` gives, then its
``example``, run by a shell with the installed ``saga`` on PATH, complete."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from saga.composition.library import TEMPLATES_DIR

NAMES = sorted(p.stem for p in TEMPLATES_DIR.glob("*.yaml"))
BIN = str(Path(sys.executable).parent)


def _env(home: Path) -> dict[str, str]:
    """A newcomer's environment: no SAGA_ settings, the installed saga first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGA_", "OTEL_"))}
    env.update(PATH=BIN + os.pathsep + env.get("PATH", ""), HOME=str(home),
               GIT_CONFIG_NOSYSTEM="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _shell(script: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    """Run ``script`` with bash in its own process group (a setup may start a server in
    the background: it is ended with the group), output to a file, not a pipe a
    background process would hold open."""
    log = cwd.parent / f"{cwd.name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(["bash", "-c", script], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=180)
        finally:
            with contextlib.suppress(ProcessLookupError):  # the group ended already
                os.killpg(proc.pid, signal.SIGTERM)
    return code, log.read_text(errors="replace")


@pytest.mark.parametrize("name", NAMES)
def test_setup_then_example_completes_in_an_empty_folder(name: str, tmp_path: Path) -> None:
    env = _env(tmp_path)
    shown = subprocess.run(["saga", "templates", "show", name, "--json"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=True)
    info = json.loads(shown.stdout)
    assert info["example"].startswith(f"saga templates run {name}"), info["example"]
    assert isinstance(info["setup"], list)
    text = subprocess.run(["saga", "templates", "show", name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, check=True).stdout
    assert "example: " + info["example"] in text
    assert all(command in text for command in info["setup"])

    folder = tmp_path / "new"
    folder.mkdir()
    script = "\n".join(["set -e", *info["setup"], info["example"] + " --json"])
    code, output = _shell(script, folder, env)
    assert code == 0, output
    result = json.loads(output[output.index("{"):])
    assert result["status"] in ("completed", "waiting"), output
    # saga's own folder never shows as a change in a repository it runs in
    assert (folder / ".saga" / ".gitignore").read_text().splitlines()[-1] == "*"
    if (folder / ".git").is_dir():
        status = subprocess.run(["git", "status", "--porcelain", "--ignored=no"],
                                cwd=folder, env=env, capture_output=True, text=True)
        assert ".saga" not in status.stdout


def test_a_template_error_names_the_template_not_its_path(tmp_path: Path) -> None:
    env = _env(tmp_path)
    done = subprocess.run(["saga", "validate", "money-transfer"], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert "template 'money-transfer' is invalid" in done.stderr
    assert str(TEMPLATES_DIR) not in done.stderr and "site-packages" not in done.stderr
    # and where to find what it lacks
    assert done.stderr.splitlines()[-1] == \
        "  its setup (the saga.toml it needs): saga templates show money-transfer"
