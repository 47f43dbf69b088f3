"""The read model (saga.projection) against real runs, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import saga.projection as projection_module
from saga.api import Saga
from saga.config import Settings
from saga.domain import Run
from saga.projection import Projection, snapshot_tables

ROOT = Path(__file__).resolve().parents[2]

RETRY = {"name": "retry", "version": "2", "steps": [
    {"id": "a", "tool": "echo", "parameters": {"x": 1}},
    {"id": "b", "tool": "fail", "parameters": {"message": "flaky", "times": 1},
     "retry_count": 2}]}
COMPENSATE = {"name": "undo", "steps": [
    {"id": "a", "tool": "echo", "compensate": {"tool": "echo", "parameters": {"undo": "a"}}},
    {"id": "b", "tool": "noop", "compensate": {"tool": "echo", "parameters": {"undo": "b"}}},
    {"id": "c", "tool": "noop"},
    {"id": "d", "tool": "fail", "parameters": {"message": "broken"}}]}
FAILED = {"name": "broken", "steps": [
    {"id": "a", "tool": "noop"},
    {"id": "b", "tool": "fail", "parameters": {"message": "no way"}}]}
CONTINUE = {"name": "tolerant", "steps": [
    {"id": "a", "tool": "fail", "parameters": {"message": "ignored"}, "on_error": "continue"},
    {"id": "b", "tool": "noop"}]}
WAITING = {"name": "gated", "steps": [
    {"id": "a", "tool": "noop"},
    {"id": "b", "tool": "noop", "confirm": True}]}
SMALL = {"name": "small", "steps": [
    {"id": "a", "tool": "noop"}, {"id": "b", "tool": "echo", "parameters": {"n": 1}},
    {"id": "c", "tool": "noop"}]}


def _at(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _ms(start: str | None, end: str | None) -> int | None:
    if start is None or end is None:
        return None
    return round((datetime.fromisoformat(end) - datetime.fromisoformat(start))
                 .total_seconds() * 1000)


def assert_rows_match(p: Projection, run: Run) -> None:
    """The projected rows of a run equal what the Run aggregate's fold says."""
    row = next(r for r in p.runs(limit=None) if r["run_id"] == run.run_id)
    assert row["status"] == run.status
    assert row["definition_name"] == run.name
    assert row["definition_version"] == str(run.definition.get("version", "1"))
    assert row["definition_hash"] == run.definition_hash
    assert row["actor"] == run.actor == "tester"
    assert _at(row["started_at"]) == _at(run.started_at)
    assert _at(row["finished_at"]) == _at(run.finished_at)
    assert row["duration_ms"] == _ms(run.started_at, run.finished_at)
    assert row["failed_step"] == run.failed_step
    assert (json.loads(row["error"]) if row["error"] else None) == run.error
    assert row["version"] == run.version
    steps = {(s["step_id"], s["iteration"]): s for s in p.steps(run.run_id)}
    assert set(steps) == {(s["step_id"], s["iteration"]) for s in run.steps.values()}
    for s in run.steps.values():
        got = steps[(s["step_id"], s["iteration"])]
        assert got["status"] == s["status"]
        assert got["attempts"] == (s["attempt"] if s["started_at"] else 0)
        assert _at(got["started_at"]) == _at(s["started_at"])
        assert _at(got["finished_at"]) == _at(s["finished_at"])
        assert got["duration_ms"] == s["duration_ms"]
        assert (json.loads(got["error"]) if got["error"] else None) == s["error"]
        assert _at(got["compensated_at"]) == _at(s.get("compensated_at"))


def make_runs(saga: Saga, *compositions: dict[str, Any]) -> list[Run]:
    return [saga.run(saga.load(c), {}) for c in compositions]


