"""How long a run waits after its worker is SIGKILLed in the middle of a step, with the
default settings (issue 44: target ≤ 1 s; it was the lease, 30 s).

Each sample starts real ``saga worker`` processes (default lease and poll, ids given),
submits one run whose first step takes a few seconds, SIGKILLs the worker whose tool
call it is as soon as the call starts, and reads from the run's events when the step
started again (``StepStarted`` of the retry's timestamp minus the time of the kill).
Three ways:

- ``postgres``: two workers; the second, live all along, takes the step over;
- ``sqlite-same-id``: one worker; the same ``--id`` is started again right after the kill
  (the figure includes the new process's start, mostly its imports; the last column is
  the part after it: from the restarted worker's ``worker ID on ...`` line, its store
  open, to the retry's start);
- ``sqlite``: two workers; the second takes the step over.

Prints the median [min..max] of each, in seconds and as a ratio to the lease, and the
load average before and after (the machine is shared: trust ratios more than times).

    python ops/bench/recovery.py                     # 5 samples of each
    python ops/bench/recovery.py 3 --modes postgres
    PYTHONPATH=/tmp/before python ops/bench/recovery.py 1 --deadline 60   # an old checkout

The PostgreSQL server is ``$SAGA_BENCH_DATABASE_URL`` or
``postgresql://postgres@127.0.0.1:5432/test``; each sample makes a schema of its own and
drops it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from saga import Saga  # noqa: E402
from saga.config import Settings, load_settings  # noqa: E402

TOOLS = "tests.standins.churn_tools"  # "work": logs its call (with its pid), then sleeps
MODES = ("postgres", "sqlite-same-id", "sqlite")
DEFINITION = {"name": "recovery-bench", "steps": [
    {"id": "a", "tool": "work", "args": {"seconds": 4.0}},
    {"id": "b", "tool": "work", "args": {"seconds": 0.01}}]}


def worker(env: dict[str, str], worker_id: str,
           ready: list[float] | None = None) -> subprocess.Popen[bytes]:
    """A ``saga worker`` with the default lease and poll, importing saga from the
    environment's ``PYTHONPATH`` (``-m`` would put its working directory first);
    ``ready`` gets the time it says it has opened the store (its ``worker ID on ...``
    line), before its first look."""
    proc = subprocess.Popen([sys.executable, "-m", "saga.cli", "worker", "--tools", TOOLS,
                             "--id", worker_id], cwd=env["SAGA_HOME"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if ready is not None and not ready and line.startswith(b"worker "):
                ready.append(time.time())
    threading.Thread(target=read, daemon=True).start()
    return proc


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()] \
        if log.exists() else []


def wait(condition: Any, seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return found


def sample(mode: str, url: str, deadline: float) -> tuple[float, float | None, float]:
    """One kill: seconds from the kill to the step's start again, from the restarted
    process's store being open to it (same id only), and the lease's length."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "calls.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
        env |= {"SAGA_HOME": str(Path(tmp) / ".saga"), "SAGA_TEST_CHURN_LOG": str(log),
                "PYTHONPATH": os.pathsep.join(p for p in [env.get("PYTHONPATH"), str(ROOT)]
                                              if p)}
        if mode == "postgres":
            env |= {"SAGA_DATABASE_URL": url,
                    "SAGA_DATABASE_SCHEMA": f"bench_recovery_{uuid.uuid4().hex[:8]}"}
        Path(env["SAGA_HOME"]).mkdir()
        settings = load_settings(env, cwd=Path(tmp))
        ids = ["w1"] if mode == "sqlite-same-id" else ["w1", "w2"]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with Saga(settings, tools=[TOOLS]) as saga:
                procs = [worker(env, i) for i in ids]
                time.sleep(1.0)  # (each worker's import and first look; not timed)
                run_id = saga.submit(saga.load(DEFINITION)).run_id
                pid = wait(lambda: next((c["pid"] for c in calls(log)
                                         if c["kind"] == "call"), None), 60, "the call")
                killed = time.time()
                os.kill(pid, signal.SIGKILL)
                ready: list[float] = []
                if mode == "sqlite-same-id":
                    procs.append(worker(env, "w1", ready))
                retry = wait(lambda: [e for e in saga.history(run_id)
                                      if e["type"] == "StepStarted"][1:], deadline,
                             "the step to start again")[0]
                again = datetime.fromisoformat(retry["timestamp"]).timestamp()
                if ready:
                    wait(lambda: ready, 5, "the restarted worker's line")
                return (again - killed, again - ready[0] if ready else None,
                        settings.lease_seconds)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(30)
            if mode == "postgres":
                drop(url, settings)


def drop(url: str, settings: Settings) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{settings.schema}" CASCADE')


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s [{min(values):.2f}..{max(values):.2f}]"


def main(n: int, modes: list[str], url: str, deadline: float) -> None:
    load = os.getloadavg()
    found: dict[str, list[tuple[float, float | None, float]]] = {m: [] for m in modes}
    for _ in range(n):
        for mode in modes:  # interleaved
            found[mode].append(sample(mode, url, deadline))
            print(f"[recovery] {mode}: {found[mode][-1][0]:.3f} s", file=sys.stderr)
    after = os.getloadavg()
    print(f"kill -9 mid-step to the step's start again, {n} samples each, median "
          f"[min..max]; load average {load[0]:.2f} before, {after[0]:.2f} after, "
          f"{os.cpu_count()} CPUs")
    print("\n| way | kill → restart | ÷ lease | restarted worker's store open → restart |")
    print("| --- | --- | --- | --- |")
    for mode, values in found.items():
        took = [v[0] for v in values]
        ratio = statistics.median(v[0] / v[2] for v in values)
        starts = [v[1] for v in values if v[1] is not None]
        print(f"| {mode} | {summary(took)} | {ratio:.3f} (lease {values[0][2]:.0f} s) | "
              f"{summary(starts) if starts else '–'} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", nargs="?", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"which of {', '.join(MODES)} (comma-separated)")
    parser.add_argument("--pg-url", default=os.environ.get(
        "SAGA_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--deadline", type=float, default=20.0,
                        help="seconds to wait for the restart before giving up")
    args = parser.parse_args()
    main(args.samples, args.modes.split(","), args.pg_url, args.deadline)
