"""The "store that keeps up" targets, measured beside the PostgreSQL commit floor.

Used by ``bench.py`` (section 0 of its report): group commit (one worker driving many
runs vs one at a time), worker processes (4 vs 1, ``drain.py``'s drain), and ``saga run``
end to end from the CLI. The engine rows (chain of 20 ÷ floor, chain of 3 ms/run,
sequential runs/s) come from bench.py's own section 1 and 2 samples.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from drain import drain_once  # noqa: E402

CLI_FLOW = """name: cli-bench
steps:
  - {id: s0, tool: noop}
  - {id: s1, tool: noop, depends_on: [s0]}
  - {id: s2, tool: noop, depends_on: [s1]}
"""


def cli_seconds(url: str, samples: int = 5) -> float:
    """Wall time of ``python -m saga.cli run flow.yaml`` (3 noop steps) on a fresh schema,
    process start to exit, the median of ``samples`` runs one after another (single samples
    of one bench ranged 0.32–0.42 s, with what the drains before them left PostgreSQL
    doing); the schema (and the bytecode caches, as after ``pip install``:
    ``PYTHONDONTWRITEBYTECODE`` is dropped) are made by a first run that is not timed.

    The command imports the saga this process imported (an A/B run that puts another
    checkout first on ``PYTHONPATH`` times that checkout's CLI, not the harness's)."""
    import psycopg
    from bench import saga_root
    schema = f"bench_cli_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        flow = Path(tmp) / "flow.yaml"
        flow.write_text(CLI_FLOW, encoding="utf-8")
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
               "SAGA_DATABASE_URL": url, "SAGA_DATABASE_SCHEMA": schema,
               "SAGA_HOME": str(Path(tmp) / ".saga"),
               "PYTHONPATH": os.pathsep.join([str(saga_root()),
                                              os.environ.get("PYTHONPATH", "")])}
        try:
            cmd = [sys.executable, "-m", "saga.cli", "run", str(flow)]
            subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
            seconds = []
            for _ in range(samples):
                started = time.perf_counter()
                subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
                seconds.append(time.perf_counter() - started)
            return statistics.median(seconds)
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def targets_phase(url: str, quick: bool, repeats: int, floor: Any) -> dict[str, Any]:
    """Interleaved samples of the group-commit, worker-process and CLI scenarios, each
    repeat with a commit-floor sample (``floor()`` in ms) of its own."""
    group_runs, drain_runs = (60, 100) if quick else (200, 300)
    out: dict[str, list[float]] = {k: [] for k in (
        "one_at_a_time_eps", "concurrent_eps", "group_ratio", "one_worker_rps",
        "four_workers_rps", "workers_ratio", "cli_s", "floor_ms", "group_commits",
        "one_at_a_time_cpu", "concurrent_cpu", "exit_s", "one_worker_rps_c1",
        "four_workers_rps_c1", "workers_ratio_c1", "apart_ratio", "apart_ratio_c1",
        "busy_one", "busy_four", "busy_one_c1", "busy_four_c1")}
    drives: list[list[int]] = []  # per 4-worker drain: the drives each worker ended
    for r in range(repeats):
        print(f"[bench] targets repeat {r + 1}/{repeats}", file=sys.stderr, flush=True)
        out["floor_ms"].append(floor())
        one = drain_once((url,), group_runs, 3, 1, 1, "xid")
        many = drain_once((url,), group_runs, 3, 1, 64, "xid")
        out["one_at_a_time_eps"].append(one["events_per_s"])
        out["concurrent_eps"].append(many["events_per_s"])
        out["group_commits"].append(many["commits"])
        out["one_at_a_time_cpu"].append(one["cpu_ms_per_run"])
        out["concurrent_cpu"].append(many["cpu_ms_per_run"])
        out["group_ratio"].append(many["events_per_s"] / one["events_per_s"])
        out["exit_s"] += [one["exit_s"], many["exit_s"]]
        # "apart": the 4 processes each drain a quarter of the runs in a schema of their
        # own, sharing the machine and the server but no table, lease or log. Its ratio
        # to one worker is what this machine allows 4 processes; the shared drain's
        # beside it is what sharing one store costs.
        order: list[int | str] = [1, 4, "apart"] if r % 2 == 0 else ["apart", 4, 1]
        for concurrency, suffix in ((64, ""), (1, "_c1")):
            got = {w: drain_once((url,), drain_runs, 5, 4 if w == "apart" else int(w),
                                 concurrency, "xid", apart=w == "apart") for w in order}
            one_rps = got[1]["runs_per_s"]
            out["one_worker_rps" + suffix].append(one_rps)
            out["four_workers_rps" + suffix].append(got[4]["runs_per_s"])
            out["workers_ratio" + suffix].append(got[4]["runs_per_s"] / one_rps)
            out["apart_ratio" + suffix].append(got["apart"]["runs_per_s"] / one_rps)
            out["busy_one" + suffix].append(got[1]["machine_busy"] * 100)
            out["busy_four" + suffix].append(got[4]["machine_busy"] * 100)
            drives.append(sorted(got[4]["driven"]))
        out["cli_s"].append(cli_seconds(url))
    return {"samples": out, "group_runs": group_runs, "drain_runs": drain_runs,
            "drives": drives}


def _spread(xs: list[float]) -> tuple[float, str]:
    from bench import num
    m = statistics.median(xs)
    return m, f"{num(m)} [{num(min(xs))}..{num(max(xs))}]" if len(xs) > 1 else num(m)


def targets_table(results: dict[str, Any]) -> list[str]:
    """Section 0 of the report: every target beside the commit floor."""
    t = results["targets"]
    s = t["samples"]
    pg_ratio = results["ratio_to_floor"]["postgres"]
    chain3 = [x["ms_per_run"] for x in results["engine"]["postgres"]["chain3"]]
    rows: list[tuple[str, str, list[float], bool]] = [
        ("per-step overhead, chain of 20, ÷ commit floor", "≤ 2.5×", pg_ratio["chain20"],
         True),
        ("the same, a thread tool (an ordinary Python function, run in the tool threads)",
         "≤ 2.5×", pg_ratio["chain20_threads"], True),
        ("a step on the tool threads ÷ inline, chain of 20 (ms/step, same repeat)",
         "≤ 1.15×", results["threads_ratio"]["postgres"]["chain20_threads"]["stored"], True),
        ("chain of 3, ms/run", "≤ 5 ms", chain3, True),
        ("the same, a thread tool", "≤ 5 ms", [x["ms_per_run"] for x in results[
            "engine"]["postgres"]["chain3_threads"]], True),
        ("sequential runs/s from one process (3 steps)", "≥ 250",
         results["runs_per_s"]["postgres"], False),
        ("the same, a thread tool", "≥ 250", results["runs_per_s_threads"]["postgres"],
         False),
        (f"one worker, {t['group_runs']} runs of 3 steps, concurrency 64 ÷ concurrency 1 "
         "(events/s)", "≥ 5×", s["group_ratio"], False),
        (f"{t['drain_runs']} five-step runs: 4 worker processes ÷ 1 (runs/s)", "≥ 1.8×",
         s["workers_ratio"], False),
        ("the same, each worker driving one run at a time (concurrency 1)", "≥ 1.8×",
         s["workers_ratio_c1"], False),
        ("what the machine allows: 4 processes sharing no store (a schema each), ÷ 1, "
         "concurrency 64", "—", s["apart_ratio"], False),
        ("the same, concurrency 1", "—", s["apart_ratio_c1"], False),
        ("`saga run` from the CLI, 3 steps, end to end, s", "≤ 0.3 s", s["cli_s"], True),
    ]
    goal = {"≤ 2.5×": 2.5, "≤ 1.15×": 1.15, "≤ 5 ms": 5.0, "≥ 250": 250.0, "≥ 5×": 5.0,
            "≥ 1.8×": 1.8, "≤ 0.3 s": 0.3}
    lines = ["| target | goal | measured, median [min..max] | met at the median |",
             "|---|---|---:|---|"]
    for title, want, xs, lower in rows:
        m, text = _spread(xs)
        if want not in goal:  # a reference row, not a target
            lines.append(f"| {title} | {want} | {text} | — |")
            continue
        met = m <= goal[want] if lower else m >= goal[want]
        lines.append(f"| {title} | {want} | {text} | {'yes' if met else 'no'} |")
    floor_text = _spread(s["floor_ms"] + results["floor_ms"]["postgres"])[1]
    lines += ["", f"Commit floor (raw INSERT + COMMIT, PostgreSQL): {floor_text} ms. "
              f"Events/s behind the ratios: concurrency 1 {_spread(s['one_at_a_time_eps'])[1]}"
              f", concurrency 64 {_spread(s['concurrent_eps'])[1]} (in "
              f"{_spread(s['group_commits'])[1]} group commits; the worker's CPU per run, "
              f"all its threads: {_spread(s['one_at_a_time_cpu'])[1]} ms at concurrency 1, "
              f"{_spread(s['concurrent_cpu'])[1]} ms at 64); runs/s: 1 worker "
              f"{_spread(s['one_worker_rps'])[1]}, 4 workers "
              f"{_spread(s['four_workers_rps'])[1]} at concurrency 64, "
              f"{_spread(s['one_worker_rps_c1'])[1]} and "
              f"{_spread(s['four_workers_rps_c1'])[1]} at concurrency 1; "
              "the whole machine busy (every CPU, /proc/stat) with 1 worker and with 4: "
              f"{_spread(s['busy_one'])[1]}% and {_spread(s['busy_four'])[1]}% at "
              f"concurrency 64, {_spread(s['busy_one_c1'])[1]}% and "
              f"{_spread(s['busy_four_c1'])[1]}% at concurrency 1; "
              "drives each of the 4 worker processes ended, per drain (64, 1, 64, 1, ...): "
              f"{'; '.join(', '.join(map(str, d)) for d in t['drives'])} (a drive "
              "more than the runs is a run claimed just as another worker finished it). "
              "A drain ends when its last worker "
              "reports its `Worker.run` returned; the worker process's exit after it, "
              f"not counted, took {_spread(s['exit_s'])[1]} s. This machine has "
              f"{os.cpu_count()} CPUs: 4 worker processes can use at most that many."]
    return lines
