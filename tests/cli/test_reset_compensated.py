"""Issue 40, found by the conformance simulator: a reset of a run its compensation undid.

A compensated run's completed steps are undone already. A reset must not undo them a
second time, and must not re-run a step on top of an upstream step that stays undone
(the scheduler would find nothing ready and end the run ``completed`` without running
it): such a reset is refused, naming the step to reset to instead. Each reset is a new
process (the CLI) on what another wrote, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
from pathlib import Path

from saga.api import Saga
from saga.config import Settings
from saga.tools import Registry
from tests.cli.test_migrate_reset import TOOLS, cli, logged, verified

FLOW = """
name: order
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
    parameters: {value: 3, fail: true}
    depends_on: [b]
"""


def test_a_compensated_run_resets_from_its_first_undone_step_and_undoes_nothing_twice(
        settings: Settings, registry: Registry, tmp_path: Path) -> None:
    calls = tmp_path / "calls.log"
    flow = tmp_path / "order.yaml"
    flow.write_text(FLOW)
    with Saga(settings, registry=registry) as s:
        run = s.run(str(flow), run_id="R-undone")
        assert run.status == "compensated"
        version = run.version
    calls.unlink(missing_ok=True)

    # b's upstream step a stays undone: re-running b on top of it is refused
    past = cli(["reset", "R-undone", "--to", "b", "--json", *TOOLS], settings, calls)
    assert past.returncode == 2, past.stdout + past.stderr
    assert "'a'" in past.stderr and "reset to a" in past.stderr, past.stderr
    with Saga(settings, registry=registry) as s:
        assert s.get("R-undone").version == version  # nothing appended
    assert logged(calls) == []

    # from a: nothing is undone again (both were), then a, b and c run again
    again = cli(["reset", "R-undone", "--to", "a", "--json", *TOOLS], settings, calls)
    assert json.loads(again.stdout)["status"] == "compensated", again.stderr
    made = [(c["tool"], c["step"], c["key"]) for c in logged(calls)]
    assert made == [("act", "a", "R-undone:a:0:reset1"), ("act", "b", "R-undone:b:0:reset1"),
                    ("act", "c", "R-undone:c:0:reset1"),
                    ("undo", "b", "R-undone:b:0:reset1:compensate"),
                    ("undo", "a", "R-undone:a:0:reset1:compensate")]
    with Saga(settings, registry=registry) as s:
        reset = next(e for e in s.events("R-undone") if type(e).__name__ == "RunReset")
        assert (reset.undo, reset.reopen) == ([], ["a", "b", "c"])
    verified("R-undone", settings, calls)
