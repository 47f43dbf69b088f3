"""The compliance report: which runs happened in a period, how they ended, who did what,
and whether the event log still proves it; and how often each template ran, and how well.

:func:`build_report` reads three sources and joins them per run:

- the read model (``saga_runs``, ``saga_steps``; caught up first): which runs are in the
  period, their outcome, times, durations and step statuses;
- each run's events (:meth:`saga.api.Saga.history`): the people behind approvals,
  rejections, cancellations, retries and requested compensations, and each
  compensation's reason and steps (the read model keeps none of these);
- :func:`saga.audit.verify_store` on the raw stored events (with the configured audit key):
  whether each run's hash chain is intact.

:func:`render` turns a :class:`Report` into ``md``, ``html`` (self-contained, every value
escaped), ``json`` (the whole report) or ``csv`` (one row per run, :data:`CSV_COLUMNS`).

Definitions used throughout (also explained in the rendered report):

- a **failure** is a run that ended ``failed``, or ended ``compensated`` because a step
  failed (a completed run undone on request is not a failure);
- a **compensation** is one rollback (one ``CompensationStarted`` event): ``automatic``
  after a failure, ``requested`` by a person, or part of a ``cancellation``;
- **durations** are ``duration_ms`` of finished runs (start to outcome, time spent waiting
  for approvals included); ``p95`` is the nearest-rank percentile (:func:`nearest_rank`).
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from saga import audit
from saga.api import Saga
from saga.composition.library import TemplateInfo, find_template, list_templates, read_template
from saga.config import DEFAULT_TENANT
from saga.domain import RUN_STATUSES, TERMINAL, step_key
from saga.errors import StoreUnavailableError
from saga.projection import open_projection

#: The outcomes counted, in the order they are shown.
OUTCOMES = ("completed", "failed", "compensated", "cancelled", "running", "waiting",
            "compensating")
FORMATS = ("md", "csv", "json", "html")
#: The columns of the csv format, one row per run. ``compensated_steps`` lists the undone
#: step executions separated by ``;`` (a loop iteration as ``step[n]``), and
#: ``not_undone_steps`` those a rollback left in place (no compensation, or a failed one);
#: ``verified`` is ``OK`` or ``BROKEN``; empty cells are values the run does not have (yet).
CSV_COLUMNS = ("run_id", "definition", "status", "actor", "started_at", "finished_at",
               "duration_ms", "failed_step", "compensated_steps", "not_undone_steps",
               "verified")
TOP_FAILED_STEPS = 10
_ACTION_ORDER = {"started": 0, "approved": 1, "rejected": 1, "retried": 2, "compensated": 3,
                 "cancelled": 3}


@dataclass
class Report:
    """A compliance report; every field is plain JSON (see :func:`render`)."""

    generated_at: str
    filters: dict[str, str | None]
    totals: dict[str, int]
    summary: dict[str, Any]
    failed_steps: list[dict[str, Any]]
    durations: dict[str, Any]
    compensations: list[dict[str, Any]]
    actions: list[dict[str, Any]]
    verification: list[dict[str, Any]]
    runs: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The whole report as one JSON object."""
        return asdict(self)


def _utc(value: datetime) -> str:
    # Fixed-width UTC text, the read model's format: moments then compare correctly as text.
    value = value if value.tzinfo else value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def parse_moment(text: str | None, name: str = "time") -> str | None:
    """A period bound as the read model's UTC text: a date (``2026-11-01``, midnight UTC)
    or an ISO-8601 time (naive means UTC); None stays None. ValueError if it is neither."""
    if text is None:
        return None
    try:
        if len(text) == 10:
            day = date.fromisoformat(text)
            return _utc(datetime(day.year, day.month, day.day, tzinfo=UTC))
        return _utc(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"{name} {text!r} is neither a date (2026-11-01) nor an ISO "
                         "time (2026-11-01T08:00:00Z)") from None


