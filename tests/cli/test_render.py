"""A run's summary is printed without rich off a terminal when the text is plain, and then
it is exactly what rich prints; anything rich would print otherwise goes through rich."""

from __future__ import annotations

from typing import Any

import pytest

from saga.cli import render
from saga.domain import RUN_STATUSES

STEPS = {
    "reserve": {"status": "completed", "attempt": 1, "duration_ms": 12},
    "charge": {"status": "failed", "attempt": 3, "duration_ms": 2400,
               "error": {"message": "card declined "}},
    "ship": {"status": "skipped", "attempt": 0, "reason": "upstream failed"},
    "notify": {"status": "compensated", "attempt": 1,
               "compensation_error": {"message": "mail server down"}},
    "ask": {"status": "waiting", "attempt": 0,
            "approval": {"status": "requested", "message": "ship it?"}},
}


def summary(**changes: Any) -> dict[str, Any]:
    return {"run_id": "ORDER-42", "name": "order", "status": "completed", "steps": STEPS,
            "outputs": {"reserve": {"id": 7}, "charge": None}, **changes}


PLAIN = [
    summary(),
    summary(steps={}),
    summary(status="failed", error={"message": "step charge failed",
                                    "compensation_failed": ["notify", "reserve"]}),
    summary(status="waiting", waiting_for=["ask"], outputs=None),
    summary(outputs={"_layers": {"degraded": True}}),
    summary(status="compensated", outputs={"x": "a b"}),
    summary(status="paused", outputs=None),
]
#: Text rich reads as markup or emoji, or that is not plain ASCII: printed by rich.
RICH = [
    summary(name="[bold]order"),
    summary(steps={"a": {"status": "failed", "error": {"message": "see [red]log[/]"}}}),
    summary(name="[red]order"),
    summary(steps={"a": {"status": "failed", "error": {"message": "[link]log"}}}),
    summary(steps={"a": {"status": "failed", "error": {"message": "a \\[x]"}}}),
    summary(outputs={"mood": ":smile:"}),
    summary(outputs={"x": "a:b:c"}),
    summary(outputs={"é": "ü"}),
    summary(children=[{"step": "pay", "run_id": "R-1", "name": "pay", "status": "completed"}]),
    summary(steps={"a": {"status": "failed", "error": {"message": "tab\there"}}}),
]


def printed(capsys: pytest.CaptureFixture[str], data: dict[str, Any]) -> str:
    capsys.readouterr()
    render._print_summary(data)
    return capsys.readouterr().out


@pytest.fixture(autouse=True)
def off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("columns", ["80", "200", "60", "30"])
@pytest.mark.parametrize("data", PLAIN + RICH)
def test_the_plain_summary_is_what_rich_prints(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch,
                                               data: dict[str, Any], columns: str) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    ours = printed(capsys, data)
    monkeypatch.setattr(render, "_plain_text", lambda *_: None)
    assert ours == printed(capsys, data)


@pytest.mark.parametrize("data", PLAIN)
def test_plain_text_skips_rich(monkeypatch: pytest.MonkeyPatch, data: dict[str, Any]) -> None:
    """The comparison above is between two ways of printing, not rich and itself."""
    monkeypatch.setenv("COLUMNS", "200")
    assert render._plain_text(*render._summary_parts(data)) is not None


@pytest.mark.parametrize("data", RICH)
def test_what_rich_would_change_goes_through_rich(monkeypatch: pytest.MonkeyPatch,
                                                  data: dict[str, Any]) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert render._plain_text(*render._summary_parts(data)) is None


def test_rich_prints_on_a_terminal_narrow_consoles_and_forced_colour(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parts = render._summary_parts(summary())
    monkeypatch.setenv("COLUMNS", "30")
    assert render._plain_text(*parts) is None  # rich wraps the wide lines
    monkeypatch.setenv("COLUMNS", "200")
    assert render._plain_text(*parts) is not None
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert render._plain_text(*parts) is None
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert render._plain_text(*parts) is None


@pytest.mark.parametrize("text", ["closing [/] tag", "[bold]not bold[/bold]", "see [red]log[/]",
                                  "trailing \\", "[link=http://x]x[/link]"])
def test_text_from_a_run_prints_as_written(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """An error message, a name or an output is data, never markup: ``[/]`` in it once made
    the summary raise a MarkupError."""
    monkeypatch.setenv("COLUMNS", "200")
    data = summary(name=text, status="failed", outputs={"x": text}, error={"message": text},
                   steps={text: {"status": "failed", "error": {"message": text}}})
    out = printed(capsys, data)
    assert f"({text}): failed" in out and f"error: {text}" in out
    assert out.count(text) >= 4, out


@pytest.mark.parametrize("status", RUN_STATUSES)
@pytest.mark.parametrize("through_rich", [False, True])
def test_every_run_status_prints(capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch, status: str,
                                 through_rich: bool) -> None:
    """A status the summary has no colour for printed ``[]paused[/]``, which rich refused
    (MarkupError: saga status of a paused run failed)."""
    monkeypatch.setenv("COLUMNS", "200")
    if through_rich:
        monkeypatch.setattr(render, "_plain_text", lambda *_: None)
    out = printed(capsys, summary(status=status, outputs=None))
    assert out.startswith(f"run ORDER-42 (order): {status}\n")


def test_a_paused_run_says_how_to_go_on(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    out = printed(capsys, summary(status="paused", outputs=None, steps={
        "slow": {"status": "completed", "attempt": 1, "duration_ms": 1500}}))
    assert "paused: no new step starts; go on with: saga unpause ORDER-42" in out
    assert printed(capsys, summary(status="running")).count("unpause") == 0
