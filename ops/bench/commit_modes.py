"""Commit modes: appends that wait for the WAL flush (the default) against ``no-wait``
(``SAGA_PG_COMMIT=no-wait``), interleaved in one process on PostgreSQL.

Usage::

    python ops/bench/commit_modes.py [--repeats 7] [--pg-url URL]

Two measurements, each alternating the modes repeat by repeat (the order flips every
repeat), on fresh schemas dropped afterwards:

* **append**: the recorder's own insert of 4 events (one new aggregate each), 200 per
  repeat, from 1 thread and from 4 threads: ms of wall time per insert.
* **sequential runs**: a 3-step noop chain run to completion with ``Saga.run``, 40 per
  repeat, one after another in one process: runs/s.

Reported: medians [min..max], and the per-repeat ratio no-wait ÷ wait. For a worker's
drain, use ``drain.py --commit wait,no-wait``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

DEFAULT_PG_URL = os.environ.get("SAGA_BENCH_DATABASE_URL",
                                "postgresql://postgres@127.0.0.1:5432/test")
MODES = ("wait", "no-wait")
CHAIN = {"name": "commit-chain-3", "steps": [
    {"id": f"s{i}", "tool": "noop", "depends_on": [f"s{i - 1}"] if i else []}
    for i in range(3)]}


def _interleaved(repeats: int, once: Callable[[str], float],
                 opened: Iterable[Any]) -> dict[str, list[float]]:
    """``once(mode)`` per repeat and mode, the order flipping every repeat, after a
    warm-up of each mode; closes what was ``opened`` for it in the end."""
    try:
        for mode in MODES:
            once(mode)
        samples: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(repeats):
            for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                samples[mode].append(once(mode))
        return samples
    finally:
        for thing in opened:
            thing.close()


def _report(title: str, unit: str, samples: dict[str, list[float]], digits: int) -> None:
    print(f"\n{title}\n\n| commit | {unit} |\n|---|---:|")
    for mode, xs in samples.items():
        print(f"| {mode} | {statistics.median(xs):.{digits}f} "
              f"[{min(xs):.{digits}f}..{max(xs):.{digits}f}] |")
    ratios = [b / a for a, b in zip(samples["wait"], samples["no-wait"], strict=True)]
    print(f"| no-wait ÷ wait, per repeat | {statistics.median(ratios):.2f} "
          f"[{min(ratios):.2f}..{max(ratios):.2f}] |")


def appends(url: str, schema: str, repeats: int, threads: int) -> dict[str, list[float]]:
    """ms per 4-event insert, for each mode."""
    from eventsourcing.persistence import StoredEvent

    from saga.config import Settings
    from saga.store.application import SagaApplication
    apps = {m: SagaApplication(Settings(database_url=url, schema=schema, pg_commit=m,
                                        pool_size=threads)) for m in MODES}

    def once(mode: str) -> float:
        recorder: Any = apps[mode].recorder
        per_thread = 200 // threads

        def work() -> None:
            for _ in range(per_thread):
                oid = uuid.uuid4()
                recorder.insert_events([StoredEvent(oid, v, "bench", b"x" * 200)
                                        for v in range(1, 5)])
        pool = [threading.Thread(target=work) for _ in range(threads)]
        started = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return (time.perf_counter() - started) / (per_thread * threads) * 1000
    return _interleaved(repeats, once, apps.values())


def sequential_runs(url: str, schemas: dict[str, str], repeats: int) -> dict[str, list[float]]:
    """Sequential 3-step runs per second, for each mode."""
    from saga.api import Saga
    from saga.config import Settings
    from saga.tools import load_registry
    sagas = {m: Saga(Settings(database_url=url, schema=schemas[m], actor="bench",
                              pg_commit=m), registry=load_registry([])) for m in MODES}
    plans = {m: s.load(CHAIN) for m, s in sagas.items()}

    def once(mode: str) -> float:
        started = time.perf_counter()
        for _ in range(40):
            if sagas[mode].run(plans[mode]).status != "completed":
                raise SystemExit("a run did not complete")
        return 40 / (time.perf_counter() - started)
    return _interleaved(repeats, once, sagas.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    args = parser.parse_args(argv)
    import psycopg
    schemas = [f"commit_{uuid.uuid4().hex[:10]}" for _ in range(3)]
    try:
        for threads in (1, 4):
            _report(f"append, 4 events, {threads} thread(s), {args.repeats} interleaved "
                    "repeats (median [min..max])", "ms per insert",
                    appends(args.pg_url, schemas[0], args.repeats, threads), 3)
        _report(f"sequential 3-step runs, one process, {args.repeats} interleaved repeats",
                "runs/s", sequential_runs(args.pg_url, dict(zip(MODES, schemas[1:],
                                                                strict=True)),
                                          args.repeats), 0)
    finally:
        with psycopg.connect(args.pg_url, autocommit=True) as conn:
            for schema in schemas:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


if __name__ == "__main__":
    sys.exit(main())
