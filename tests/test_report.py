"""The compliance report on real stores: a period of runs with every outcome and every kind
of human action, checked against figures computed by hand from the recorded events, in
all four formats; the filters; and a doctored run that the report must call BROKEN."""

from __future__ import annotations

import csv
import io
import json
import uuid
from datetime import UTC, date, datetime, timedelta
from html.parser import HTMLParser
from typing import Any

import pytest

from saga import audit
from saga.api import Saga
from saga.config import Settings
from saga.report import CSV_COLUMNS, build_report, nearest_rank, parse_moment, render
from saga.store.side_tables import Database

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
SCRIPT = "<script>alert(1)</script>"


def undo(tag: str) -> dict[str, Any]:
    return {"tool": "echo", "args": {"undo": tag}}


PAY = {"name": "pay", "steps": [
    {"id": "hold", "tool": "echo", "args": {"amount": 10}, "compensate": undo("hold")},
    {"id": "charge", "tool": "fail", "args": {"message": "card declined", "retryable": False},
     "when": "inputs.fail"}]}
ORDERS = {"name": "orders", "steps": [
    {"id": "reserve", "tool": "echo", "args": {"sku": "x"}, "compensate": undo("reserve")},
    {"id": "ship", "tool": "echo", "args": {"to": "home"}, "confirm": True,
     "compensate": undo("ship")}]}
NIGHTLY = {"name": "nightly", "error_handling": {"rollback_on_failure": False}, "steps": [
    {"id": "load", "tool": "noop"},
    {"id": "export", "tool": "fail",
     "args": {"message": "disk full", "retryable": False, "times": "{{ inputs.times }}"}}]}
SHADY = {"name": SCRIPT, "steps": [{"id": "only", "tool": "noop"}]}


def world(saga: Saga) -> dict[str, str]:
    """Twelve runs, in this order, with different actors; name -> run id."""
    pay, orders, nightly = saga.load(PAY), saga.load(ORDERS), saga.load(NIGHTLY)
    ids: dict[str, str] = {}

    def run(name: str, plan: Any, inputs: dict[str, Any], actor: str, expected: str) -> str:
        r = saga.run(plan, inputs, actor=actor)
        assert r.status == expected, (name, r.status, r.error)
        ids[name] = r.run_id
        return r.run_id

    run("done", pay, {"fail": False}, "alice", "completed")
    run("auto", pay, {"fail": True}, "bob", "compensated")
    run("failed", nightly, {"times": 99}, "gail", "failed")
    run("failed2", nightly, {"times": 99}, "gail", "failed")
    rid = run("cancel", orders, {}, "carol", "waiting")
    assert saga.cancel(rid, actor="dana", reason="customer left").status == "cancelled"
    rid = run("approved", orders, {}, "alice", "waiting")
    saga.approve(rid, "ship", actor="erin", comment="ok")
    assert saga.resume(rid).status == "completed"
    rid = run("rejected", orders, {}, "carol", "waiting")
    saga.reject(rid, "ship", actor="erin", comment="not <today>")
    assert saga.resume(rid).status == "compensated"
    rid = run("manual", pay, {"fail": False}, "bob", "completed")
    assert saga.compensate(rid, actor="frank", reason="rollback").status == "compensated"
    rid = run("retried", nightly, {"times": 1}, "gail", "failed")
    assert saga.retry(rid, actor="hank").status == "completed"
    run("waiting", orders, {}, "ivy", "waiting")
    ids["submitted"] = saga.submit(nightly, {"times": 0}, actor="judy").run_id
    run("shady", saga.load(SHADY), {}, "mallory", "completed")
    return ids


def utc(text: str) -> str:
    return datetime.fromisoformat(text).astimezone(UTC).isoformat(timespec="microseconds")


def event_time(saga: Saga, run_id: str, kind: str) -> str:
    return utc(next(e["timestamp"] for e in saga.history(run_id) if e["type"] == kind))


