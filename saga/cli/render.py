"""How the CLI shows things: run summaries, live progress, event lines, dry runs."""

from __future__ import annotations

import builtins
import json
import os
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from saga.cli.app import (
    _emit_json,
    note,
)
from saga.domain import TERMINAL, Run, iso
from saga.views import run_summary

_STATUS_STYLE = {"completed": "green", "running": "cyan", "failed": "red", "skipped": "dim",
                 "compensated": "magenta", "compensating": "magenta", "waiting": "yellow",
                 "pending": "dim", "cancelled": "red", "paused": "yellow"}


def _duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s" if ms >= 1000 else f"{ms:.0f}ms"


def _ago(stamp: str | None, now: datetime | None = None) -> str:
    """An ISO time as a table shows it: how long ago, short (``45s ago``, ``2m ago``,
    ``3h ago``, ``5d ago``), or how soon (``in 5m``), a date past 60 days; ``--json``
    keeps the ISO time."""
    if not stamp:
        return "-"
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = ((now or datetime.now(UTC)) - when).total_seconds()
    if -60 < seconds < 60:  # a clock a little ahead of this one is "now" too
        return f"{max(int(seconds), 0)}s ago"
    span = abs(seconds)
    for size, unit, below in ((60, "m", 3600), (3600, "h", 86400), (86400, "d", 60 * 86400)):
        if span < below:
            count = f"{int(span // size)}{unit}"
            return f"{count} ago" if seconds > 0 else f"in {count}"
    return when.strftime("%Y-%m-%d")


def _clock(stamp: str) -> str:
    """An ISO time as a table of events shows it: the time of day, ``00:05:26.412`` (UTC,
    as recorded)."""
    try:
        return datetime.fromisoformat(stamp).strftime("%H:%M:%S.%f")[:12]
    except ValueError:
        return stamp


