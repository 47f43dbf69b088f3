"""How the scheduler's cost grows with the number of steps (issue: 1,000 steps took
10.7 s). Runs a chain of N noop steps in process on SQLite and reports the seconds to load
and to run, and the run's seconds per step.

    python ops/bench/decide_scale.py 500 1000 2000
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from saga import Saga
from saga.config import Settings


def measure(n: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as home, Saga(Settings(home=Path(home))) as saga:
        started = time.perf_counter()
        plan = saga.load({"name": "chain", "steps": [{"id": f"s{i}", "tool": "noop"}
                                                     for i in range(n)]})
        loaded = time.perf_counter()
        run = saga.run(plan)
        assert run.status == "completed"
        return loaded - started, time.perf_counter() - loaded


def main(sizes: list[int]) -> None:
    print(f"{'steps':>7} {'load s':>8} {'run s':>8} {'ms/step':>8}")
    for n in sizes:
        load, run = measure(n)
        print(f"{n:>7} {load:>8.2f} {run:>8.2f} {1000 * run / n:>8.2f}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [250, 500, 1000, 2000])
