"""The read model from the command line: list catches up, run and rebuild agree."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from click.testing import CliRunner

from saga.cli import main

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = str(ROOT / "saga" / "templates" / "quickstart.yaml")


def cli(args: list[str], home: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, args, env={"SAGA_HOME": str(home), "SAGA_ACTOR": "rm"})
    return result.exit_code, result.output


def rows(home: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(home / "saga.db") as conn:
        return sorted(conn.execute("SELECT * FROM saga_runs").fetchall()) + sorted(
            conn.execute("SELECT * FROM saga_steps").fetchall())


def test_list_reads_the_caught_up_read_model_and_rebuild_agrees(tmp_path: Path) -> None:
    home = tmp_path / ".saga"
    assert cli(["run", TEMPLATE], home)[0] == 0
    assert cli(["run", TEMPLATE, "--input", "fail_at=charge"], home)[0] == 1
    code, out = cli(["list", "--json"], home)
    assert code == 0
    listed = json.loads(out)
    assert [r["status"] for r in listed] == ["compensated", "completed"]
    assert listed[0]["failed_step"] == "charge_declined"
    assert listed[0]["error"]["message"] == "card declined"
    assert listed[1]["actor"] == "rm" and listed[1]["duration_ms"] >= 0
    code, out = cli(["list", "--status", "completed", "--json"], home)
    assert [r["run_id"] for r in json.loads(out)] == [listed[1]["run_id"]]
    before = rows(home)
    assert len(before) == 2 + 5 + 3  # two runs, their steps
    code, out = cli(["projection", "rebuild"], home)
    assert code == 0 and "rebuilt from" in out
    assert rows(home) == before
    code, out = cli(["projection", "run"], home)
    assert code == 0 and "applied 0 events" in out