def nearest_rank(values: list[int], percent: int = 95) -> int | None:
    """The nearest-rank percentile: the smallest value that at least ``percent``% of the
    values do not exceed, i.e. ``sorted(values)[ceil(percent * n / 100) - 1]``. It is
    always one of the values (no interpolation); None when there are none."""
    if not values:
        return None
    rank = -(-percent * len(values) // 100)  # integer ceil: no float rounding at the edges
    return sorted(values)[max(rank, 1) - 1]


def _stats(values: list[int]) -> dict[str, Any]:
    mean = round(sum(values) / len(values), 1) if values else None
    return {"runs": len(values), "mean_ms": mean, "p95_ms": nearest_rank(values)}


def _reason(text: str | None, who: str | None) -> str:
    # The engine appends " (by WHO)" to a requested reason; the requester has a column.
    text = text or ""
    suffix = f" (by {who})"
    return text[: -len(suffix)] if who and text.endswith(suffix) else text


def _trail(row: dict[str, Any], events: list[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """(compensations, actions) of one run, from its events."""
    run = {"run_id": row["run_id"], "definition": row["definition_name"]}
    actions = [dict(run, at=row["started_at"], actor=row["actor"] or "", action="started",
                    step=None, detail="")]
    compensations: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for e in events:
        kind, p, at = e["type"], e["payload"], _utc(datetime.fromisoformat(e["timestamp"]))
        who = p.get("actor") or ""
        if kind in ("ApprovalGranted", "ApprovalRejected"):
            actions.append(dict(run, at=at, actor=who, step=e.get("step_id"),
                                action="approved" if kind == "ApprovalGranted" else "rejected",
                                detail=p.get("comment") or ""))
        elif kind == "RunRetried":
            actions.append(dict(run, at=at, actor=who, action="retried", step=None,
                                detail="steps " + ", ".join(p.get("steps") or [])))
        elif kind == "CompensationStarted":
            requested, cancel = bool(p.get("requested")), bool(p.get("cancel"))
            reason = _reason(p.get("reason"), who if requested else None)
            trigger = "cancellation" if cancel else "requested" if requested else "automatic"
            current = dict(run, at=at, trigger=trigger, reason=reason,
                           requested_by=who if requested else "automatic",
                           planned=list(p.get("steps") or []), compensated=[], failed=[])
            compensations.append(current)
            if requested:
                # The request is the person's act; RunCancelled later only records the end.
                actions.append(dict(run, at=at, actor=who, step=None, detail=reason,
                                    action="cancelled" if cancel else "compensated"))
        elif kind in ("StepCompensated", "CompensationFailed") and current is not None:
            key = step_key(e["step_id"], int(p.get("iteration") or 0))
            current["compensated" if kind == "StepCompensated" else "failed"].append(key)
    return compensations, actions


def _not_undone(saga: Saga, run_id: str, notes: list[str]) -> list[str]:
    """The step executions a run that did not complete left in place, undone by nothing
    (promise 5: named in the report as in the status)."""
    try:
        return list(saga.status(run_id).get("not_undone") or [])
    except StoreUnavailableError:
        raise
    except Exception as e:  # a run too damaged to load: verification reports why
        notes.append(f"run {run_id}: what its rollback left undone could not be read ({e})")
        return []


def build_report(saga: Saga, *, since: str | None = None, until: str | None = None,
                 definition: str | None = None, actor: str | None = None,
                 status: str | None = None, now: datetime | None = None,
                 labels: dict[str, str] | None = None) -> Report:
    """The compliance report of the runs that started in ``[since, until)`` (dates or ISO
    times, UTC when naive) and match ``definition`` (its name), ``status`` and ``actor``
    (who started the run, or approved, rejected, cancelled, retried or asked to undo it),
    and carry every one of ``labels``.

    ``now`` is the time the report says it was generated (default: now). Raises
    ValueError on a bad bound or status; store errors propagate, because a report from a
    read model that cannot catch up would silently miss runs.
    """
    if status is not None and status not in RUN_STATUSES:
        raise ValueError(f"unknown status {status!r} (one of {', '.join(RUN_STATUSES)})")
    lo, hi = parse_moment(since, "since"), parse_moment(until, "until")
    projection = saga.projection
    projection.catch_up()
    wanted = dict(labels or {})
    rows = [r for r in projection.runs(status=status, limit=None, since=lo, labels=wanted)
            if (hi is None or (r["started_at"] or "") < hi)
            and (definition is None or r["definition_name"] == definition)
            and all(json.loads(r.get("labels") or "{}").get(k) == v
                    for k, v in wanted.items())]
    rows.reverse()  # oldest first: the report reads as a chronicle
    notes: list[str] = []
    kept: list[tuple[dict[str, Any], list[Any], list[Any]]] = []
    for row in rows:
        try:
            events = saga.history(row["run_id"])
        except StoreUnavailableError:
            raise
        except Exception as e:  # an event too damaged to load: verification reports why
            notes.append(f"run {row['run_id']}: its events could not be read ({e}); "
                         "its approvals, cancellations and compensations are missing here")
            events = []
        compensations, actions = _trail(row, events)
        if actor is None or any(a["actor"] == actor for a in actions):
            kept.append((row, compensations, actions))
    ids = [row["run_id"] for row, _, _ in kept]
    verdicts = {r.run_id: r for r in audit.verify_store(
        saga.settings, ids, key=audit.audit_key(saga.settings))} if ids else {}

    runs, all_comps, all_actions, verification = [], [], [], []
    failed_steps: Counter[tuple[str, str]] = Counter()
    durations: dict[str, list[int]] = {}
    for row, compensations, actions in kept:
        steps = projection.steps(row["run_id"])
        name = row["definition_name"]
        failed_steps.update((name, s) for s in {s["step_id"] for s in steps
                                                if s["status"] == "failed"})
        undone = sorted((s for s in steps if s["status"] == "compensated"),
                        key=lambda s: s["compensated_at"] or "")
        verdict = verdicts[row["run_id"]]
        finished = row["finished_at"] is not None and row["duration_ms"] is not None
        if finished:
            durations.setdefault(name, []).append(int(row["duration_ms"]))
        error = json.loads(row["error"]) if row["error"] else {}
        runs.append({
            "run_id": row["run_id"], "definition": name,
            "definition_version": row["definition_version"], "status": row["status"],
            "actor": row["actor"], "started_at": row["started_at"],
            "finished_at": row["finished_at"],
            "duration_ms": int(row["duration_ms"]) if finished else None,
            # The read model keeps failed_step after a retry that then completed: only a
            # run that ended failed or compensated has one.
            "failed_step": row["failed_step"]
            if row["status"] in ("failed", "compensated") else None,
            "error": error.get("message"),
            "compensated_steps": [step_key(s["step_id"], s["iteration"]) for s in undone],
            "not_undone_steps": _not_undone(saga, row["run_id"], notes)
            if row["status"] in ("failed", "compensated", "cancelled") else [],
            "verified": "OK" if verdict.ok else "BROKEN"})
        all_comps += compensations
        all_actions += actions
        verification.append({"run_id": row["run_id"], "definition": name,
                             "verdict": "OK" if verdict.ok else "BROKEN",
                             "events": verdict.events, "redacted": verdict.redacted,
                             "broken_at": verdict.broken_at, "reason": verdict.reason,
                             "message": "" if verdict.ok else verdict.message,
                             "keyed": verdict.keyed})

    totals = {o: 0 for o in OUTCOMES} | Counter(r["status"] for r in runs)
    every = [d for values in durations.values() for d in values]
    all_actions.sort(key=lambda a: (a["at"], _ACTION_ORDER[a["action"]], a["run_id"]))
    broken = sum(v["verdict"] == "BROKEN" for v in verification)
    summary = {
        "runs": len(runs),
        "failures": sum(r["status"] == "failed" or (r["status"] == "compensated"
                                                    and r["failed_step"] is not None)
                        for r in runs),
        "compensations": len(all_comps),
        "steps_compensated": sum(len(c["compensated"]) for c in all_comps),
        "verified_ok": len(verification) - broken, "broken": broken,
        "redacted_events": sum(v["redacted"] for v in verification),
        "keyed": bool(verification) and all(v["keyed"] for v in verification)}
    top = sorted(failed_steps.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FAILED_STEPS]
    return Report(
        generated_at=_utc(now or datetime.now(UTC)),
        filters={"since": lo, "until": hi, "definition": definition, "actor": actor,
                 "status": status,
                 # a tenant's report is of its store only (saga report --tenant)
                 **({"tenant": saga.settings.tenant}
                    if saga.settings.tenant != DEFAULT_TENANT else {}),
                 **({"labels": ", ".join(f"{k}={v}" for k, v in
                                                            sorted(wanted.items()))}
                                       if wanted else {})},
        totals=totals, summary=summary,
        failed_steps=[{"definition": d, "step_id": s, "count": n} for (d, s), n in top],
        durations={"overall": _stats(every),
                   "by_definition": {d: _stats(v) for d, v in sorted(durations.items())}},
        compensations=all_comps, actions=all_actions, verification=verification, runs=runs,
        notes=notes)


# -- rendering -------------------------------------------------------------------------

Section = tuple[str, str, list[str], list[list[Any]]]  # title, explanation, header, rows


def _sections(report: Report) -> list[Section]:
    """The report as titled tables with a plain-words explanation each (md and html)."""
    f, s = report.filters, report.summary
    keyed = ("Each event's signature (HMAC) was also checked with the configured audit "
             "key." if s["keyed"] else "No audit key was used, so signatures were not "
             "checked: someone able to rewrite the database and recompute every hash "
             "would not be detected.")
    durations = [["all definitions", *_row(report.durations["overall"])]]
    durations += [[d, *_row(v)] for d, v in report.durations["by_definition"].items()]
    return [
        ("Scope", "Which runs this report covers. A run is included when it started in the "
         "period (the start is included, the end is not; times are UTC) and matches every "
         "other filter. The actor filter keeps the runs that person started or acted on.",
         ["filter", "value"],
         [[k, v if v is not None else "(any)"] for k, v in f.items()]),
        ("Outcomes", "How many runs ended each way. Running, waiting (for a person's "
         "approval) and compensating (being undone) runs had not finished yet.",
         ["outcome", "runs"], [[o, n] for o, n in report.totals.items()]
         + [["total", s["runs"]]]),
        ("Failures and compensations", "A failure is a run that ended failed, or that was "
         "undone because one of its steps failed. A compensation undoes a run's completed "
         "steps (those that say how to undo themselves), newest first: automatically after "
         "a failure, or because a person asked for it or cancelled the run.",
         ["figure", "value"],
         [["failures", s["failures"]], ["compensations", s["compensations"]],
          ["steps undone by compensations", s["steps_compensated"]]]),
        (f"Steps that failed most (top {TOP_FAILED_STEPS})", "Each step that ended failed, "
         "and in how many runs it did, most frequent first.",
         ["definition", "step", "runs"],
         [[x["definition"], x["step_id"], x["count"]] for x in report.failed_steps]),
        ("Durations", "How long finished runs took, from start to outcome, in milliseconds "
         "(time spent waiting for an approval included). Mean is the average; p95 is the "
         "nearest-rank 95th percentile: the shortest duration that at least 95% of the runs "
         "did not exceed.", ["definition", "finished runs", "mean ms", "p95 ms"], durations),
        ("Compensations", "Every compensation, when it began, why, and who asked for it "
         "(automatic: the engine, after a step failed). Steps undone are those actually "
         "undone; undo failed lists steps whose undo itself failed.",
         ["when", "run", "definition", "kind", "requested by", "reason", "steps undone",
          "undo failed"],
         [[c["at"], c["run_id"], c["definition"], c["trigger"], c["requested_by"],
           c["reason"], ", ".join(c["compensated"]), ", ".join(c["failed"])]
          for c in report.compensations]),
        ("Who did what", "Every action a person took on these runs, in time order: who "
         "started each run, and who approved or rejected a step, cancelled a run, retried "
         "it, or asked for it to be undone (with their comment or reason).",
         ["when", "who", "action", "run", "definition", "step", "comment or reason"],
         [[a["at"], a["actor"], a["action"], a["run_id"], a["definition"], a["step"],
           a["detail"]] for a in report.actions]),
        ("Verification", "Each run's record is a chain of events, each sealed with the hash "
         "of the one before. OK means nothing in it was edited, deleted, inserted or "
         "reordered; BROKEN names the first event that fails the check and why. Redacted "
         "events had personal data removed by the retention policy; they still verify. "
         + keyed, ["run", "definition", "verdict", "events", "redacted", "broken at",
                   "reason"],
         [[v["run_id"], v["definition"], v["verdict"], v["events"], v["redacted"],
           v["broken_at"], v["message"]] for v in report.verification]),
        ("Runs", "Every run in scope, oldest first.",
         ["run", "definition", "status", "started by", "started", "finished", "duration ms",
          "failed step", "steps undone", "steps not undone", "verified"],
         [[r["run_id"], r["definition"], r["status"], r["actor"], r["started_at"],
           r["finished_at"], r["duration_ms"], r["failed_step"],
           ", ".join(r["compensated_steps"]), ", ".join(r["not_undone_steps"]),
           r["verified"]] for r in report.runs]),
    ] + ([("Notes", "Problems met while making this report.", ["note"],
           [[n] for n in report.notes])] if report.notes else [])


def _row(stats: dict[str, Any]) -> list[Any]:
    return [stats["runs"], stats["mean_ms"], stats["p95_ms"]]


def _text(value: Any) -> str:
    return "" if value is None else str(value)


_MD_SPECIAL = "\\|`*[]"
#: Markup characters as entities: every Markdown renderer shows them as text, whereas a
#: backslash before ``<`` is left as raw HTML by some.
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def _md(value: Any) -> str:
    # Backslash-escape what would make a table cell, code, emphasis or a link; markup
    # characters become entities, so a run's name is never raw HTML.
    text = " ".join(_text(value).split())
    return "".join(_ENTITIES.get(ch) or ("\\" + ch if ch in _MD_SPECIAL else ch)
                   for ch in text) or " "


def _csv(value: Any) -> str:
    # No markup in a cell (a CSV shown by a browser or pasted into a page stays text),
    # and no formula for a spreadsheet to run (=, +, -, @ first: a leading quote).
    text = _text(value).replace("<", "&lt;").replace(">", "&gt;")
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def _intro(report: Report) -> str:
    return (f"Generated {report.generated_at} (UTC) from the event log of the saga "
            f"executor: {report.summary['runs']} run(s) of automated multi-step procedures, "
            "what became of them, who acted on them, and whether their records are intact.")


def render_md(report: Report) -> str:
    """The report as Markdown: a title, then per section a short explanation and a table."""
    out = ["# Saga compliance report", "", _intro(report), ""]
    for title, explanation, header, rows in _sections(report):
        out += [f"## {title}", "", explanation, ""]
        if not rows:
            out += ["_None._", ""]
            continue
        out.append("| " + " | ".join(header) + " |")
        out.append("|" + "---|" * len(header))
        out += ["| " + " | ".join(_md(c) for c in row) + " |" for row in rows]
        out.append("")
    return "\n".join(out)


_CSS = ("body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:80em}"
        "table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}"
        "th{background:#f2f2f2}p.why{color:#555;max-width:60em}"
        "td.BROKEN{color:#fff;background:#b00020;font-weight:bold}td.OK{color:#1b5e20}")


def render_html(report: Report) -> str:
    """The report as one self-contained HTML page (inline CSS, every value escaped)."""
    esc = html.escape
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           "<title>Saga compliance report</title>", f"<style>{_CSS}</style>", "</head>",
           "<body>", "<h1>Saga compliance report</h1>", f"<p>{esc(_intro(report))}</p>"]
    for title, explanation, header, rows in _sections(report):
        out += [f"<h2>{esc(title)}</h2>", f'<p class="why">{esc(explanation)}</p>']
        if not rows:
            out.append("<p><em>None.</em></p>")
            continue
        out += ["<table>", "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>"]
        for row in rows:
            cells = []
            for c in row:
                text = _text(c)
                # Only the verdict words get a class: a value never becomes markup.
                cls = f' class="{text}"' if text in ("OK", "BROKEN") else ""
                cells.append(f"<td{cls}>{esc(text)}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def render_csv(report: Report) -> str:
    """One row per run with the columns of :data:`CSV_COLUMNS` (and a header row)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for r in report.runs:
        values = dict(r, compensated_steps=";".join(r["compensated_steps"]),
                      not_undone_steps=";".join(r["not_undone_steps"]))
        writer.writerow([_csv(values[c]) for c in CSV_COLUMNS])
    return buffer.getvalue()


def render_json(report: Report) -> str:
    """The whole report as one JSON document."""
    return json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n"


def render(report: Report, fmt: str = "md") -> str:
    """The report as text in ``fmt``: ``md``, ``csv``, ``json`` or ``html``."""
    renderers = {"md": render_md, "csv": render_csv, "json": render_json, "html": render_html}
    if fmt not in renderers:
        raise ValueError(f"unknown report format {fmt!r} ({', '.join(FORMATS)})")
    return renderers[fmt](report)


# -- template statistics ---------------------------------------------------------------

def _every_run(saga: Saga) -> list[dict[str, Any]]:
    """Every row of the read model's ``saga_runs``, after catching up with the log."""
    projection = open_projection(saga.app)
    try:
        projection.catch_up()
        return projection.runs(limit=None)
    finally:
        projection.close()


def _template_stats(info: TemplateInfo, rows: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for r in rows if r["definition_name"] == info.definition_name]
    by_status: dict[str, int] = {}
    for row in rows:
        by_status[row["status"]] = by_status.get(row["status"], 0) + 1
    finished = [r for r in rows if r["status"] in TERMINAL]
    durations = [int(r["duration_ms"]) for r in finished if r["duration_ms"] is not None]
    return {
        "template": info.name,
        "definition_name": info.definition_name,
        "runs": len(rows),
        "finished": len(finished),
        "by_status": by_status,
        "success_rate": (by_status.get("completed", 0) / len(finished)) if finished else None,
        "mean_duration_ms": (sum(durations) / len(durations)) if durations else None,
        "last_run_at": max((r["started_at"] for r in rows if r["started_at"]), default=None),
    }


def template_stats(saga: Saga, name: str) -> dict[str, Any]:
    """Runs of one template from the read model: ``runs``, ``finished``, ``by_status``,
    ``success_rate`` (completed over finished runs: completed, failed, compensated or
    cancelled; None before any), ``mean_duration_ms`` of finished runs and
    ``last_run_at``. Runs count when their ``definition_name`` is the template's name."""
    return _template_stats(read_template(find_template(name, saga.settings)), _every_run(saga))


def templates_stats(saga: Saga, templates: list[TemplateInfo] | None = None
                    ) -> dict[str, dict[str, Any]]:
    """:func:`template_stats` of many templates (default: every one) by template name,
    reading the read model once."""
    rows = _every_run(saga)
    infos = templates if templates is not None else list_templates(saga.settings)
    return {info.name: _template_stats(info, rows) for info in infos}
