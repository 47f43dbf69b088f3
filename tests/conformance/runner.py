"""The conformance simulator's runner: budgets, stores, one case end to end, and a replay
of a saved case from the command line::

    python -m tests.conformance.runner CASE.json [--store sqlite|postgres|pgrestart]

(``ops/conformance.sh --case CASE.json`` does this.) The environment variables are those
of :mod:`tests.conformance.test_conformance`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase
from hypothesis import settings as hsettings

from saga.config import Settings
from tests.conformance import model, revisions_check
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
    CASES = model.cases(max_steps=30, long_chain=300, horizon=8.0, churn=True)
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
    # The process's own folder: two simulations on one machine (CI beside a long run)
    # share salts, and one would clear the other's ledger and files under it.
    where = FAILURES / f"run-{store}-{case['salt']}-{os.getpid()}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    with fresh_store(store) as settings:
        sim = Simulation(case, settings, where / "work",
                         deadline=240.0 if MINUTES else 60.0,
                         restart=cluster().restart if store == "pgrestart" else None)
        r = sim.cli("db", "init")
        assert r.returncode == 0, r.stderr
        trace = sim.run()
        bad = check(sim, trace) + revisions_check.check(sim, trace)
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
                                "recoveries": trace.recoveries,
                                "migrations": len(sim.rev.migrations),
                                "resets": len(sim.rev.resets), "labels": sim.rev.labelled,
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




def main() -> int:
    """Replay one saved case (its message named the file); exit 1 on a violation."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", type=Path)
    parser.add_argument("--store", choices=["sqlite", "postgres", "pgrestart"])
    args = parser.parse_args()
    case = json.loads(args.case.read_text())
    store = args.store or case.pop("store", "sqlite")
    case.pop("store", None)
    try:
        simulate(case, store)
    except AssertionError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"case {args.case} on {store}: every invariant holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