def spy_on_fold(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Record (run id, version) of every event handed to the fold."""
    seen: list[tuple[str, int]] = []
    original = projection_module._Fold.apply

    def apply(self: Any, run_id: str, topic: str, e: Any, waiting: bool = False) -> None:
        seen.append((run_id, e.originator_version))
        original(self, run_id, topic, e, waiting)

    monkeypatch.setattr(projection_module._Fold, "apply", apply)
    return seen


def log_size(saga: Saga) -> int:
    """How many notifications the log holds (ids need not be contiguous: PostgreSQL's
    follow transaction ids)."""
    return len(saga.app.recorder.select_notifications(start=None, limit=1_000_000))


def test_rows_match_the_runs_states(saga: Saga) -> None:
    runs = make_runs(saga, RETRY, COMPENSATE, FAILED, CONTINUE, WAITING)
    assert [r.status for r in runs] == ["completed", "compensated", "failed", "completed",
                                        "waiting"]
    p = Projection(saga.app)
    try:
        assert p.catch_up() == log_size(saga) > 0 and p.position() == p.head()
        for run in runs:
            assert_rows_match(p, run)
        retry, undo, broken, tolerant, gated = ({s["step_id"]: s for s in p.steps(r.run_id)}
                                                for r in runs)
        assert retry["b"]["attempts"] == 2 and retry["b"]["status"] == "completed"
        assert retry["a"]["attempts"] == 1
        assert [undo[k]["status"] for k in "abcd"] == ["compensated", "compensated",
                                                      "completed", "failed"]
        assert undo["a"]["compensated_at"] and undo["b"]["compensated_at"]
        assert undo["c"]["compensated_at"] is None
        assert json.loads(undo["d"]["error"]) == {"type": "ToolError", "message": "broken"}
        assert broken["b"]["status"] == "failed" and tolerant["a"]["status"] == "failed"
        assert set(gated) == {"a"}
        by_id = {r["run_id"]: r for r in p.runs(limit=None)}
        assert by_id[runs[1].run_id]["failed_step"] == "d"
        assert by_id[runs[2].run_id]["failed_step"] == "b"
        assert by_id[runs[0].run_id]["definition_version"] == "2"
        # Queries: newest first, by status, limit, since.
        assert [r["run_id"] for r in p.runs()] == [r.run_id for r in reversed(runs)]
        assert [r["run_id"] for r in p.runs(status="completed")] == [runs[3].run_id,
                                                                    runs[0].run_id]
        assert len(p.runs(limit=2)) == 2
        assert [r["run_id"] for r in p.runs(since=runs[3].started_at)] == [runs[4].run_id,
                                                                          runs[3].run_id]
        # The gated run goes on once approved; the projection follows it.
        saga.approve(gated["a"]["run_id"], "b")
        finished = saga.resume(runs[4].run_id)
        assert p.catch_up() > 0 and finished.status == "completed"
        assert_rows_match(p, finished)
    finally:
        p.close()


def test_run_waits_until_every_pending_approval_is_decided(saga: Saga) -> None:
    both = {"name": "two-gates", "steps": [
        {"id": "x", "tool": "noop", "confirm": True, "depends_on": []},
        {"id": "y", "tool": "noop", "confirm": True, "depends_on": []}]}
    (run,) = make_runs(saga, both)
    p = Projection(saga.app)
    try:
        for step, expected in (("x", "waiting"), ("y", "running")):
            saga.approve(run.run_id, step)
            p.catch_up(page=1)
            assert p.runs()[0]["status"] == saga.get(run.run_id).status == expected
    finally:
        p.close()


def test_stop_and_resume_apply_each_event_exactly_once(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = make_runs(saga, RETRY, COMPENSATE, FAILED, CONTINUE, WAITING, SMALL)
    seen = spy_on_fold(monkeypatch)
    head, total = Projection(saga.app).head(), log_size(saga)
    chunks, pages, done, i = [1, 2, 3, 5, 8, 13], [1, 2, 4, 500], 0, 0
    while done < total:
        p = Projection(saga.app)  # a new process each time, as after a stop
        try:
            before = p.position()
            k = chunks[i % len(chunks)]
            n = p.catch_up(limit=k, page=pages[i % len(pages)])
            assert 0 < n <= k and p.position() > before
            done, i = done + n, i + 1
            resumed = snapshot_tables(p)
        finally:
            p.close()
    assert done == total and i > 5
    assert len(seen) == len(set(seen)) == total  # every event folded once, none twice
    p = Projection(saga.app)
    try:
        assert p.position() == head and p.catch_up() == 0
        for run in runs:
            assert_rows_match(p, run)
        seen.clear()
        assert p.rebuild() == total
        assert len(seen) == total
        assert snapshot_tables(p) == resumed
    finally:
        p.close()


def test_concurrent_projectors_never_double_apply(
        saga: Saga, monkeypatch: pytest.MonkeyPatch) -> None:
    make_runs(saga, SMALL, SMALL, SMALL, FAILED)
    seen = spy_on_fold(monkeypatch)
    projections = [Projection(saga.app) for _ in range(3)]
    try:
        with ThreadPoolExecutor(3) as pool:  # create_tables races too
            list(pool.map(lambda q: q.create_tables(), projections))
            counts = list(pool.map(lambda q: q.catch_up(page=2), projections))
        total = log_size(saga)
        assert sum(counts) == total and len(seen) == len(set(seen)) == total
        together = snapshot_tables(projections[0])
        assert projections[1].rebuild() == total and snapshot_tables(projections[2]) == together
    finally:
        for q in projections:
            q.close()


def test_rebuild_gives_identical_rows(saga: Saga) -> None:
    make_runs(saga, RETRY, COMPENSATE, SMALL)
    p = Projection(saga.app)
    try:
        p.catch_up()
        before = snapshot_tables(p)
        with p._db.tx() as cur:  # damage the read model by hand
            cur.execute("UPDATE saga_runs SET status = 'bogus', version = 999")
            cur.execute("DELETE FROM saga_steps WHERE step_id = 'a'")
        assert snapshot_tables(p) != before
        assert p.rebuild() == log_size(saga) and p.head() == p.position()
        assert snapshot_tables(p) == before
        assert p.rebuild() == log_size(saga) and snapshot_tables(p) == before
    finally:
        p.close()


def test_head_position_and_lag(saga: Saga) -> None:
    p = Projection(saga.app)
    try:
        assert (p.head(), p.position(), p.catch_up()) == (0, 0, 0)
        make_runs(saga, SMALL, RETRY)
        ids = [n.id for n in saga.app.recorder.select_notifications(start=1, limit=1000)]
        assert p.head() == ids[-1] and p.position() == 0 and p.lag() == len(ids)
        assert p.catch_up(limit=3) == 3 and p.position() == ids[2]
        assert p.lag() == len(ids) - 3 > 0
        assert p.catch_up() == len(ids) - 3 and p.position() == p.head() and p.lag() == 0
        make_runs(saga, SMALL)
        more = log_size(saga) - len(ids)
        assert p.head() > p.position() == ids[-1] and p.lag() == more > 0
        assert p.catch_up() == more and p.position() == p.head()
        assert p.catch_up() == 0
    finally:
        p.close()


CHILD = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from saga.store.application import SagaApplication
    from saga.config import Settings
    from saga.projection import Projection

    cfg = json.loads(sys.argv[1])
    DELAY, PAGE = float(os.environ["PROJ_DELAY"]), int(os.environ["PROJ_PAGE"])
    LOG = Path(os.environ["PROJ_LOG"])

    class Slow(Projection):
        def catch_up(self, limit=None, page=500):
            return super().catch_up(limit, page=PAGE)

        def _write(self, cur, fold):
            super()._write(cur, fold)
            time.sleep(DELAY)  # inside the page's transaction, before its commit

        def _apply_page(self, position, notes):
            ok = super()._apply_page(position, notes)
            if ok:  # after the commit: a re-applied page would log its ids twice
                with LOG.open("a") as f:
                    f.write("".join(f"{n.id}\\n" for n in notes))
            return ok

    app = SagaApplication(Settings(home=Path(cfg["home"]), database_url=cfg["url"],
                                   schema=cfg["schema"], pool_size=1, max_overflow=1))
    p = Slow(app)
    p.follow(poll_interval=0.01, stop=lambda: p.position() >= p.head())
    p.close()
    app.close()
""")


