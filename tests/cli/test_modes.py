"""``--mode`` takes any mode name, seen by the run as ``context.mode``; eco keeps its
meaning (enhancement-layer steps are skipped)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from saga.cli import main

MODES = """\
name: modes
steps:
  - id: show
    tool: echo
    parameters: {mode: "{{ context.mode }}"}
  - id: extra
    tool: echo
    layer: enhancement
    parameters: {x: 1}
"""


def run(tmp_path: Path, *args: str) -> tuple[int, str]:
    (tmp_path / "m.yaml").write_text(MODES, encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(tmp_path / "m.yaml"), "--json", *args],
                                env={"SAGA_HOME": str(tmp_path / ".saga")})
    return result.exit_code, result.output


def test_any_mode_name_is_the_runs_context_mode(tmp_path: Path) -> None:
    code, out = run(tmp_path, "--mode", "staging")
    assert code == 0, out
    result = json.loads(out)
    assert result["steps"]["show"]["output"] == {"mode": "staging"}
    assert result["steps"]["extra"]["status"] == "completed"


def test_eco_skips_enhancements(tmp_path: Path) -> None:
    code, out = run(tmp_path, "--mode", "eco")
    assert code == 0, out
    assert json.loads(out)["steps"]["extra"]["status"] == "skipped"


def test_a_mode_is_a_name(tmp_path: Path) -> None:
    code, out = run(tmp_path, "--mode", "bad mode")
    assert code == 2 and "a mode is a name" in out
