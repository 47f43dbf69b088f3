"""The template library from the command line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from saga.cli import main


def cli(args: list[str], home: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, args, env={"SAGA_HOME": str(home)})
    return result.exit_code, result.output


def test_list_show_and_run_templates_with_their_statistics(tmp_path: Path) -> None:
    code, out = cli(["templates", "list", "--json"], tmp_path)
    assert code == 0
    names = {t["name"] for t in json.loads(out)}
    assert len(names) >= 11 and {"money-transfer", "release", "file-batch"} <= names
    assert cli(["templates", "run", "quickstart", "--json"], tmp_path)[0] == 0
    assert cli(["templates", "run", "quickstart", "-i", "fail_at=ship"], tmp_path)[0] == 1
    code, out = cli(["templates", "show", "quickstart", "--json"], tmp_path)
    assert code == 0
    stats = json.loads(out)["stats"]
    assert stats["runs"] == 2 and stats["success_rate"] == 0.5
    assert stats["mean_duration_ms"] >= 0
    code, out = cli(["templates", "list"], tmp_path)
    row = next(line for line in out.splitlines() if line.startswith("quickstart"))
    assert " 2 " in row and "50%" in row
    code, out = cli(["templates", "run", "quickstrat"], tmp_path)
    assert code == 2 and "quickstart" in out  # a close match is suggested
