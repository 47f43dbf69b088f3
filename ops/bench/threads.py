"""Tools on threads (issue 44): the bench's headline rows with ``noop``, which runs inline
on the event loop, beside the same rows with an ordinary Python tool, a plain function
the executor calls in its tool threads (``bench.THREAD_TOOL``).

    python ops/bench/threads.py                       # SQLite and PostgreSQL, 7 repeats
    python ops/bench/threads.py --stores sqlite --repeats 5

Each repeat samples, in a shuffled order, on each store: the chain of 3 and the chain of
20 with each tool (with their commits, and the engine alone: events collected, nothing
appended), and the store's commit floor, as ``bench.py``'s section 1 does. Prints ms per
step, ms per run, ms per step ÷ commit floor, and the ratio of a step on the threads to
the same step inline in the same repeat (the goal: ≤ 1.15×), median [min..max]. Times on
a loaded machine move together more than they move apart, so trust the ratios; the
instruction counts of the same comparison (``python ops/bench/instructions.py --tool
both``) do not move with the load at all.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench
from bench import INLINE_OF, SHAPE_TITLES, med, run_batch, spread

SHAPES = ("chain3", "chain3_threads", "chain20", "chain20_threads")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--pg-url", default=bench.DEFAULT_PG_URL)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    runs = {**bench.DEFAULT.runs}
    load_before = os.getloadavg()[0]
    names = [s.strip() for s in args.stores.split(",") if s.strip()]
    samples: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    floors: dict[str, list[float]] = {}
    ratios: dict[tuple[str, str], list[float]] = {}
    with bench.open_stores(names, bench.bench_registry(), args.pg_url) as stores:
        for store in stores:  # warm: each shape once, and the floor
            for shape in SHAPES:
                run_batch(store, shape, 1)
            store.floor(20)
        for r in range(args.repeats):
            bench.log(f"threads repeat {r + 1}/{args.repeats}")
            tasks: list[tuple[Any, str, str]] = [(s, "floor", "") for s in stores]
            tasks += [(s, kind, shape) for s in stores for shape in SHAPES
                      for kind in ("stored", "alone")]
            rng.shuffle(tasks)
            floor: dict[str, float] = {}
            for store, kind, shape in tasks:
                if kind == "floor":
                    floor[store.name] = store.floor(200) * 1000
                    floors.setdefault(store.name, []).append(floor[store.name])
                    continue
                samples.setdefault((store.name, shape, kind), []).append(
                    run_batch(store, shape, runs[shape], stored=kind == "stored"))
            for store in stores:
                for shape, inline in INLINE_OF.items():
                    for kind in ("stored", "alone"):
                        pool, own = (samples[store.name, s, kind][-1]["ms_per_step"]
                                     for s in (shape, inline))
                        ratios.setdefault((store.name, shape + " " + kind), []).append(
                            pool / own)
    print(f"{args.repeats} repeats, load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after, {os.cpu_count()} CPUs; median [min..max]\n")
    print("| store | composition | ms/run | ms/step | ms/step ÷ commit floor "
          "| engine alone, ms/step |\n|---|---|---:|---:|---:|---:|")
    for name, shape in ((n, s) for n in names for s in SHAPES):
        xs, alone = samples[name, shape, "stored"], samples[name, shape, "alone"]
        print(f"| {name} | {SHAPE_TITLES[shape]} | {spread([x['ms_per_run'] for x in xs])} "
              f"| {spread([x['ms_per_step'] for x in xs])} "
              f"| {spread([x['ms_per_step'] / med(floors[name]) for x in xs])} "
              f"| {spread([x['ms_per_step'] for x in alone])} |")
    print("\nA step on the tool threads ÷ the same step inline (same repeat; goal ≤ 1.15×):\n")
    print("| store | composition | with its commits | the engine alone |\n|---|---|---:|---:|")
    for name in names:
        for shape, inline in INLINE_OF.items():
            print(f"| {name} | {SHAPE_TITLES[inline]} "
                  f"| {spread(ratios[name, shape + ' stored'])}× "
                  f"| {spread(ratios[name, shape + ' alone'])}× |")
    print("\nCommit floor ms: " + ", ".join(f"{n} {spread(f)}" for n, f in floors.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
