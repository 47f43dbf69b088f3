"""Conformance simulation (issue 38): generated compositions driven to their end by real
worker processes under kills, zombies, pauses, cancels, approvals, signals, redrives and
operator mistakes, read by new processes, and checked against the promises (see
:mod:`tests.conformance.invariants`) and an oracle written apart from the scheduler
(:mod:`tests.conformance.model`).

Budgets (environment; ``ops/conformance.sh`` sets them):

- ``SIM_EXAMPLES`` generated cases per store (default 2), besides the cases aimed at the
  known breaks (:data:`tests.conformance.model.TARGETED`), each run on one store in turn
  (``SIM_BOTH=1``: on each store): the CI budget, about two minutes;
- ``SIM_SEED`` Hypothesis's seed (default 38, so CI is deterministic);
- ``SIM_MINUTES`` the long mode: cases until that many minutes pass per store, longer
  chains (up to 300 steps, past many snapshots) and worker churn;
- ``SIM_STORE`` ``sqlite``, ``postgres`` or ``pgrestart`` (default: the first two, and in
  the long mode also ``pgrestart``: a PostgreSQL cluster this module starts, which the
  cases restart);
- ``SIM_SHRINK`` ``0`` skips Hypothesis's shrinking (it reruns real processes);
- ``SIM_STATS`` a file to which each case appends one JSON line (cases, operations,
  kills, reads, and ``recoveries``: the seconds from each kill of the worker driving the
  run to the run's next ``RunTakenOver``).

A failure prints its seed, the (shrunk) case as JSON and where it was saved.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from hypothesis import given, seed

from tests.conformance import model
from tests.conformance.runner import (
    BUDGET,
    CASES,
    FAILURES,
    MINUTES,
    SEED,
    STORES,
    simulate,
)


@pytest.mark.timeout(0 if MINUTES else 900)  # shrinking a failure reruns real processes
@pytest.mark.parametrize("store", STORES)
def test_generated_cases_keep_every_promise(store: str) -> None:
    deadline = time.monotonic() + MINUTES * 60 if MINUTES else None

    found: list[str] = []

    def one(case: dict[str, Any]) -> None:
        if deadline is not None and time.monotonic() > deadline:
            return  # the long mode's time is up: the remaining examples do nothing
        try:
            simulate(case, store)
        except AssertionError as e:
            if not MINUTES:
                raise
            # the long mode goes on past a failure, to count and save every one (each
            # is replayed with --case); the CI budget stops and shrinks instead
            found.append(str(e).split("\n", 1)[0] + f" (case salt {case['salt']})")

    cases = model.cases(max_steps=30, long_chain=300, horizon=8.0, churn=True,
                        restarts=store == "pgrestart") if MINUTES else CASES
    seed(SEED)(BUDGET(given(case=cases)(one)))()
    assert not found, f"{len(found)} failing case(s), saved under {FAILURES}:\n" + \
        "\n".join(found)


def _targeted() -> list[tuple[str, str]]:
    """Each aimed case on one store in turn (both with ``SIM_BOTH=1``): the CI budget."""
    names = sorted(model.TARGETED)
    if os.environ.get("SIM_BOTH"):
        return [(n, s) for n in names for s in STORES]
    return [(n, STORES[i % len(STORES)]) for i, n in enumerate(names)]


@pytest.mark.parametrize(("name", "store"), _targeted())
def test_cases_aimed_at_known_breaks(name: str, store: str) -> None:
    simulate(model.TARGETED[name], store)


def test_the_oracle_on_hand_made_cases() -> None:
    """The oracle itself, on cases whose outcome is known without saga."""
    def act(sid: str, **kw: Any) -> dict[str, Any]:
        return {"id": sid, "kind": "act", "undo": "explicit", "retries": 0, "fail_times": 0,
                **kw}

    ok = {"steps": [act("a"), act("b", undo="own")], "rollback": True}
    assert model.expect(ok).statuses == {"completed"}
    undo = {"steps": [act("a"), act("b", undo="none"), act("c", undo="own"),
                      act("d", fail_times=2, retries=1)], "rollback": True}
    e = model.expect(undo)
    assert e.statuses == {"compensated"} and e.undo == ["c", "a"]
    assert e.steps["b"] == {"completed"} and e.steps["d"] == {"failed"}
    kept = {"steps": [act("a"), act("d", fail_times=2, retries=1)], "rollback": False}
    assert model.expect(kept).statuses == {"failed"}
    assert model.expect(kept, redrives=1).statuses == {"completed"}
    cont = {"steps": [act("a", fail_times=1, on_error="continue"), act("b")],
            "rollback": True}
    assert model.expect(cont).steps == {"a": {"failed"}, "b": {"completed"}}
    nothing = {"steps": [act("a", undo="none"), act("b", fail_times=1)], "rollback": True}
    assert model.expect(nothing).statuses == {"failed"}
    forced = {"steps": [act("a"), act("b", fail_times=9, on_error="compensate")],
              "rollback": False}
    assert model.expect(forced).undo == ["a"]
    retried = {"steps": [act("a"), act("b", fail_times=2, on_error="retry:2")],
               "rollback": True}
    assert model.expect(retried).statuses == {"completed"}
    rejected = {"steps": [act("a"), act("b", confirm="reject")], "rollback": True}
    assert model.expect(rejected).undo == ["a"]
    assert model.expect(rejected, cancelled=True).statuses == {"cancelled"}
    # a rejection stands through a redrive: saga retry asks the person again
    kept_rejected = {"steps": [act("a"), act("b", confirm="reject")], "rollback": False}
    assert model.expect(kept_rejected, redrives=1).statuses == {"failed"}
    group = {"steps": [act("a"), act("b", group="g", fail_times=1), act("c", group="g")],
             "rollback": True}
    assert model.expect(group).steps["c"] == {"compensated"}
    # taking turns for a resource's slot, c may never start once b failed
    # (its fate, and so what is undone, is then read from the log)
    assert "c" not in model.expect(group, turns=True).steps
    both_fail = {"steps": [act("a"), act("b", group="g", fail_times=1),
                           act("c", group="g", fail_times=1)], "rollback": True}
    assert model.expect(both_fail).steps["c"] == {"failed"}
    assert "c" not in model.expect(both_fail, turns=True).steps  # may never have started