def _start_child(settings: Settings, script: Path, log: Path, delay: float) -> subprocess.Popen:
    cfg = {"home": str(settings.home), "url": settings.database_url, "schema": settings.schema}
    env = {**os.environ, "PROJ_DELAY": str(delay), "PROJ_PAGE": "2", "PROJ_LOG": str(log),
           "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(script), json.dumps(cfg)], cwd=ROOT, env=env)


def test_sigkill_mid_way_then_resume_equals_rebuild(saga: Saga, tmp_path: Path) -> None:
    runs = make_runs(saga, *[SMALL] * 40)
    script, log = tmp_path / "follow.py", tmp_path / "applied.log"
    script.write_text(CHILD)
    monitor = Projection(saga.app)
    try:
        monitor.create_tables()
        head, total = monitor.head(), log_size(saga)
        ids = [n.id for n in saga.app.recorder.select_notifications(start=None, limit=total)]
        assert total >= 40 * 8
        child = _start_child(saga.settings, script, log, delay=0.02)
        try:
            deadline = time.monotonic() + 30
            while monitor.position() < ids[total // 4] and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            child.kill()  # SIGKILL: no cleanup, quite likely inside a page's transaction
            child.wait(10)
        assert child.returncode == -9
        killed_at = monitor.position()
        assert 0 < killed_at < head
        child = _start_child(saga.settings, script, log, delay=0)
        assert child.wait(60) == 0
        assert monitor.position() == head
        applied = [int(line) for line in log.read_text().split()]
        assert len(applied) == len(set(applied))  # no page committed twice
        assert len(applied) >= total - 2  # at most one page lost between commit and log
        resumed = snapshot_tables(monitor)
        assert len(resumed[0]) == 40 and len(resumed[1]) == 120
        assert {r["status"] for r in monitor.runs(limit=None)} == {"completed"}
        assert monitor.rebuild() == total
        assert snapshot_tables(monitor) == resumed
        assert_rows_match(monitor, runs[0])
    finally:
        monitor.close()


@pytest.mark.doctored
def test_an_unreadable_start_costs_one_run_not_the_list_or_the_report(
        sqlite_settings: Settings, tmp_path: Path) -> None:
    """One event the read model cannot read is reported and skipped, with the rest of its
    run: `saga list` (text and JSON) and `saga report` still show every other run."""
    from click.testing import CliRunner

    from saga.cli import main
    from saga.report import build_report

    with Saga(sqlite_settings, tools=["tests.standins.standins"]) as s:
        plan = s.load({"name": "t", "steps": [{"id": "a", "tool": "echo"}]})
        broken, kept = s.run(plan).run_id, s.run(plan).run_id
        db = sqlite_settings.home / "saga.db"
    import sqlite3

    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE stored_events SET state = ? WHERE originator_id = ? AND "
                     "originator_version = 1", (b"{not json", broken.replace("-", "")))
        assert conn.total_changes == 1
    with Saga(sqlite_settings) as s:
        assert [r["run_id"] for r in s.list_runs()] == [kept]
        assert build_report(s).runs[0]["run_id"] == kept
    env = {"SAGA_HOME": str(sqlite_settings.home)}
    for args in (["list"], ["list", "--json"], ["report"]):
        result = CliRunner().invoke(main, args, env=env)
        assert result.exit_code == 0, (args, result.output)
        assert kept[:8] in result.output