def _print_dry_run(preview: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _emit_json(preview)
        return
    click.echo(f"dry run of {preview['name']} (nothing is recorded, no tool is called)")
    for i, level in enumerate(preview["levels"], 1):
        click.echo(f"  level {i}: {', '.join(level)}")
    for step in preview["steps"]:
        what = step["tool"] or (f"use {step['use']}" if step["use"] else "compute")
        notes = [f"when {step['when']}"] if step["when"] else []
        notes += ["for each"] if step["loop"] is not None else []
        notes += ["asks for approval"] if step["approval"] else []
        notes += ["compensated"] if step["compensate"] else []
        click.echo(f"  {step['id']}: {what} {json.dumps(step['parameters'], default=str)}"
                   + (f"  [{'; '.join(notes)}]" if notes else ""))


def _finish(run: Run, as_json: bool, success: tuple[str, ...] = ("completed", "waiting")) -> None:
    """Print the run and exit: 0 when it ended as the command intended, else 1."""
    summary = run_summary(run)
    if as_json:
        _emit_json(summary)
    else:
        _print_summary(summary)
    sys.exit(0 if run.status in success else 1)


def _event_detail(e: dict[str, Any]) -> str:
    p = e["payload"]
    parts = []
    if "step_id" in p:
        parts.append(p["step_id"] + (f"[{p['iteration']}]" if p.get("iteration") else ""))
    for key in ("attempt", "resources", "reason", "error_type", "message", "steps", "comment",
                "actor"):
        if p.get(key) not in (None, "", []):
            parts.append(f"{key}={p[key]}")
    if e["type"] == "RunStarted":
        parts.append(f"{p['definition'].get('name')} by {p['context'].get('actor')}")
    if "output" in p and e["type"] == "StepCompleted":
        parts.append(f"output={json.dumps(p['output'], default=str)[:80]}")
    return " ".join(str(x) for x in parts)


_COLUMNS = ("step", "status", "attempts", "ms", "detail")
_MARKUP = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")


def _escape(text: Any) -> str:
    """Text from a run (names, ids, messages, outputs) as rich markup that prints it as
    written: ``[/]`` in an error message is not a closing tag (rich.markup.escape, without
    importing rich on the plain path; a backslash is special only before a tag, so one
    at the end of a fragment stays as it is)."""
    return _MARKUP.sub(lambda m: f"{m.group(1)}{m.group(1)}\\{m.group(2)}", str(text))


def _summary_parts(summary: dict[str, Any]) -> tuple[list[Any], list[tuple[str, ...]]]:
    """What a summary shows, in order: lines of rich markup, with the table's place marked
    by None; and the table's rows (step, status markup, attempts, ms, detail)."""
    status = summary["status"]
    style = _STATUS_STYLE.get(status, "")
    lines: list[Any] = [f"run {_escape(summary['run_id'])} ({_escape(summary['name'])}): "
                        + (f"[{style}]{_escape(status)}[/]" if style else _escape(status)),
                        None]
    rows: list[tuple[str, ...]] = []
    for key, s in summary.get("steps", {}).items():
        detail = (s.get("error") or {}).get("message") or s.get("reason") or ""
        if s.get("approval", {}).get("status") == "requested":
            detail = (f"waiting for approval: {s['approval']['message']}"
                      if summary["status"] not in TERMINAL else "never approved")
        st = s.get("status", "")
        style = _STATUS_STYLE.get(st, "")
        if s.get("compensation_error"):  # its effect is still there: say so
            st, style = f"{st}, compensation failed", "red"
            detail = f"NOT UNDONE: {s['compensation_error'].get('message', '')}"
        elif s.get("not_undone"):  # its undo could not be said (StepNotUndone)
            st, style = f"{st}, not undone", "yellow"
            detail = f"not undone: {s['not_undone']}"
        if s.get("heartbeat") and s.get("status") != "completed":  # a long call's progress
            detail = _beat(s["heartbeat"], detail)
        rows.append((_escape(key), f"[{style}]{st}[/]" if style else st,
                     str(s.get("attempt", "")), str(s.get("duration_ms", "") or ""),
                     _escape(detail)))
    if summary.get("error"):
        lines.append(f"error: {_escape(summary['error'].get('message', summary['error']))}")
    broken = (summary.get("error") or {}).get("compensation_failed")
    if broken:
        lines.append(f"[red]compensation failed for {_escape(', '.join(broken))}: their "
                     "effects were "
                     "NOT undone[/]")
    left = [k for k in summary.get("not_undone") or () if k not in (broken or ())]
    if left and summary["status"] in TERMINAL:
        lines.append(f"[yellow]not undone: {_escape(', '.join(left))}[/]")
    degraded = (summary.get("outputs") or {}).get("_layers", {}).get("degraded") \
        if isinstance(summary.get("outputs"), dict) else False
    if degraded:
        lines.append("[yellow]degraded: an enhancement-layer step failed[/]")
    if summary.get("outputs") is not None and summary["status"] == "completed":
        lines.append("outputs: " + _escape(json.dumps(summary["outputs"], default=str,
                                                      ensure_ascii=False)))
    for child in summary.get("children", []):
        lines.append(_escape(f"  └ step {child['step']}: child run {child['run_id']} "
                             f"({child['name']}): {child['status']}"))
    if status == "paused":
        lines.append(_escape(f"paused: no new step starts; go on with: saga unpause "
                             f"{summary['run_id']}"))
    if summary.get("waiting_for"):
        for step in summary["waiting_for"]:
            lines.append(_escape(f"waiting: saga approve {summary['run_id']} {step}"))
    for wait in summary.get("waiting_for_pools") or ():
        lines.append(_escape(_pool_wait(wait)))
    for wait in summary.get("waiting_for_resources") or ():
        lines.append(_escape(f"waiting: resource {', '.join(wait['resources'])} (step "
                             f"{wait['step']}, since {wait['since']})"))
    for child in summary.get("waiting_for_children") or ():
        what = ", ".join(_child_wait(child["run_id"], w) for w in child["waiting_for"])
        lines.append(_escape(f"waiting: step {child['step']} waits for child run "
                             f"{child['run_id']}, which waits for {what or 'its worker'}"))
    return lines, rows


def _pool_wait(wait: dict[str, Any]) -> str:
    """A step waiting for a worker of its pool, as a person reads it."""
    what = f"the undo of step {wait['step']}" if wait.get("compensation") \
        else f"step {wait['step']}"
    if wait["pool"] is None:
        return f"waiting: a worker of unpooled steps ({what}; one without --only-pools)"
    return (f"waiting: pool {wait['pool']} ({what}; a worker started with "
            f"--pool {wait['pool']} runs it)")


def _child_wait(run_id: str, wait: dict[str, Any]) -> str:
    """One thing a waiting child run waits for, as a person reads it (see ``waits_of``)."""
    if "approval" in wait:
        return f"an approval (saga approve {run_id} {wait['step']})"
    if "child" in wait:
        return f"its own child run {wait['child']}"
    if wait.get("signal"):
        return f"the signal {wait['signal']} (saga signal {run_id} {wait['signal']})"
    return f"a timer (until {wait['until']})"


def _beat(beat: dict[str, Any], detail: str) -> str:
    """A step's last heartbeat in its row: ``heartbeat 3s ago: {"done": 40}``, after what
    the row said (an interrupted or timed-out attempt's error)."""
    said = f"heartbeat {_ago(beat.get('at'))}"
    if beat.get("details") is not None:
        said += ": " + json.dumps(beat["details"], default=str, ensure_ascii=False)[:200]
    return f"{detail} ({said})" if detail else said


def _print_summary(summary: dict[str, Any]) -> None:
    lines, rows = _summary_parts(summary)
    text = _plain_text(lines, rows)
    if text is not None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    for line in lines:
        if line is not None:
            console.print(line)
            continue
        table = Table(show_header=True, header_style="bold", box=None)
        for column in _COLUMNS:
            table.add_column(column)
        for row in rows:
            table.add_row(*row)
        console.print(table)


#: The markup the plain path takes out: a colour around a whole status or line, ``[red]``
#: then ``[/]``, as the summary writes it.
_STYLES = "|".join(sorted({*_STATUS_STYLE.values(), "red", "yellow"}))
_STYLE_TAG = re.compile(rf"\[({_STYLES})\]|\[/\]")


def _plain_text(lines: list[Any], rows: list[tuple[str, ...]]) -> str | None:
    """The summary exactly as rich prints it off a terminal, without importing rich (which
    took a sixth of a short ``saga run``); None wherever rich might print it otherwise: on
    a terminal or with colours forced, in Jupyter, for text rich would read as markup or
    emoji or that is not plain printable ASCII, and for lines wider than the console,
    which rich wraps. tests/cli/test_render.py compares the two."""
    if _maybe_terminal():
        return None
    width = _console_width()
    table = [_COLUMNS, *rows]
    cells = [[_plain(cell) for cell in row] for row in table]
    texts = [None if line is None else _plain(line) for line in lines]
    if any(c is None for row in cells for c in row) or any(
            t is None for t, line in zip(texts, lines, strict=True) if line is not None):
        return None
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(_COLUMNS))]
    out = []
    for text in texts:
        if text is not None:
            out.append(text)
            continue
        out += ["".join(f" {str(c).ljust(w)} " for c, w in zip(row, widths, strict=True))
                for row in cells]
    if any(len(line) > width for line in out):
        return None
    return "".join(line + "\n" for line in out)


