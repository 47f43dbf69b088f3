"""How long one ``saga run`` and one ``saga status`` take from the shell, process start to
exit (issue 15: a 3-step run from the CLI, target ≤ 0.3 s; issue 44: ``saga status``
≤ 0.25 s). Runs ``python -m saga.cli run flow.yaml`` (3 noop steps chained by
``depends_on``) and ``python -m saga.cli status RUN`` (of a run made first) N times on the
default SQLite store in a fresh directory, beside ``python -c pass`` and ``saga --help``
as floors, interleaved, and prints the median [min..max] of each, its ratio to
``python -c pass``, the modules each command imported, and the load average before and
after.

Bytecode caches are written and used, as after ``pip install`` (a ``PYTHONDONTWRITEBYTECODE``
in the environment is dropped for the commands): without them every start compiles saga's
sources again, which costs more than most of the imports this measures.

    python ops/bench/cli_start.py                 # 11 samples each
    python ops/bench/cli_start.py 21              # more samples
    python ops/bench/cli_start.py 11 --root OLD --root .   # two checkouts, interleaved
"""

from __future__ import annotations

import argparse
import json
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


def main(n: int, roots: list[Path]) -> None:
    """Sample each command of each checkout ``n`` times, interleaved, and print the
    summaries."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "flow.yaml").write_text(FLOW, encoding="utf-8")
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("SAGA_") and k != "PYTHONDONTWRITEBYTECODE"}
        commands: dict[str, tuple[list[str], dict[str, str]]] = {
            "python -c pass": ([sys.executable, "-c", "pass"], base)}
        for root in roots:
            env = {**base, "PYTHONPATH": str(root),
                   "SAGA_HOME": str(Path(tmp, f".saga-{len(commands)}"))}
            label = f" ({root})" if len(roots) > 1 else ""
            commands[f"saga --help{label}"] = ([sys.executable, "-m", "saga.cli", "--help"], env)
            run = [sys.executable, "-m", "saga.cli", "run", "flow.yaml"]
            commands[f"saga run flow.yaml{label}"] = (run, env)
            timed(run, tmp, env)  # creates the store, and the bytecode caches of a run
            made = subprocess.run([*run, "--json"], cwd=tmp, env=env, check=True,
                                  capture_output=True, text=True)
            status = [sys.executable, "-m", "saga.cli", "status",
                      json.loads(made.stdout)["run_id"]]
            commands[f"saga status RUN{label}"] = (status, env)
            timed(status, tmp, env)
        load = os.getloadavg()
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(n):
            for name, (cmd, env) in commands.items():
                samples[name].append(timed(cmd, tmp, env))
        after = os.getloadavg()
        imported = {name: modules(cmd, tmp, env) for name, (cmd, env) in commands.items()}
    floor = statistics.median(v[0] for v in samples["python -c pass"])
    print(f"{n} samples each, load average {load[0]:.2f} before, {after[0]:.2f} after, "
          f"{os.cpu_count()} CPUs; median [min..max]")
    width = max(len(name) for name in samples)
    print(f"  {'':{width}} {'wall':26} {'÷ python -c pass':17} {'cpu (user + system)':26} "
          "modules")
    for name, values in samples.items():
        wall, cpu = [v[0] for v in values], [v[1] for v in values]
        ratio = f"{statistics.median(wall) / floor:.1f}×"
        print(f"  {name:{width}} {summary(wall):26} {ratio:17} {summary(cpu):26} "
              f"{imported[name]}")


def modules(cmd: list[str], cwd: str, env: dict[str, str]) -> int:
    """How many modules ``cmd`` (a ``python ...`` command) imports, counted by
    ``-X importtime`` (one line per module imported, the interpreter's own included)."""
    done = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=cwd, env=env,
                          check=True, capture_output=True, text=True)
    return sum(1 for line in done.stderr.splitlines() if line.startswith("import time:")) - 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="?", type=int, default=11)
    parser.add_argument("--root", type=Path, action="append",
                        help="a checkout of saga to measure (repeatable, interleaved; "
                             "default: this one)")
    args = parser.parse_args()
    main(args.samples, [r.resolve() for r in args.root or [ROOT]])
