"""The floor under a step on the tool threads (issue 44): one hand-off from an event loop
to a pool thread and back, as the executor makes it for an ordinary (blocking) tool,
with a function that does nothing, beside the same call awaited inline.

    python ops/bench/handoff.py [CALLS]            # the threads on any CPU
    taskset -c 0 python ops/bench/handoff.py       # every thread on one CPU

Prints µs per call, median [min..max] of 7 repeats. On a quiet 2-vCPU VM the round trip
is two wake-ups of a thread on an idle CPU (the pool thread, then the loop), each of
which costs the machine, not saga; on one CPU it is two context switches.
"""

from __future__ import annotations

import asyncio
import functools
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def nothing(x: int) -> dict[str, int]:
    return {"x": x}


def _settle(answer: asyncio.Future[Any], result: Any) -> None:
    if not answer.done():
        answer.set_result(result)


def _answering(loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Any], x: int) -> Any:
    result = nothing(x)  # as saga.executor.calling._answering: the answer set from the thread
    loop.call_soon_threadsafe(_settle, answer, result)
    return result


async def threaded(pool: ThreadPoolExecutor, calls: int) -> None:
    loop = asyncio.get_running_loop()
    for i in range(calls):
        answer = loop.create_future()
        pool.submit(functools.partial(_answering, loop, answer, i))
        await answer


async def inline(pool: ThreadPoolExecutor, calls: int) -> None:
    async def nothing_async(x: int) -> dict[str, int]:
        return {"x": x}

    for i in range(calls):
        await nothing_async(i)


def main() -> int:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    pool = ThreadPoolExecutor(16)
    times: dict[str, list[float]] = {"inline": [], "tool thread": []}
    for _ in range(7):
        for name, how in (("inline", inline), ("tool thread", threaded)):
            start = time.perf_counter()
            asyncio.run(how(pool, calls))
            times[name].append((time.perf_counter() - start) / calls * 1e6)
    cpus = sorted(os.sched_getaffinity(0))
    print(f"{calls} calls × 7, CPUs {cpus}, load average {os.getloadavg()[0]:.2f}")
    for name, xs in times.items():
        print(f"{name:12s} {statistics.median(xs):6.1f} µs per call [{min(xs):.1f}..{max(xs):.1f}]")
    pool.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