def _plain(markup: str) -> str | None:
    """``markup`` as rich shows it off a terminal, when the only markup in it is our own
    style tags and nothing else rich would change; else None."""
    tags = [m.group(1) is not None for m in _STYLE_TAG.finditer(markup)]
    text = _STYLE_TAG.sub("", markup)
    if tags not in ([], [True, False]) or "[" in text or "]" in text or "\\" in text \
            or re.search(r":\S*?:", text) or not text.isascii() or not text.isprintable():
        return None
    return text


def _maybe_terminal() -> bool:
    """Whether rich could take stdout for a terminal (or a notebook) and style or size its
    output for it."""
    env = os.environ
    return (sys.platform == "win32" or hasattr(builtins, "get_ipython")
            or "FORCE_COLOR" in env or "TTY_COMPATIBLE" in env or "TTY_INTERACTIVE" in env
            or not hasattr(sys.stdout, "isatty") or sys.stdout.isatty())


def _console_width() -> int:
    """The width rich's Console gives itself off a terminal: the first of stdin, stdout
    and stderr that is a terminal, overridden by ``COLUMNS``, else 80."""
    width = None
    for fd in (0, 1, 2):
        try:
            width = os.get_terminal_size(fd).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        width = int(columns)
    return width or 80


class _Progress:
    """What a run shows while it runs. On a terminal: the run id first, then a live table
    of its steps with the elapsed time, a step waiting for its retry as ``retrying in 4s``.
    Off a terminal (CI, cron): one line per recorded event, as it happens. On Ctrl-C: how
    to resume or cancel (said by the command). ``enabled`` False (``--json``) shows nothing."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.live = enabled and sys.stdout.isatty()
        self._live: Any = None
        self._started = time.monotonic()
        self.run_id: str | None = None
        #: The run the commits are of, shown or not (what Ctrl-C names, --json too).
        self.recorded: str | None = None
        self._run: Run | None = None

    def __enter__(self) -> _Progress:
        if self.live:
            from rich.live import Live

            # Drawn at every refresh, not only at commits: the elapsed time, the spinner of
            # a running step and a retry's countdown move while a long step runs.
            self._live = Live(get_renderable=self._table, refresh_per_second=8,
                              transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._live is not None:  # on Ctrl-C, the command says what was left (runs.py)
            self._live.__exit__(None, None, None)

    def update(self, run: Run, events: list[Any]) -> None:
        """Show what the commit that just happened recorded."""
        self.recorded = run.run_id
        if not self.enabled:
            return
        try:
            self._show(run, events)
        except BrokenPipeError:
            # Whoever read the output went away (``saga run flow.yaml | head``): the run
            # goes on to its end unprinted, not cut short between two steps.
            self.enabled = False
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)

    def _show(self, run: Run, events: list[Any]) -> None:
        if self.run_id is None:
            self.run_id = run.run_id
            if self.live:
                click.echo(f"run {run.run_id} ({run.name})")
            else:
                note(f"run {run.run_id} ({run.name})")
        if self._live is None:
            for e in events:  # one line per event, for logs that are not a terminal
                click.echo(f"{iso(e.timestamp)} {run.run_id} {type(e).__name__} "
                           f"{_brief_event(e)}".rstrip())
            return
        self._run = run

    def _table(self) -> Any:
        from rich.table import Table

        run = self._run
        if run is None:
            return ""
        elapsed = time.monotonic() - self._started
        spinner = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"[int(elapsed * 10) % 10]
        table = Table(title=f"{run.name} — {run.status} — {elapsed:.1f}s", box=None)
        table.add_column("step")
        table.add_column("status")
        table.add_column("attempt")
        now = datetime.now(UTC)
        for key, s in run.steps.items():
            st = s["status"]
            shown = f"[{_STATUS_STYLE.get(st, '')}]{st}[/]"
            retry_at = s.get("retry_at")
            if st == "failed" and retry_at:
                left = max((datetime.fromisoformat(retry_at) - now).total_seconds(), 0)
                shown = f"[yellow]retrying in {left:.0f}s[/]"
            elif st == "running" and s.get("wait"):
                shown = "[yellow]waiting[/]"
            elif st == "running":
                shown = f"[cyan]{spinner} running[/]"
            table.add_row(key, shown, str(s["attempt"]))
        return table


def _brief_event(e: Any) -> str:
    parts = []
    step = getattr(e, "step_id", None)
    if step:
        iteration = getattr(e, "iteration", 0)
        parts.append(step + (f"[{iteration}]" if iteration else ""))
    for key in ("attempt", "error_type", "message", "reason"):
        value = getattr(e, key, None)
        if value not in (None, ""):
            parts.append(f"{key}={str(value)[:120]}")
    if getattr(e, "next_retry_at", None):
        parts.append(f"retry at {e.next_retry_at}")
    return " ".join(parts)
