"""Issue 40: migrate a run in flight when replay proves it safe, reset a run to a step,
change a run's labels as it runs. Each is done by a new process (the CLI) on what another
wrote, on SQLite and PostgreSQL; ``replay --verify`` and ``audit verify --all`` pass after
each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from saga.api import Saga
from saga.config import Settings
from saga.errors import ConcurrentWriteError, MigrationRefusedError, RunStateError
from saga.executor import revisions as revise
from saga.tools import Registry

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ["--tools", "tests.standins.standins"]

V1 = """
name: order
version: "1"
steps:
  - id: a
    tool: act
    parameters: {value: 1}
    compensate: {tool: undo, parameters: {what: a}}
  - id: b
    tool: act
    parameters: {value: 2}
    compensate: {tool: undo, parameters: {what: b}}
    depends_on: [a]
  - id: c
    tool: act
    parameters: {value: 3}
    compensate: {tool: undo, parameters: {what: c}}
    depends_on: [b]
"""
CONFIRM = "    confirm: ship it?\n"
EXTRA = """  - id: d
    tool: act
    parameters: {value: 4}
    depends_on: [c]
"""


def cli(args: list[str], settings: Settings, calls: Path) -> subprocess.CompletedProcess[str]:
    """``saga ARGS`` in a new process on this store, logging tool calls to ``calls``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_HOME": str(settings.home), "SAGA_ACTOR": "ops", "SAGA_LEASE_SECONDS": "2",
            "SAGA_TEST_CALL_LOG": str(calls), "PYTHONPATH": str(ROOT)}
    if settings.is_postgres:
        env |= {"SAGA_DATABASE_URL": settings.database_url or "",
                "SAGA_DATABASE_SCHEMA": settings.schema or ""}
    return subprocess.run([sys.executable, "-m", "saga.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def logged(calls: Path) -> list[dict[str, Any]]:
    if not calls.exists():
        return []
    return [json.loads(line) for line in calls.read_text().splitlines()]


def verified(run_id: str, settings: Settings, calls: Path) -> None:
    replay = cli(["replay", run_id, "--verify"], settings, calls)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    chain = cli(["audit", "verify", "--all"], settings, calls)
    assert chain.returncode == 0, chain.stdout + chain.stderr


def test_a_waiting_run_migrates_in_a_new_process_and_runs_the_new_step(
        settings: Settings, registry: Registry, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    v1 = tmp_path / "v1.yaml"
    v1.write_text(V1 + CONFIRM)
    v2 = tmp_path / "v2.yaml"
    v2.write_text((V1 + CONFIRM).replace('version: "1"', 'version: "2"') + EXTRA)
    bad = tmp_path / "bad.yaml"
    bad.write_text(v2.read_text().replace("{value: 2}", "{value: 22}"))
    with Saga(settings, registry=registry) as s:
        run = s.run(str(v1), run_id="R-mig")
        assert run.status == "waiting"
        version = run.version

    refused = cli(["migrate", "R-mig", "--to", str(bad), *TOOLS], settings, calls)
    assert refused.returncode == MigrationRefusedError.exit_code == 7, refused.stderr
    assert "step b" in refused.stderr and "{'value': 22}" in refused.stderr
    dry = cli(["migrate", "R-mig", "--to", str(v2), "--dry-run", "--json", *TOOLS],
              settings, calls)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["safe"] is True
    assert json.loads(dry.stdout)["migrated"] is False
    with Saga(settings, registry=registry) as s:
        assert s.get("R-mig").version == version  # neither appended anything

    moved = cli(["migrate", "R-mig", "--to", str(v2), "--reason", "add d", "--json", *TOOLS],
                settings, calls)
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["migrated"] is True
    assert cli(["approve", "R-mig", "c"], settings, calls).returncode == 0
    resumed = cli(["resume", "R-mig", "--json", *TOOLS], settings, calls)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert [c["step"] for c in logged(calls)] == ["c", "d"]  # d ran once, on approval
    with Saga(settings, registry=registry) as s:
        run = s.get("R-mig")
        assert run.definition["version"] == "2"
        assert run.migrations[0]["actor"] == "ops"
        assert run.migrations[0]["reason"] == "add d"
        listed = s.list_runs(None, None)[0]
        assert (listed["definition_version"], listed["definition_hash"]) == (
            "2", run.definition_hash)
        assert s.status("R-mig")["migrations"][0]["version"] == "2"
    verified("R-mig", settings, calls)


def test_changing_a_completed_steps_parameters_is_refused_and_changes_nothing(
        sqlite_settings: Settings, registry: Registry, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.yaml"
    v1.write_text(V1 + CONFIRM)
    with Saga(sqlite_settings, registry=registry) as s:
        run = s.run(str(v1), run_id="R-bad")
        changed = s.load(_as_mapping(V1.replace("{value: 1}", "{value: 9}") + CONFIRM))
        with pytest.raises(MigrationRefusedError, match="step a") as refused:
            s.migrate("R-bad", changed)
        assert refused.value.exit_code == 7
        assert s.get("R-bad").version == run.version
        dry = s.migrate("R-bad", s.load(_as_mapping(V1 + CONFIRM + EXTRA)), dry_run=True)
        assert dry.safe and not dry.migrated


def _as_mapping(text: str) -> dict[str, Any]:
    import yaml
    data: dict[str, Any] = yaml.safe_load(text)
    return data


def test_a_write_between_the_check_and_the_append_makes_the_check_run_again(
        sqlite_settings: Settings, registry: Registry, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    v1 = tmp_path / "v1.yaml"
    v1.write_text(V1 + CONFIRM)
    with Saga(sqlite_settings, registry=registry) as s, \
            Saga(sqlite_settings, registry=registry) as other:
        s.run(str(v1), run_id="R-race")
        save = s.app.save_run
        seen: list[int] = []

        def racing_save(run: Any) -> Any:
            seen.append(run.version)
            if len(seen) == 1:  # another writer appends first: the fence refuses ours
                other.label("R-race", {"team": "pay"})
            return save(run)
        monkeypatch.setattr(s.app, "save_run", racing_save)
        check = s.migrate("R-race", s.load(_as_mapping(V1 + CONFIRM + EXTRA)))
        assert check.migrated and len(seen) == 2 and seen[1] == seen[0] + 1
        events = [type(e).__name__ for e in s.events("R-race")]
        assert events[-2:] == ["RunLabelled", "DefinitionMigrated"]
        assert s.verify("R-race") is None
        monkeypatch.setattr(s.app, "save_run", lambda run: (_ for _ in ()).throw(
            ConcurrentWriteError(run.run_id)))
        with pytest.raises(ConcurrentWriteError):
            s.migrate("R-race", s.load(_as_mapping(V1 + CONFIRM)))
        # in bulk, a run that cannot be checked is listed with why; nothing stops
        [check] = s.migrate_all("order", s.load(_as_mapping(V1 + CONFIRM)))
        assert not check.safe and "another writer" in (check.error or "")
        assert "not checked" in check.describe()


def test_reset_to_a_middle_step_undoes_then_reruns_with_new_keys(
        settings: Settings, registry: Registry, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    v1 = tmp_path / "v1.yaml"
    v1.write_text(V1)
    with Saga(settings, registry=registry) as s:
        assert s.run(str(v1), run_id="R-reset").status == "completed"
    calls.unlink(missing_ok=True)
    done = cli(["reset", "R-reset", "--to", "b", "--reason", "card fixed", "--json", *TOOLS],
               settings, calls)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "completed"
    made = [(c["tool"], c["step"], c["key"]) for c in logged(calls)]
    assert made == [("undo", "c", "R-reset:c:0:compensate"),
                    ("undo", "b", "R-reset:b:0:compensate"),
                    ("act", "b", "R-reset:b:0:reset1"), ("act", "c", "R-reset:c:0:reset1")]
    with Saga(settings, registry=registry) as s:
        kinds = [type(e).__name__ for e in s.events("R-reset")]
        reset_at = kinds.index("RunReset")
        assert kinds[reset_at:reset_at + 6] == [
            "RunReset", "StepCompensationStarted", "StepCompensated",
            "StepCompensationStarted", "StepCompensated", "StepsReopened"]
        events = s.events("R-reset")
        event = events[reset_at]
        assert (event.actor, event.reason, event.undo) == ("ops", "card fixed", ["c", "b"])
        assert {e.actor for e in events[reset_at + 1:reset_at + 3]} == {"ops"}  # not tester
        assert events[0].actor == "tester"
        assert s.get("R-reset").steps["a"]["idempotency_key"] == "R-reset:a:0"  # kept
    verified("R-reset", settings, calls)


def test_reset_is_refused_where_it_cannot_apply(sqlite_settings: Settings,
                                                registry: Registry, tmp_path: Path) -> None:
    v1 = tmp_path / "v1.yaml"
    v1.write_text(V1 + CONFIRM)
    with Saga(sqlite_settings, registry=registry) as s:
        run = s.run(str(v1), run_id="R-no")
        with pytest.raises(RunStateError, match="no step 'zz'"):
            s.reset("R-no", "zz")
        with pytest.raises(RunStateError, match="has not run yet"):
            s.reset("R-no", "c")
        assert s.get("R-no").version == run.version
        undo, reopen = revise.reset_plan(s.executor_plan(run), run, "a")
        assert (undo, reopen) == (["b", "a"], ["a", "b"])


def test_labels_change_as_the_run_runs_and_a_new_process_lists_by_them(
        settings: Settings, registry: Registry, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    v1 = tmp_path / "v1.yaml"
    v1.write_text(V1 + CONFIRM)
    with Saga(settings, registry=registry) as s:
        s.run(str(v1), run_id="R-lab", labels={"ticket": "T-1"})
    changed = cli(["label", "R-lab", "team=pay", "ticket="], settings, calls)
    assert changed.returncode == 0, changed.stderr
    assert "team=pay" in changed.stdout and "ticket" not in changed.stdout
    listed = cli(["list", "--label", "team=pay", "--json"], settings, calls)
    assert [r["run_id"] for r in json.loads(listed.stdout)] == ["R-lab"]
    gone = cli(["list", "--label", "ticket=T-1", "--json"], settings, calls)
    assert json.loads(gone.stdout) == []
    for pair, count in (("team=pay", 1), ("ticket=T-1", 0)):  # reports see them too
        report = cli(["report", "--label", pair, "--format", "json"], settings, calls)
        assert report.returncode == 0, report.stderr
        assert len(json.loads(report.stdout)["runs"]) == count, pair
    verified("R-lab", settings, calls)


def test_a_use_target_change_diverges_only_once_the_child_started(
        sqlite_settings: Settings, registry: Registry, tmp_path: Path) -> None:
    for name in ("child1", "child2"):
        (tmp_path / f"{name}.yaml").write_text(
            f"name: {name}\nsteps:\n  - id: x\n    tool: act\n    parameters: {{value: 1}}\n")

    def parent(child: str) -> dict[str, Any]:
        return {"name": "parent", "steps": [
            {"id": "a", "tool": "act", "parameters": {"value": 0}},
            {"id": "n", "use": str(tmp_path / f"{child}.yaml"), "depends_on": ["a"],
             "confirm": "go?"},
            {"id": "z", "tool": "act", "parameters": {"value": 9}, "depends_on": ["n"],
             "confirm": "end?"}]}
    with Saga(sqlite_settings, registry=registry) as s:
        s.run(s.load(parent("child1")), run_id="P")
        assert s.migrate("P", s.load(parent("child2")), dry_run=True).safe  # not started
        s.approve("P", "n")
        assert s.resume("P").pending_approvals == ["z"]  # the child ran
        with pytest.raises(MigrationRefusedError, match=r"step n: .*child2"):
            s.migrate("P", s.load(parent("child2")))
        # A reset that reopens the use: step starts a new child run, which runs again.
        first = s.get("P").steps["n"]["parameters"]["run"]
        s.reset("P", "n", reason="again")
        s.approve("P", "n")
        assert s.resume("P").pending_approvals == ["z"]
        second = s.get("P").steps["n"]["parameters"]["run"]
        assert second != first and s.get(second).status == "completed"
        assert s.get(first).status == "compensated"  # the reset undid the first child
        assert s.verify("P") is None


def test_a_redacted_run_cannot_be_reset_or_migrated(
        sqlite_settings: Settings, registry: Registry, tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    from saga.audit.retention import apply_retention

    v1 = tmp_path / "v1.yaml"
    v1.write_text(V1)
    with Saga(sqlite_settings, registry=registry) as s:
        s.run(str(v1), run_id="R-old")
    later = datetime.now(UTC) + timedelta(days=30)
    assert apply_retention(sqlite_settings, 1, now=later)
    with Saga(sqlite_settings, registry=registry) as s:
        version = s.get("R-old").version
        with pytest.raises(RunStateError, match="redacted"):
            s.reset("R-old", "b")
        with pytest.raises(RunStateError, match="redacted"):
            s.migrate("R-old", s.load(_as_mapping(V1 + EXTRA)))
        assert s.get("R-old").version == version
