"""How the scheduler's cost grows with the number of steps (issue: 1,000 steps took
10.7 s, 10,000 did not finish in 240 s). Runs a chain of N noop steps in process on
SQLite and reports the seconds to load and to run, and the run's milliseconds per step:
flat when each decision costs what changed, growing with N when it costs the whole run.

    python ops/bench/decide_scale.py                 # 1,000 2,000 5,000 10,000: ~3 min
    python ops/bench/decide_scale.py 500 1000 2000
"""

from __future__ import annotations

import os
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
    # The machine's load average (1 min) as each size starts: other work slows a run.
    print(f"{'steps':>7} {'load s':>8} {'run s':>8} {'ms/step':>8} {'loadavg':>8}")
    for n in sizes:
        busy = os.getloadavg()[0]
        load, run = measure(n)
        print(f"{n:>7} {load:>8.2f} {run:>8.2f} {1000 * run / n:>8.2f} {busy:>8.2f}",
              flush=True)


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [1000, 2000, 5000, 10000])
