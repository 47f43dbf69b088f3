"""A `saga worker` that SIGKILLs itself right after its Nth commit to the event store.

Usage: python tests/standins/crash_worker.py N [--forever] [worker options...]
N = 0 never crashes. The kill comes after the commit is durable and before the worker acts
on it, which is exactly an event boundary. The worker runs ``--until-idle`` unless
``--forever`` is given (then until it is killed or terminated). When it exits it prints
``crash_worker: N commits`` to stderr; with SAGA_TEST_KILL_LOG set, a kill first appends
one JSON line there naming the run and the events of the commit it died after. With
SAGA_TEST_COUNT_ONLY set to an event name (``RunStarted``: a schedule fired a run), only
commits with such an event count.

Many at once: ``python tests/standins/crash_worker.py --fork [worker options...]``
imports the engine once, then reads batches on stdin, one JSON list of
``{"crash_after": N, "env": {...}}`` per line: it forks one worker process per entry (its
environment's SAGA_* variables replaced by ``env``), waits for them all and answers with
a line of their exit codes as a JSON list (-9: killed), until stdin closes.

Again and again: ``python tests/standins/crash_worker.py --chaos SECONDS SLOTS N1,N2,...
[worker options...]`` keeps SLOTS forked ``--forever`` workers on the store its
environment names for SECONDS, replacing each one that dies by one killed after the next
commit count of the list (cycled), then SIGKILLs the survivors and prints every worker's
exit code as a JSON list.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from saga.cli import main
from saga.store.application import SagaApplication

limit = 0
commits = 0
_save_run = SagaApplication.save_run


def save_run(self: SagaApplication, run: object, *lease: object) -> None:
    """Commit, then die if this was commit number ``limit`` (of those counted)."""
    global commits
    kinds = [type(e).__name__ for e in getattr(run, "pending_events", [])]
    _save_run(self, run, *lease)  # type: ignore[arg-type]
    only = os.environ.get("SAGA_TEST_COUNT_ONLY")
    commits += 1 if only is None or only in kinds else 0
    if commits == limit:
        path = os.environ.get("SAGA_TEST_KILL_LOG")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"run": getattr(run, "run_id", None), "commit": commits,
                                    "events": kinds}) + "\n")
        os.kill(os.getpid(), signal.SIGKILL)


def worker(crash_after: int, options: list[str]) -> None:
    """Run ``saga worker`` here, killed after commit ``crash_after``."""
    global limit
    limit = crash_after
    main(["worker", *([] if "--forever" in options else ["--until-idle"]),
          "--tools", "tests.standins.standins", *(o for o in options if o != "--forever")])


def forked(crash_after: int, options: list[str], env: dict[str, str] | None = None) -> int:
    """A worker in a forked process (the engine is imported once, before forking); its
    pid."""
    import saga.api  # the engine, imported once for every fork
    import saga.cli.admin  # noqa: F401
    import tests.standins.standins  # noqa: F401

    pid = os.fork()
    if pid:
        return pid
    code = 1  # the worker: never returns into the caller
    try:
        if env is not None:
            for key in [k for k in os.environ if k.startswith("SAGA_")]:
                del os.environ[key]
            os.environ.update(env)
        worker(crash_after, options)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def ended(pid: int, flags: int = 0) -> int | None:
    """The exit code of a forked worker once it ended (None: still running, with
    ``os.WNOHANG``)."""
    done, status = os.waitpid(pid, flags)
    return os.waitstatus_to_exitcode(status) if done else None


def chaos(seconds: float, slots: int, kills: list[int], options: list[str]) -> list[int]:
    """Keep ``slots`` workers going for ``seconds``, each killed after its commit count."""
    codes: list[int] = []
    counts = itertools.cycle(kills)
    live = [forked(next(counts), [*options, "--forever"]) for _ in range(slots)]
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        for i, pid in enumerate(live):
            code = ended(pid, os.WNOHANG)
            if code is not None:
                codes.append(code)
                live[i] = forked(next(counts), [*options, "--forever"])
        time.sleep(0.02)
    for pid in live:
        os.kill(pid, signal.SIGKILL)
    return codes + [code for code in map(ended, live) if code is not None]


SagaApplication.save_run = save_run  # type: ignore[method-assign]
if sys.argv[1] == "--fork":
    for batch in sys.stdin:
        pids = [forked(int(job["crash_after"]), sys.argv[2:], job["env"])
                for job in json.loads(batch)]
        print(json.dumps([ended(pid) for pid in pids]), flush=True)
elif sys.argv[1] == "--chaos":
    print(json.dumps(chaos(float(sys.argv[2]), int(sys.argv[3]),
                           [int(n) for n in sys.argv[4].split(",")], sys.argv[5:])))
else:
    atexit.register(lambda: print(f"crash_worker: {commits} commits", file=sys.stderr))
    worker(int(sys.argv[1]), sys.argv[2:])
