"""Audit from the command line: verify, export and verify offline, retention."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from saga.cli import main
from saga.domain import Run

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = str(ROOT / "saga" / "templates" / "quickstart.yaml")


@pytest.fixture(autouse=True)
def _no_key_left_behind() -> None:
    yield
    Run.audit_key = None


def cli(args: list[str], home: Path, **env: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, args, env={"SAGA_HOME": str(home), **env})
    return result.exit_code, result.output


def test_verify_export_and_tamper(tmp_path: Path) -> None:
    home, key = tmp_path / ".saga", {"SAGA_AUDIT_KEY": "k3y"}
    run_id = json.loads(cli(["run", TEMPLATE, "--json"], home, **key)[1])["run_id"]
    other = json.loads(cli(["run", TEMPLATE, "--json", "-i", "fail_at=ship"], home, **key)[1])
    code, out = cli(["audit", "verify", "--all"], home, **key)
    assert code == 0, out
    assert "2 runs checked, 0 broken" in out and "macs verified" in out
    code, exported = cli(["export", run_id], home)
    assert code == 0 and json.loads(exported)["run_id"] == run_id
    (tmp_path / "run.json").write_text(exported)
    code, out = cli(["audit", "verify", "--file", str(tmp_path / "run.json")], home, **key)
    assert code == 0, out
    code, lines = cli(["export", run_id, "--format", "jsonl"], home)
    assert len(lines.splitlines()) == len(json.loads(exported)["events"])
    # Someone with database access but not the key edits a stored output.
    with sqlite3.connect(home / "saga.db") as conn:
        rows = conn.execute("SELECT originator_id, originator_version, state FROM "
                            "stored_events WHERE topic = 'saga.StepCompleted'").fetchall()
        oid, version, state = next(r for r in rows if r[0].replace("-", "") ==
                                   other["run_id"].replace("-", ""))
        data = json.loads(state)
        data["output"] = {"forged": True}
        conn.execute("UPDATE stored_events SET state = ? WHERE originator_id = ? AND "
                     "originator_version = ?", (json.dumps(data).encode(), oid, version))
    code, out = cli(["audit", "verify", "--all", "--json"], home, **key)
    assert code == 1
    report = json.loads(out)
    broken = [r for r in report["runs"] if not r["ok"]]
    assert [(r["run_id"], r["broken_at"], r["reason"]) for r in broken] == [
        (other["run_id"], version, "payload edited")]
    code, out = cli(["audit", "verify", "nope"], home)
    assert code == 4


def stored_states(home: Path) -> list[bytes]:
    with sqlite3.connect(home / "saga.db") as conn:
        return [bytes(s) for (s,) in conn.execute("SELECT state FROM stored_events")]


def test_retention_removes_payloads_and_keeps_the_chain(tmp_path: Path) -> None:
    home = tmp_path / ".saga"
    ran = cli(["run", TEMPLATE, "--json", "-i", "order_id=Z-42"], home)
    run_id = json.loads(ran[1])["run_id"]
    code, out = cli(["retention", "apply", "--older-than", "0", "--dry-run"], home)
    assert code == 0 and f"would redact {run_id}" in out
    assert any(b"Z-42" in s for s in stored_states(home))
    code, out = cli(["retention", "apply", "--older-than", "0"], home)
    assert code == 0 and f"redacted {run_id}" in out
    assert not any(b"Z-42" in s for s in stored_states(home))
    code, out = cli(["audit", "verify", run_id], home)
    assert code == 0 and "redacted" in out
    code, out = cli(["status", run_id, "--json"], home)
    assert code == 0 and json.loads(out)["status"] == "completed"
    code, out = cli(["list", "--json"], home)
    assert [r["run_id"] for r in json.loads(out)] == [run_id]
    code, out = cli(["compensate", run_id], home)
    assert code == 2 and "redacted" in out


def test_report_in_every_format(tmp_path: Path) -> None:
    from saga.report import CSV_COLUMNS

    home = tmp_path / ".saga"
    cli(["run", TEMPLATE], home, SAGA_ACTOR="ana")
    cli(["run", TEMPLATE, "-i", "fail_at=ship"], home, SAGA_ACTOR="ben")
    code, out = cli(["report", "--format", "json"], home)
    assert code == 0, out
    report = json.loads(out)
    assert report["totals"]["completed"] == 1 and report["totals"]["compensated"] == 1
    assert report["summary"]["runs"] == 2 and report["summary"]["failures"] == 1
    code, out = cli(["report", "--format", "csv", "--status", "compensated"], home)
    assert code == 0
    assert out.splitlines()[0] == ",".join(CSV_COLUMNS) and len(out.splitlines()) == 2
    code, out = cli(["report", "--actor", "ben"], home)
    assert code == 0 and out.startswith("#") and "ben" in out and "ana" not in out
    code, out = cli(["report", "--format", "html", "-o", str(tmp_path / "r.html")], home)
    assert code == 0 and (tmp_path / "r.html").read_text().lstrip().startswith("<!DOCTYPE html>")
    code, out = cli(["report", "--since", "yesterday"], home)
    assert code == 2
