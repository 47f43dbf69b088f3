"""How long one ``saga run`` takes from the shell, process start to exit (issue 15: a
3-step run from the CLI, target ≤ 0.3 s). Runs ``python -m saga.cli run flow.yaml`` (3
noop steps chained by ``depends_on``) N times on the default SQLite store in a fresh
directory, beside ``python -c pass`` and ``saga --help`` as floors, interleaved, and
prints the median [min..max] of each with the load average before and after.

Bytecode caches are written and used, as after ``pip install`` (a ``PYTHONDONTWRITEBYTECODE``
in the environment is dropped for the commands): without them every start compiles saga's
sources again, which costs more than most of the imports this measures.

    python ops/bench/cli_start.py                 # 11 samples each
    python ops/bench/cli_start.py 21              # more samples
    python ops/bench/cli_start.py 11 --root DIR   # another checkout of saga (a baseline)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FLOW = """name: cli-bench
steps:
  - {id: s0, tool: noop}
  - {id: s1, tool: noop, depends_on: [s0]}
  - {id: s2, tool: noop, depends_on: [s1]}
"""


def timed(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one command, which must succeed.
    CPU time moves less than wall time when other jobs share the CPUs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def summary(samples: list[float]) -> str:
    """``median [min..max]`` in seconds."""
    return f"{statistics.median(samples):.3f} s [{min(samples):.3f}..{max(samples):.3f}]"


def main(n: int, root: Path) -> None:
    """Sample each command ``n`` times, interleaved, and print the summaries."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "flow.yaml").write_text(FLOW, encoding="utf-8")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("SAGA_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPATH"] = str(root)
        commands = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "saga --help": [sys.executable, "-m", "saga.cli", "--help"],
            "saga run flow.yaml (3 steps)": [sys.executable, "-m", "saga.cli", "run",
                                             "flow.yaml"],
        }
        # creates the store, and the bytecode caches of what a run imports
        timed(commands["saga run flow.yaml (3 steps)"], tmp, env)
        load = os.getloadavg()
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(n):
            for name, cmd in commands.items():
                samples[name].append(timed(cmd, tmp, env))
        after = os.getloadavg()
    print(f"{root}: {n} samples each, load average {load[0]:.2f} before, {after[0]:.2f} after, "
          f"{os.cpu_count()} CPUs")
    print(f"  {'':30} {'wall':26} cpu (user + system)")
    for name, values in samples.items():
        wall, cpu = [v[0] for v in values], [v[1] for v in values]
        print(f"  {name:30} {summary(wall):26} {summary(cpu)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="?", type=int, default=11)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()
    main(args.samples, args.root.resolve())
