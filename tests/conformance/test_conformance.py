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
- ``SIM_CASE`` a ``case.json`` a failure saved: replays that case exactly;
- ``SIM_SHRINK`` ``0`` skips Hypothesis's shrinking (it reruns real processes);
- ``SIM_STATS`` a file to which each case appends one JSON line (cases, operations,
  kills, reads).

A failure prints its seed, the (shrunk) case as JSON and where it was saved.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed
from hypothesis import settings as hsettings

from saga.config import Settings
from tests.conformance import model
from tests.conformance.harness import Simulation
from tests.conformance.invariants import check, describe

EXAMPLES = int(os.environ.get("SIM_EXAMPLES", "2"))
MINUTES = float(os.environ.get("SIM_MINUTES", "0"))
SEED = int(os.environ.get("SIM_SEED", "38"))
#: ``pgrestart``: PostgreSQL on a cluster this module starts, restarted by the cases
#: (the long mode, when ``initdb`` is installed)
STORES = [s for s in ("sqlite", "postgres", "pgrestart")
          if os.environ.get("SIM_STORE", s if s != "pgrestart" or MINUTES else "") == s]
_CLUSTER: Any = None


def cluster() -> Any:
    """The PostgreSQL cluster of this module's own (started once, destroyed at exit)."""
    global _CLUSTER
    if _CLUSTER is None:
        import atexit

        from tests.standins.pg_cluster import Cluster, pg_bin
        if pg_bin() is None:
            pytest.skip("no initdb: cannot start a cluster of our own to restart")
        _CLUSTER = Cluster()
        _CLUSTER.start()
        atexit.register(_CLUSTER.destroy)
    _CLUSTER.wait_ready()
    return _CLUSTER
FAILURES = Path(os.environ.get("SIM_FAILURES", tempfile.gettempdir())) / "saga-conformance"
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + (
    [Phase.shrink] if os.environ.get("SIM_SHRINK", "1") != "0" else [])

if MINUTES:
    CASES = model.cases(max_steps=30, long_chain=300, horizon=20.0, churn=True)
    BUDGET = hsettings(max_examples=max(1, int(MINUTES * 8)), deadline=None, database=None,
                       phases=PHASES, suppress_health_check=list(HealthCheck))
else:
    CASES = model.cases(max_steps=12, long_chain=0, horizon=5.0)
    BUDGET = hsettings(max_examples=EXAMPLES, deadline=None, database=None, phases=PHASES,
                       suppress_health_check=list(HealthCheck))


@contextmanager
def fresh_store(store: str) -> Iterator[Settings]:
    """A store of its own for one case: a SQLite file, or a PostgreSQL schema."""
    if store == "pgrestart":
        yield Settings(database_url=cluster().url, schema=f"sim_{uuid.uuid4().hex[:10]}",
                       actor="sim")
        return
    if store == "postgres":
        from tests.conftest import postgres_store
        with postgres_store() as pg:
            yield pg
        return
    home = Path(tempfile.mkdtemp(prefix="saga-sim-"))
    try:
        yield Settings(home=home / ".saga", actor="sim")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def simulate(case: dict[str, Any], store: str) -> None:
    """Drive one case on a fresh store and fail with every violation found."""
    where = FAILURES / f"run-{store}-{case['salt']}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    with fresh_store(store) as settings:
        sim = Simulation(case, settings, where / "work",
                         deadline=240.0 if MINUTES else 60.0,
                         restart=cluster().restart if store == "pgrestart" else None)
        r = sim.cli("db", "init")
        assert r.returncode == 0, r.stderr
        trace = sim.run()
        bad = check(sim, trace)
        if bad:  # keep the histories: the store goes with this block
            for run_id in {trace.run_id, *trace.children}:
                out = sim.cli("history", run_id, "--json").stdout
                (where / f"history-{run_id}.json").write_text(out)
    stats = os.environ.get("SIM_STATS")
    if stats:
        with open(stats, "a", encoding="utf-8") as f:
            f.write(json.dumps({"store": store, "steps": len(case["steps"]),
                                "ops": len(trace.ops), "kills": len(trace.killed),
                                "zombies": len(trace.stopped), "reads": trace.reads,
                                "commands": trace.commands, "restarts": trace.restarts,
                                "failed": bool(bad)}) + "\n")
    if bad:
        saved = FAILURES / f"failed-{store}-{case['salt']}.json"
        saved.write_text(json.dumps(case | {"store": store}, indent=1))
        message = (f"seed {SEED}, store {store}: {len(bad)} violation(s)\n  "
                   + "\n  ".join(bad) + "\n" + describe(case, trace, saved)
                   + f"\nits processes' files: {where}")
        # kept even when a rerun passes (timing decides some breaks): Hypothesis then
        # reports the case as flaky, and this log says what the first run saw
        with open(FAILURES / "violations.log", "a", encoding="utf-8") as f:
            f.write(message + "\n\n")
        raise AssertionError(message)
    if not os.environ.get("SIM_KEEP"):
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.skipif(bool(os.environ.get("SIM_CASE")), reason="replaying SIM_CASE only")
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

    cases = model.cases(max_steps=30, long_chain=300, horizon=20.0, churn=True,
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


@pytest.mark.skipif(bool(os.environ.get("SIM_CASE")), reason="replaying SIM_CASE only")
@pytest.mark.parametrize(("name", "store"), _targeted())
def test_cases_aimed_at_known_breaks(name: str, store: str) -> None:
    simulate(model.TARGETED[name], store)


@pytest.mark.skipif(not os.environ.get("SIM_CASE"), reason="set SIM_CASE to a case.json")
def test_replay_a_saved_case() -> None:
    case = json.loads(Path(os.environ["SIM_CASE"]).read_text())
    store = case.pop("store", "sqlite")
    simulate(case, os.environ.get("SIM_STORE", store))


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
    rejected = {"steps": [act("a"), act("b", confirm="reject")], "rollback": True}
    assert model.expect(rejected).undo == ["a"]
    assert model.expect(rejected, cancelled=True).statuses == {"cancelled"}