def recorded_ms(saga: Saga, run_id: str) -> int:
    """A finished run's duration, by hand: its last event's time minus its first's."""
    events = saga.history(run_id)
    delta = (datetime.fromisoformat(events[-1]["timestamp"])
             - datetime.fromisoformat(events[0]["timestamp"]))
    return round(delta.total_seconds() * 1000)


class Page(HTMLParser):
    """Collects the text and checks every end tag closes the element opened last."""

    VOID = frozenset({"meta", "br", "hr", "img", "link", "input"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, (tag, self.stack[-3:])
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


# -- the whole report ----------------------------------------------------------------------

def test_the_report_matches_figures_computed_by_hand(saga: Saga) -> None:
    ids = world(saga)
    report = build_report(saga, now=NOW)
    assert report.generated_at == "2026-12-01T09:00:00.000000+00:00"
    assert report.filters == dict.fromkeys(("since", "until", "definition", "actor", "status"))

    # Outcomes: completed = done, approved, retried, shady; compensated = auto, rejected,
    # manual; failed = failed, failed2; and one each cancelled, waiting, running.
    totals = {"completed": 4, "failed": 2, "compensated": 3, "cancelled": 1, "running": 1,
              "waiting": 1, "compensating": 0}
    assert report.totals == totals
    assert [r["run_id"] for r in report.runs] == list(ids.values())  # oldest first
    # Failures: failed, failed2, and auto and rejected (undone because a step failed); not
    # manual (a completed run undone on request), nor retried (it completed in the end).
    # Compensations: auto, cancel, rejected, manual; each undid one step.
    assert {k: report.summary[k] for k in ("runs", "failures", "compensations",
                                           "steps_compensated", "verified_ok", "broken",
                                           "redacted_events", "keyed")} == {
        "runs": 12, "failures": 4, "compensations": 4, "steps_compensated": 4,
        "verified_ok": 12, "broken": 0, "redacted_events": 0, "keyed": False}
    # export failed in failed and failed2 (in retried it completed on the second attempt);
    # charge in auto; ship in rejected (a rejected approval fails the step).
    assert report.failed_steps == [
        {"definition": "nightly", "step_id": "export", "count": 2},
        {"definition": "orders", "step_id": "ship", "count": 1},
        {"definition": "pay", "step_id": "charge", "count": 1}]

    # Durations of the 10 finished runs (not waiting, not submitted). Nearest rank:
    # ceil(0.95 * 10) = 10th of 10 and ceil(0.95 * 3) = 3rd of 3, so p95 is the maximum.
    ms = {name: recorded_ms(saga, rid) for name, rid in ids.items()
          if name not in ("waiting", "submitted")}
    groups = {"pay": ["done", "auto", "manual"], "nightly": ["failed", "failed2", "retried"],
              "orders": ["cancel", "approved", "rejected"], SCRIPT: ["shady"]}
    overall = list(ms.values())
    assert report.durations["overall"] == {"runs": 10, "mean_ms": round(sum(overall) / 10, 1),
                                           "p95_ms": max(overall)}
    assert report.durations["by_definition"] == {
        d: {"runs": len(names), "mean_ms": round(sum(ms[n] for n in names) / len(names), 1),
            "p95_ms": max(ms[n] for n in names)} for d, names in sorted(groups.items())}
    by_id = {r["run_id"]: r for r in report.runs}
    for name, value in ms.items():
        assert by_id[ids[name]]["duration_ms"] == value
    assert by_id[ids["waiting"]]["duration_ms"] is None

    comps = [(c["run_id"], c["trigger"], c["requested_by"], c["reason"], c["compensated"],
              c["at"]) for c in report.compensations]
    assert comps == [
        (ids["auto"], "automatic", "automatic", "step 'charge' failed: card declined",
         ["hold"], event_time(saga, ids["auto"], "CompensationStarted")),
        (ids["cancel"], "cancellation", "dana", "customer left", ["reserve"],
         event_time(saga, ids["cancel"], "CompensationStarted")),
        (ids["rejected"], "automatic", "automatic",
         "step 'ship' failed: rejected by erin: not <today>", ["reserve"],
         event_time(saga, ids["rejected"], "CompensationStarted")),
        (ids["manual"], "requested", "frank", "rollback", ["hold"],
         event_time(saga, ids["manual"], "CompensationStarted"))]

    starters = {"done": "alice", "auto": "bob", "failed": "gail", "failed2": "gail",
                "cancel": "carol", "approved": "alice", "rejected": "carol", "manual": "bob",
                "retried": "gail", "waiting": "ivy", "submitted": "judy", "shady": "mallory"}
    expected = [(event_time(saga, ids[n], "RunStarted"), who, "started", ids[n], None, "")
                for n, who in starters.items()] + [
        (event_time(saga, ids["cancel"], "CompensationStarted"), "dana", "cancelled",
         ids["cancel"], None, "customer left"),
        (event_time(saga, ids["approved"], "ApprovalGranted"), "erin", "approved",
         ids["approved"], "ship", "ok"),
        (event_time(saga, ids["rejected"], "ApprovalRejected"), "erin", "rejected",
         ids["rejected"], "ship", "not <today>"),
        (event_time(saga, ids["manual"], "CompensationStarted"), "frank", "compensated",
         ids["manual"], None, "rollback"),
        (event_time(saga, ids["retried"], "RunRetried"), "hank", "retried", ids["retried"],
         None, "steps export")]
    got = [(a["at"], a["actor"], a["action"], a["run_id"], a["step"], a["detail"])
           for a in report.actions]
    assert got == sorted(expected, key=lambda a: a[0])

    # JSON: the full report, as is.
    data = json.loads(render(report, "json"))
    assert data == report.to_json()
    assert data["totals"] == totals and data["summary"]["failures"] == 4

    # CSV: one row per run, the documented columns.
    rows = list(csv.DictReader(io.StringIO(render(report, "csv"))))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 12
    csv_by_id = {r["run_id"]: r for r in rows}
    statuses = {"done": "completed", "auto": "compensated", "failed": "failed",
                "failed2": "failed", "cancel": "cancelled", "approved": "completed",
                "rejected": "compensated", "manual": "compensated", "retried": "completed",
                "waiting": "waiting", "submitted": "running", "shady": "completed"}
    failed_step = {"auto": "charge", "rejected": "ship", "failed": "export", "failed2": "export"}
    undone = {"auto": "hold", "cancel": "reserve", "rejected": "reserve", "manual": "hold"}
    for name, rid in ids.items():
        row = csv_by_id[rid]
        assert (row["status"], row["actor"], row["failed_step"], row["compensated_steps"],
                row["verified"]) == (statuses[name], starters[name],
                                     failed_step.get(name, ""), undone.get(name, ""), "OK")
        assert row["duration_ms"] == str(ms.get(name, ""))
        assert row["started_at"] == event_time(saga, rid, "RunStarted")
    # a name is never markup in a report, whatever shows it (a browser, a Markdown page)
    assert csv_by_id[ids["shady"]]["definition"] == "&lt;script&gt;alert(1)&lt;/script&gt;"

    mean = report.durations["overall"]["mean_ms"]
    md = render(report, "md")
    assert md.startswith("# Saga compliance report")
    for line in ("| completed | 4 |", "| compensated | 3 |", "| total | 12 |",
                 "| failures | 4 |", "| compensations | 4 |", "| nightly | export | 2 |",
                 f"| all definitions | 10 | {mean} | {max(overall)} |",
                 f"| {ids['manual']} | pay | requested | frank | rollback | hold |",
                 f"| {ids['cancel']} | orders | cancellation | dana | customer left | reserve |",
                 f"| erin | approved | {ids['approved']} | orders | ship | ok |",
                 f"| hank | retried | {ids['retried']} | nightly |"):
        assert line in md, line
    assert "not &lt;today&gt;" in md and "&lt;script&gt;" in md and "<script>" not in md

    page = render(report, "html")
    parser = Page()
    parser.feed(page)
    parser.close()
    assert parser.stack == [] and parser.tags.count("table") == 9
    assert "script" not in parser.tags and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    text = " ".join(parser.text)
    for word in (SCRIPT, "not <today>", "customer left", "dana", "frank", "erin", "hank",
                 "Verification", "nearest-rank", str(mean), ids["shady"]):
        assert word in text, word


# -- filters -------------------------------------------------------------------------------

def picked(saga: Saga, **filters: Any) -> set[str]:
    return {r["run_id"] for r in build_report(saga, now=NOW, **filters).runs}


def test_filters_select_the_runs(saga: Saga) -> None:
    ids = world(saga)
    of = lambda *names: {ids[n] for n in names}  # noqa: E731
    assert picked(saga, definition="orders") == of("cancel", "approved", "rejected", "waiting")
    # An actor is in a run they started or acted on.
    assert picked(saga, actor="alice") == of("done", "approved")
    assert picked(saga, actor="erin") == of("approved", "rejected")
    assert picked(saga, actor="hank") == of("retried")
    assert picked(saga, actor="nobody") == set()
    assert picked(saga, status="compensated") == of("auto", "rejected", "manual")
    assert picked(saga, definition="pay", status="completed") == of("done")
    only_erin = build_report(saga, actor="erin", now=NOW)
    assert only_erin.filters["actor"] == "erin" and only_erin.summary["failures"] == 1
    assert [a["actor"] for a in only_erin.actions] == ["alice", "erin", "carol", "erin"]

    # The period, on the recorded starts: since inclusive, until exclusive.
    names = list(ids)
    starts = [event_time(saga, ids[n], "RunStarted") for n in names]
    assert picked(saga, since=starts[3], until=starts[7]) == of(*names[3:7])
    zulu = starts[3].replace("+00:00", "Z")
    assert picked(saga, since=zulu) == of(*names[3:])
    assert picked(saga, until=starts[0]) == set()
    first, last = date.fromisoformat(starts[0][:10]), date.fromisoformat(starts[-1][:10])
    whole = {"since": first.isoformat(), "until": (last + timedelta(days=1)).isoformat()}
    report = build_report(saga, now=NOW, **whole)
    assert {r["run_id"] for r in report.runs} == set(ids.values())
    assert report.filters["since"] == f"{first.isoformat()}T00:00:00.000000+00:00"
    assert picked(saga, until=first.isoformat()) == set()
    with pytest.raises(ValueError, match="since 'yesterday'"):
        build_report(saga, since="yesterday")
    with pytest.raises(ValueError, match="unknown status"):
        build_report(saga, status="done")


def test_an_empty_period_renders_in_every_format(lite: Saga) -> None:
    report = build_report(lite, since="2026-11-01", until="2026-12-01", now=NOW)
    assert report.summary["runs"] == 0 and report.totals["completed"] == 0
    assert report.durations["overall"] == {"runs": 0, "mean_ms": None, "p95_ms": None}
    assert "_None._" in render(report, "md") and "None." in render(report, "html")
    assert render(report, "csv").strip() == ",".join(CSV_COLUMNS)
    assert json.loads(render(report, "json"))["runs"] == []
    with pytest.raises(ValueError, match="unknown report format"):
        render(report, "pdf")


def test_nearest_rank_and_period_bounds() -> None:
    assert nearest_rank([]) is None
    assert nearest_rank([7]) == 7
    assert nearest_rank([30, 10, 20]) == 30
    assert nearest_rank(list(range(1, 21))) == 19  # ceil(0.95 * 20) = 19
    assert nearest_rank(list(range(100, 0, -1))) == 95
    assert nearest_rank(list(range(1, 41)), 50) == 20
    assert parse_moment("2026-11-01") == "2026-11-01T00:00:00.000000+00:00"
    assert parse_moment("2026-11-01T10:00:00+02:00") == "2026-11-01T08:00:00.000000+00:00"
    assert parse_moment("2026-11-01T08:00") == "2026-11-01T08:00:00.000000+00:00"
    assert parse_moment(None) is None


# -- verification --------------------------------------------------------------------------

def doctor(settings: Settings, run_id: str) -> int:
    """Edit the output recorded by a run's first StepCompleted, in SQL; its version."""
    v = next(r.version for r in audit.read_records(settings, run_id)
             if r.type_name == "StepCompleted")
    table = "saga_events" if settings.is_postgres else "stored_events"
    key: Any = uuid.UUID(run_id) if settings.is_postgres else uuid.UUID(run_id).hex
    db = Database(settings)
    try:
        where = "WHERE originator_id = ? AND originator_version = ?"
        state = json.loads(bytes(db.query(f"SELECT state FROM {table} {where}",
                                          (key, v))[0]["state"]))
        state["output"] = {"amount": 1_000_000}
        db.execute(f"UPDATE {table} SET state = ? {where}", (json.dumps(state).encode(), key, v))
    finally:
        db.close()
    return v


@pytest.mark.doctored
def test_a_doctored_run_is_reported_broken(saga: Saga, settings: Settings) -> None:
    pay = saga.load(PAY)
    edited = saga.run(pay, {"fail": False}, actor="alice").run_id
    intact = saga.run(pay, {"fail": True}, actor="bob").run_id
    v = doctor(settings, edited)
    report = build_report(saga, now=NOW)
    verdicts = {x["run_id"]: x for x in report.verification}
    assert (verdicts[edited]["verdict"], verdicts[edited]["broken_at"],
            verdicts[edited]["reason"]) == ("BROKEN", v, audit.PAYLOAD_EDITED)
    assert verdicts[intact]["verdict"] == "OK" and verdicts[intact]["broken_at"] is None
    assert (report.summary["verified_ok"], report.summary["broken"]) == (1, 1)
    rows = {r["run_id"]: r for r in csv.DictReader(io.StringIO(render(report, "csv")))}
    assert (rows[edited]["verified"], rows[intact]["verified"]) == ("BROKEN", "OK")
    assert f"| {edited} | pay | BROKEN | 5 | 0 | {v} | payload edited: " in render(report, "md")
    assert '<td class="BROKEN">BROKEN</td>' in render(report, "html")

    # Retention redacts the intact run (and leaves the evidence of the broken one): it
    # still verifies, with its user data removed from RunStarted, StepStarted (hold,
    # charge), StepCompleted (hold), StepCompensationStarted (hold: the undo's rendered
    # parameters), StepCompensated (hold) and RunCompensated: 7 events.
    assert audit.apply_retention(settings, 0) == [intact]
    report = build_report(saga, now=NOW)
    verdicts = {x["run_id"]: x for x in report.verification}
    assert (verdicts[intact]["verdict"], verdicts[intact]["redacted"]) == ("OK", 7)
    assert report.summary["redacted_events"] == 7 and report.summary["broken"] == 1
    assert report.compensations[0]["run_id"] == intact  # its events still read


def test_the_report_filters_by_label(saga: Saga) -> None:
    from saga.report import build_report

    flow = {"name": "labelled", "steps": [{"id": "a", "tool": "noop"}]}
    mine = saga.run(saga.load(flow), labels={"team": "payments"})
    saga.run(saga.load(flow), labels={"team": "search"})
    report = build_report(saga, labels={"team": "payments"})
    assert [r["run_id"] for r in report.runs] == [mine.run_id]
