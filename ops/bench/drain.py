"""Drain benchmark: submit N runs of a K-step noop chain, then time worker processes
draining them (every run driven to completion) on PostgreSQL.

Usage::

    python ops/bench/drain.py [--runs 300] [--steps 5] [--workers 1,4] [--concurrency 64]
                              [--repeats 3] [--pg-url URL] [--recorder xid|library]
                              [--partitions URL,URL...] [--commit wait[,no-wait]] [--apart]

With ``--partitions``, every worker count drains twice per repeat: into the first URL
alone, and into a store partitioned over all of them (README, Partitioned stores).

Each repeat and worker count gets a fresh schema ``drain_<random>`` (dropped after): the
runs are submitted first (not timed), then the worker processes are spawned, connect, wait
at a barrier, and drain with ``Worker.run(until_idle=True)``; the wall time is from the
barrier to the last worker's report that its ``Worker.run`` returned (the child
processes' exit is timed apart, ``exit_s``: a worker that reported waits, its connections
open, until the parent has read the server's CPU). Reported: runs/s and events/s
(median [min..max]), the CPU per run of the worker processes and of a local server's
processes (from /proc; 0 for a remote server), how busy the whole machine was (every CPU,
from /proc/stat), and the ratio to the first worker count, per repeat, interleaved: a
ratio short of the worker count with the machine near 100% busy is a CPU ceiling, not a
lock. Each repeat's line
shows the drives each worker ended (a worker that claimed nothing shows 0). Every run is checked
``completed`` at the end and every run's events counted once. ``--commit wait,no-wait``
interleaves the two commit modes (``SAGA_PG_COMMIT``) too, ratios against the first.
``--apart`` adds, for each worker count above 1, a drain where every worker process has
a schema of its own holding an equal share of the runs: the processes then share the
machine and the server, but no table, lease or log. Its ratio to one worker is what the
machine allows; the shared drain's ratio beside it shows what sharing one store costs.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time
import uuid
from typing import Any

DEFAULT_PG_URL = os.environ.get("SAGA_BENCH_DATABASE_URL",
                                "postgresql://postgres@127.0.0.1:5432/test")


def chain(n: int) -> dict[str, Any]:
    """A chain of ``n`` noop steps."""
    return {"name": f"drain-chain-{n}", "steps": [
        {"id": f"s{i}", "tool": "noop", "depends_on": [f"s{i - 1}"] if i else []}
        for i in range(n)]}


def _settings(urls: tuple[str, ...], schema: str, recorder: str,
              commit: str = "wait") -> Any:
    """One database, or a store partitioned over several."""
    from saga.config import Settings
    return Settings(database_url=urls[0], partitions=urls if len(urls) > 1 else (),
                    schema=schema, actor="drain", pool_size=2, max_overflow=4,
                    pg_recorder=recorder, pg_commit=commit)


def _worker(urls: tuple[str, ...], schema: str, recorder: str, commit: str, concurrency: int,
            barrier: Any, out: Any, release: Any) -> None:
    from saga.api import Saga
    from saga.tools import load_registry
    with Saga(_settings(urls, schema, recorder, commit),
              registry=load_registry([])) as saga:
        worker = saga.worker_loop(concurrency=concurrency, poll_interval=0.05)
        worker.index.refresh()
        barrier.wait()
        cpu = time.process_time()
        worker.run(until_idle=True)
        out.put((worker.driven, worker.group.commits, time.process_time() - cpu))
        release.wait(timeout=600)  # its backends stay until the server's CPU is read

def _reports(procs: list[Any], out: Any, timeout: float) -> list[Any]:
    """One report per worker process, as each arrives; a process that ended without
    reporting (it raised) fails the drain at once instead of after ``timeout``."""
    reports: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(reports) < len(procs):
        try:  # a report ends the wait at once; the timeout only paces the checks below
            reports.append(out.get(timeout=0.5))
            continue
        except queue.Empty:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(procs) - len(reports)} worker(s) did not report "
                             f"in {timeout:.0f} s")
        if sum(p.exitcode is not None for p in procs) > len(reports):
            with contextlib.suppress(queue.Empty):  # its report may be on the way still
                reports.append(out.get(timeout=1))
                continue
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            raise SystemExit(f"a worker process ended without a report (exit codes {failed})")
    return reports


def _server_cpu() -> float | None:
    """CPU seconds used so far by the local PostgreSQL server's processes (every backend
    alive now, and the server's own), from /proc; None where there is no /proc. A remote
    server's CPU is not seen: the figure is then 0."""
    if not os.path.isdir("/proc"):
        return None
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        name, _, rest = stat.partition(" (")[2].rpartition(") ")
        if name == "postgres":
            fields = rest.split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _busy() -> tuple[float, float]:
    """The machine's CPU seconds so far: busy, and in all (every CPU, from /proc/stat)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / hz, sum(values) / hz


def drain_once(urls: tuple[str, ...], runs: int, steps: int, workers: int, concurrency: int,
               recorder: str, commit: str = "wait", apart: bool = False) -> dict[str, Any]:
    """One drain of ``runs`` runs by ``workers`` processes; seconds and counts. ``apart``:
    each process drains an equal share of the runs in a schema of its own, so the
    processes share the machine and the server but no table, lease or log."""
    import psycopg

    from saga.api import Saga
    from saga.store.partitions import parts_of
    from saga.tools import load_registry
    name = f"drain_{uuid.uuid4().hex[:10]}"
    schemas = [f"{name}_{i}" for i in range(workers)] if apart else [name]
    if runs % len(schemas):  # main() refuses such arguments before any drain
        raise ValueError(f"{runs} runs do not split evenly over {workers} workers")
    ids: dict[str, list[str]] = {}
    try:
        for schema in schemas:
            with Saga(_settings(urls, schema, recorder), registry=load_registry([])) as saga:
                plan = saga.load(chain(steps))
                ids[schema] = [saga.submit(plan, {}).run_id
                               for _ in range(runs // len(schemas))]
                saga.leases  # noqa: B018 - the side tables exist before the workers start
        ctx = mp.get_context("spawn")
        barrier, out, release = ctx.Barrier(workers + 1), ctx.Queue(), ctx.Event()
        procs = [ctx.Process(target=_worker, args=(urls, schemas[i % len(schemas)], recorder,
                                                   commit, concurrency, barrier, out, release))
                 for i in range(workers)]
        for p in procs:
            p.start()
        barrier.wait(timeout=120)
        started = time.perf_counter()
        server, busy = _server_cpu(), _busy()
        # A worker reports as soon as its Worker.run returns; the drain ends with the last
        # report. What follows (its Saga closed, the spawned child's interpreter shutting
        # down) is timed apart as exit_s: the `saga` command skips that shutdown.
        reports = _reports(procs, out, timeout=600)
        seconds = time.perf_counter() - started
        # Before the workers exit: their backends, and what they used, are gone after.
        server_s = None if server is None else _server_cpu() - server  # type: ignore[operator]
        busy_now = _busy()
        machine = (busy_now[0] - busy[0]) / max(busy_now[1] - busy[1], 1e-9)
        release.set()
        released = time.perf_counter()
        for p in procs:
            p.join(timeout=60)
            if p.exitcode is None:
                p.kill()
                raise SystemExit("a worker process did not exit 60 s after its report")
        exit_s = time.perf_counter() - released
        commits = sum(r[1] for r in reports)
        cpu = sum(r[2] for r in reports)  # the worker processes' own, all threads
        done = events = 0
        for schema in schemas:
            with Saga(_settings(urls, schema, recorder), registry=load_registry([])) as saga:
                done += sum(saga.get(i).status == "completed" for i in ids[schema])
                events += sum(len(part.recorder.select_notifications(start=None, limit=10**7))
                              for part in parts_of(saga.app))
        if done != runs:
            raise SystemExit(f"only {done} of {runs} runs completed")
        return {"seconds": seconds, "exit_s": exit_s, "runs_per_s": runs / seconds,
                "events_per_s": events / seconds, "events": events, "commits": commits,
                "cpu_ms_per_run": cpu * 1000 / runs,
                "server_ms_per_run": None if server_s is None else server_s * 1000 / runs,
                "machine_busy": machine,
                "driven": [r[0] for r in reports]}
    finally:
        for url in urls:
            with psycopg.connect(url, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workers", default="1,4")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    parser.add_argument("--recorder", default="xid", choices=["xid", "library"])
    parser.add_argument("--partitions", help="comma-separated URLs: also drain into a "
                                             "store partitioned over them")
    parser.add_argument("--commit", default="wait",
                        help="comma-separated commit modes: wait, no-wait")
    parser.add_argument("--apart", action="store_true",
                        help="also drain with each worker process on its own schema and "
                             "share of the runs (sharing nothing but the machine and the "
                             "server): the scaling the machine allows")
    args = parser.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    uneven = [w for w in counts if args.apart and w > 1 and args.runs % w]
    if uneven:  # before any drain: a long benchmark must not stop half way
        parser.error(f"--apart: {args.runs} runs do not split evenly over {uneven[0]} workers")
    stores: list[tuple[str, ...]] = [(args.pg_url,)]
    if args.partitions:
        urls = tuple(u for u in args.partitions.split(",") if u)
        stores = [urls[:1], urls]
    configs = [(store, m, w, apart) for store in stores for m in args.commit.split(",")
               for w in counts for apart in ((False, True) if args.apart and w > 1
                                             else (False,))]
    samples: dict[tuple[tuple[str, ...], str, int, bool], list[dict[str, Any]]] = {
        c: [] for c in configs}
    for r in range(args.repeats):
        for store, m, w, apart in (configs if r % 2 == 0 else configs[::-1]):  # interleaved
            s = drain_once(store, args.runs, args.steps, w, args.concurrency, args.recorder,
                           m, apart)
            samples[(store, m, w, apart)].append(s)
            print(f"[drain] repeat {r + 1}: {len(store)} database(s), {m}, {w} worker(s)"
                  f"{', apart' if apart else ''}: "
                  f"{s['seconds']:.2f} s, {s['runs_per_s']:.0f} runs/s, "
                  f"{s['events_per_s']:.0f} events/s, {s['commits']} commits, "
                  f"{s['cpu_ms_per_run']:.2f} ms of worker CPU per run, "
                  f"{_ms(s['server_ms_per_run'])} of the server's, the machine "
                  f"{100 * s['machine_busy']:.0f}% busy, drives per worker "
                  f"{s['driven']}, then {s['exit_s']:.2f} s for the processes to exit "
                  "(not counted)",
                  file=sys.stderr, flush=True)
    base = configs[0]
    print(f"\n{args.runs} runs of a {args.steps}-step noop chain, concurrency "
          f"{args.concurrency} per worker, recorder {args.recorder}, "
          f"{args.repeats} interleaved repeats (median [min..max])\n")
    print(f"| databases | commit | worker processes | runs | runs/s | events/s | commits "
          f"| worker CPU ms per run | server CPU ms per run | machine busy "
          f"| × {len(base[0])} database, {base[1]}, {base[2]} "
          "worker(s) |")
    print("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in configs:
        rps = [s["runs_per_s"] for s in samples[c]]
        ratios = [a["runs_per_s"] / b["runs_per_s"]
                  for a, b in zip(samples[c], samples[base], strict=True)]
        print(f"| {len(c[0])} | {c[1]} | {c[2]} | {'apart' if c[3] else 'shared'} "
              f"| {_spread(rps)} "
              f"| {_spread([s['events_per_s'] for s in samples[c]])} "
              f"| {statistics.median(s['commits'] for s in samples[c]):.0f} "
              f"| {_spread([s['cpu_ms_per_run'] for s in samples[c]], 2)} "
              f"| {_spread([s['server_ms_per_run'] or 0.0 for s in samples[c]], 2)} "
              f"| {_spread([100 * s['machine_busy'] for s in samples[c]])}% "
              f"| {_spread(ratios, 2)} |")
    return 0


def _ms(value: float | None) -> str:
    return "? ms" if value is None else f"{value:.2f} ms"


def _spread(xs: list[float], digits: int = 0) -> str:
    return (f"{statistics.median(xs):.{digits}f} [{min(xs):.{digits}f}.."
            f"{max(xs):.{digits}f}]")


if __name__ == "__main__":
    sys.exit(main())
