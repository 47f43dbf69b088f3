"""A bounded load test of ``saga serve`` on loopback: N clients, each starting a run and
watching it over Server-Sent Events until it ends, again and again, for a fixed time.

Reports the latency of starting a run (POST /api/v1/runs) and of a whole run seen
through its stream (start to the RunCompleted frame), p50 and p99, the errors, and the
events lost or repeated (every stream must carry versions 1..N with no gap, ending in
the run's end). Traffic goes only to 127.0.0.1, and the test stops by itself.

    python ops/bench/serve_load.py                         # 50 clients, 30 s, SQLite
    python ops/bench/serve_load.py --clients 20 --seconds 10 --postgres postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
COMPOSITION = {"name": "load", "steps": [
    {"id": "a", "tool": "echo", "args": {"n": 1}},
    {"id": "b", "tool": "echo", "args": {"n": 2}, "depends_on": ["a"]},
    {"id": "c", "tool": "echo", "args": {"n": 3}, "depends_on": ["b"]}]}


def percentile(values: list[float], p: float) -> float | None:
    """The nearest-rank percentile, in ms to one decimal."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))], 1)


async def watch(client: httpx.AsyncClient, run_id: str) -> tuple[list[int], str]:
    versions: list[int] = []
    last = ""
    async with client.stream("GET", f"/api/v1/runs/{run_id}/events",
                             headers={"Accept": "text/event-stream"}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                versions.append(int(line[4:]))
            elif line.startswith("event: "):
                last = line[7:]
    return versions, last


#: The server's token (saga serve makes one when given none; this one is given).
TOKEN = secrets.token_urlsafe(24)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def client_loop(url: str, until: float, stats: dict[str, Any]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60, headers=AUTH) as client:
        while time.monotonic() < until:
            began = time.monotonic()
            try:
                answer = await client.post("/api/v1/runs", json={"composition": COMPOSITION})
                answer.raise_for_status()
                stats["start"].append((time.monotonic() - began) * 1000)
                versions, last = await watch(client, answer.json()["run_id"])
            except (httpx.HTTPError, KeyError, ValueError) as e:
                stats["errors"].append(f"{type(e).__name__}: {e}"[:200])
                continue
            stats["run"].append((time.monotonic() - began) * 1000)
            if versions != list(range(1, len(versions) + 1)) or last != "RunCompleted":
                stats["broken_streams"] += 1
                stats["broken"].append({"versions": versions[-4:], "last": last})
            stats["events"] += len(versions)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=16, help="the server's worker")
    parser.add_argument("--postgres", help="a PostgreSQL URL (a fresh schema is used)")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env["SAGA_API_TOKEN"] = TOKEN
    home = tempfile.mkdtemp(prefix="saga-load-")
    if args.postgres:
        env["SAGA_DATABASE_URL"] = args.postgres
        env["SAGA_DATABASE_SCHEMA"] = f"load_{uuid.uuid4().hex[:8]}"
        store = "postgresql"
    else:
        env["SAGA_HOME"] = home
        store = "sqlite"
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "saga", "serve", "--port", str(port),
                               "--concurrency", str(args.concurrency)], cwd=home, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/api/v1/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        stats: dict[str, Any] = {"start": [], "run": [], "errors": [], "events": 0,
                                 "broken_streams": 0, "broken": []}
        until = time.monotonic() + args.seconds
        began = time.monotonic()

        async def clients() -> None:
            await asyncio.gather(*(client_loop(url, until, stats)
                                   for _ in range(args.clients)))
        asyncio.run(clients())
        elapsed = time.monotonic() - began
    finally:
        server.terminate()
        server.wait(30)
    result = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"), "store": store,
        "clients": args.clients, "seconds": round(elapsed, 1), "cpus": os.cpu_count(),
        "python": platform.python_version(), "runs": len(stats["run"]),
        "runs_per_s": round(len(stats["run"]) / elapsed, 1),
        "start_ms": {"p50": percentile(stats["start"], 50), "p99": percentile(stats["start"], 99)},
        "run_ms": {"p50": percentile(stats["run"], 50), "p99": percentile(stats["run"], 99)},
        "events": stats["events"], "errors": len(stats["errors"]),
        "first_errors": stats["errors"][:3], "broken_streams": stats["broken_streams"],
        "first_broken": stats["broken"][:3],
        "mean_run_ms": round(statistics.mean(stats["run"]), 1) if stats["run"] else None}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"serve-{store}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
