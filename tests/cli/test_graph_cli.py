"""Dry runs and drawings of compositions and runs."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from saga.cli import main

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = str(ROOT / "saga" / "templates" / "quickstart.yaml")


def cli(args: list[str], home: Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, args, env={"SAGA_HOME": str(home)})
    return result.exit_code, result.output


def test_dry_run_shows_the_plan_and_records_nothing(tmp_path: Path) -> None:
    code, out = cli(["run", TEMPLATE, "--dry-run", "--json", "-i", "order_id=B-7"], tmp_path)
    assert code == 0, out
    preview = json.loads(out)
    assert preview["levels"][0] == ["reserve"]
    reserve = preview["steps"][0]
    assert reserve["parameters"] == {"order": "B-7", "reservation": "R-B-7"}
    assert reserve["compensate"] is True
    confirm = next(s for s in preview["steps"] if s["id"] == "confirm")
    assert confirm["compute"] is True
    assert cli(["list", "--json"], tmp_path) == (0, "[]\n")
    code, out = cli(["run", TEMPLATE, "--dry-run", "-i", "fail_at=nope"], tmp_path)
    assert code == 2 and "must be one of" in out


def test_graph_of_a_file_and_of_a_run(tmp_path: Path) -> None:
    code, out = cli(["graph", TEMPLATE], tmp_path)
    assert code == 0
    assert out.startswith("flowchart TD")
    assert 'n0["reserve: echo"]' in out and "n3 --> n4" in out
    # conditions on their edges, undo boxes chained in rollback order
    assert '''n0 -->|"when inputs.fail_at != 'charge'"| n1''' in out
    assert 'u0(["undo reserve: echo"])' in out and "u1 -.->|then| u0" in out
    assert cli(["graph", "quickstart"], tmp_path) == (0, out)  # a template by name
    code, out = cli(["run", TEMPLATE, "--json", "-i", "fail_at=ship"], tmp_path)
    run_id = json.loads(out)["run_id"]
    code, out = cli(["graph", run_id, "--format", "dot"], tmp_path)
    assert code == 0 and out.startswith("digraph saga {")
    assert '"reserve" [label="reserve: echo\\ncompensated"' in out
    assert '"ship" [label="ship: fail\\nfailed", fillcolor="#f4a3a3"]' in out
    assert '"reserve" -> "charge" [label="when inputs.fail_at != \'charge\'"];' in out
    assert '"charge~undo" -> "reserve~undo"' in out
    code, out = cli(["graph", run_id], tmp_path)
    assert "classDef compensated" in out and "class n0,n1 compensated" in out


def test_graph_form_edges_carry_their_conditions_and_loops(tmp_path: Path) -> None:
    debug = ROOT / "tests" / "seeds" / "004_debug_loop.yaml"
    args = ["--tools", "tests.standins.graph_standins"]
    code, out = cli(["graph", str(debug), *args], tmp_path)
    assert code == 0, out
    assert '''n3 -->|"branch_outcome == 'on_true'"| n4''' in out
    assert '''n3 -.->|"loop if branch_outcome == 'on_false'"| n0''' in out
    code, out = cli(["graph", str(debug), "--format", "dot", *args], tmp_path)
    assert '''"check" -> "analyze" [style=dotted, label="loop if branch_outcome == ''' in out
