"""Instructions per step of the engine alone, or per run of a worker, counted by valgrind
(callgrind): a measure of saga's own CPU that noise on a shared machine cannot move.

Wall and CPU times on this machine swing by a third from one hour to the next (other
tenants, CPU steal), so a change worth 3% of a step cannot be told apart from the noise
by timing it. Counting instructions can: the same code runs the same instructions,
whatever else the machine does (repeats agree within about 1%).

What is counted by default: chains of 20 noop steps driven by ``Saga.run`` on SQLite,
with each turn's events collected instead of appended (as ``bench.py``'s "engine alone"):
no event reaches the store, though each run's lease is still claimed and released there
(spread over its 20 steps). The process runs twice under callgrind, once with ``--runs``
chains more than the other (both warm up the same); the difference over the steps is
what one step costs, imports and start-up cancelled out.

With ``--worker C``: a worker process (``Saga.worker_loop(concurrency=C)`` run until
idle, as ``saga worker --until-idle`` runs it) draining ``bench.py``'s chains of 3 noop
steps from PostgreSQL, the work the drains of ``bench.py``'s targets time. The runs are
submitted by a process of their own, not counted; the drain runs twice under callgrind,
over 128 runs and over 384 (each in a schema ``instr_<random>`` of its own, dropped
after), and the difference over 256 runs is one run's cost to the worker: reading it
from the log, claiming and reading it, its 7 events' share of the group commits, its
share of the looks. Every thread of the worker is counted; the server's work and the
waits are not. Under callgrind the worker runs some 50 times slower, so what the clock
paces (the log read at most every 50 ms, lease renewals) happens at every look, or more
often than in a timed drain.

Usage::

    python ops/bench/instructions.py [--runs 20] [--saga ROOT ...]
    python ops/bench/instructions.py --worker C [--saga ROOT ...] [--pg-url URL]

``--saga`` names a checkout of saga to count (given more than once, each in turn: for a
before and after). Needs ``valgrind`` (Debian: ``apt-get install valgrind``); each count
of the engine takes 15–30 s, a worker's about 50 s at concurrency 64 and 70 s at 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from bench import DEFAULT_PG_URL, SHAPES

ROOT = Path(__file__).resolve().parents[2]
#: The two drains of ``--worker``, in runs: their difference is what is counted.
WORKER_RUNS = (128, 384)

#: Run inside callgrind: warm up, then ``N`` more runs of the composition (both from the
#: environment: ``bench.py``'s chain of 20).
DRIVER = """
import json, os, tempfile
from pathlib import Path
import saga as saga_package
from saga.api import Saga
from saga.config import Settings
from saga.tools import load_registry

from saga.tools import Tool


def noop_thread(params, ctx):  # an ordinary Python tool: run in the tool threads
    return None


registry = load_registry([])
registry.add(Tool("noop_thread", noop_thread, source="python:bench"))
saga = Saga(Settings(home=Path(tempfile.mkdtemp()), actor="bench"), registry=registry,
            worker="bench")
plan = saga.load(json.loads(os.environ["SAGA_BENCH_PLAN"]))
if not os.environ.get("SAGA_BENCH_STORED"):  # the engine alone: nothing appended
    saga.app.save_run = lambda run, claim=None, release=None: run.collect_events()
for _ in range(3 + int(os.environ["SAGA_BENCH_RUNS"])):
    run = saga.run(plan, {})
    assert run.status == "completed", run.status
print("saga from", Path(saga_package.__file__).parent)
"""


#: The worker counted by ``--worker``: drains the runs of schema ``argv[1]`` at concurrency
#: ``argv[2]`` (the runs were submitted by SUBMIT, in a process not counted).
WORKER = """
import sys
from pathlib import Path
import saga as saga_package
from saga.api import Saga
from saga.config import Settings
from saga.tools import load_registry

settings = Settings(database_url=sys.argv[3], schema=sys.argv[1], actor="bench")
with Saga(settings, registry=load_registry([])) as saga:
    worker = saga.worker_loop(concurrency=int(sys.argv[2]), poll_interval=0.05)
    worker.run(until_idle=True)
print("drove", worker.driven)
print("saga from", Path(saga_package.__file__).parent)
"""

#: Submits ``argv[2]`` runs of the composition in ``SAGA_BENCH_PLAN`` (``bench.py``'s chain
#: of 3) to schema ``argv[1]``.
SUBMIT = """
import json, os, sys
from saga.api import Saga
from saga.config import Settings
from saga.tools import load_registry

settings = Settings(database_url=sys.argv[3], schema=sys.argv[1], actor="bench")
with Saga(settings, registry=load_registry([])) as saga:
    plan = saga.load(json.loads(os.environ["SAGA_BENCH_PLAN"]))
    for _ in range(int(sys.argv[2])):
        saga.submit(plan, {})
    saga.leases  # the side tables exist before the worker starts
"""


def callgrind(script: str, args: list[str], env: dict[str, str], saga_root: Path,
              expect: str = "") -> int:
    """Instructions (callgrind's ``Ir``) of ``python -c script args``, every thread."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, "-c", script, *args],
        env=env, capture_output=True, text=True, check=False, cwd="/")
    found = re.search(r"Collected\s*:\s*(\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"callgrind failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    # An installed saga (an editable install's import hook) would answer for a checkout
    # that is not a package: say so instead of counting it.
    if f"saga from {saga_root / 'saga'}\n" not in done.stdout:
        raise SystemExit(f"{saga_root} was not the saga imported: {done.stdout.strip()}")
    if expect not in done.stdout:
        raise SystemExit(f"the counted process did not do its work (expected {expect!r}): "
                         f"{done.stdout.strip()}")
    return int(found.group(1))


def count_worker(saga_root: Path, runs: int, concurrency: int, url: str) -> int:
    """Instructions of a worker draining ``runs`` chains of 3 steps from a new schema."""
    import psycopg
    env = {**os.environ, "PYTHONPATH": str(saga_root), "PYTHONHASHSEED": "0",
           "SAGA_BENCH_PLAN": json.dumps(SHAPES["chain3"])}
    schema = f"instr_{uuid.uuid4().hex[:10]}"
    try:
        subprocess.run([sys.executable, "-c", SUBMIT, schema, str(runs), url], env=env,
                       check=True, cwd="/")
        return callgrind(WORKER, [schema, str(concurrency), url], env, saga_root,
                         expect=f"drove {runs}\n")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def count(saga_root: Path, runs: int, shape: str = "chain20", stored: bool = False) -> int:
    """Instructions (callgrind's ``Ir``) of the driver with ``runs`` extra chains."""
    env = {**os.environ, "PYTHONPATH": str(saga_root), "PYTHONHASHSEED": "0",
           "SAGA_BENCH_RUNS": str(runs), "SAGA_BENCH_PLAN": json.dumps(SHAPES[shape]),
           **({"SAGA_BENCH_STORED": "1"} if stored else {})}
    return callgrind(DRIVER, [], env, saga_root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20,
                        help="chains of 20 steps counted (the difference of two processes; "
                             "not used with --worker)")
    parser.add_argument("--saga", action="append", type=Path,
                        help="a checkout of saga to count (default: this one); repeatable")
    parser.add_argument("--worker", type=int, metavar="C",
                        help="count a worker draining 3-step chains from PostgreSQL at "
                             "concurrency C, per run, instead of the engine alone")
    parser.add_argument("--tool", choices=("noop", "thread", "both"), default="noop",
                        help="the engine alone's steps: noop (a coroutine, run on the event "
                             "loop), thread (an ordinary function, run in the tool threads) "
                             "or both, each counted in turn (default: noop)")
    parser.add_argument("--stored", action="store_true",
                        help="append each turn's events to the SQLite store (its commits' "
                             "instructions counted too; the disk's waits are not)")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL,
                        help="the server --worker uses (a schema instr_<random> each count)")
    args = parser.parse_args(argv)
    if args.worker is not None and args.worker < 1:
        parser.error("--worker takes a concurrency of 1 or more")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    for root in [r.resolve() for r in args.saga or [ROOT]]:
        if args.worker is not None:
            fewer, more = WORKER_RUNS
            base = count_worker(root, fewer, args.worker, args.pg_url)
            counted = count_worker(root, more, args.worker, args.pg_url)
            print(f"{root}: {(counted - base) / (more - fewer):,.0f} instructions per run "
                  f"(a worker at concurrency {args.worker}, chains of 3 noop steps on "
                  "PostgreSQL)")
            continue
        counted: dict[str, float] = {}
        for tool in ("noop", "thread") if args.tool == "both" else (args.tool,):
            shape = "chain20" if tool == "noop" else "chain20_threads"
            base = count(root, 0, shape, args.stored)
            more = count(root, args.runs, shape, args.stored)
            counted[tool] = (more - base) / (args.runs * len(SHAPES[shape]["steps"]))
            print(f"{root}: {counted[tool]:,.0f} instructions per {tool} step "
                  f"({args.runs} chains of 20, "
                  f"{'stored on SQLite' if args.stored else 'engine alone'})")
        if len(counted) == 2:
            print(f"{root}: a step on the tool threads costs "
                  f"{counted['thread'] / counted['noop']:.3f}× one run inline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
