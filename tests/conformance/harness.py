"""The conformance simulator's driver: real ``saga worker`` processes, operations, reads.

:class:`Simulation` writes a case's composition, submits it with ``saga submit``, starts
real worker processes (``--lease`` short, ``--poll 0.05``, the tools module of
:mod:`tests.conformance.tools`), and while they drive the run it performs the case's
operations at their times (see :data:`tests.conformance.model.OPERATIONS`), answers the
run's approvals and signals as the case says, redrives a failed run when the case asks,
and records what it did (killed and stopped pids, accepted cancels, every command).
Every read and every command is a new process (``python -m saga.cli ...``); the driver's
own polling reads the store in this process, which no worker shares.

When the run has ended (or its deadline passed) the workers are stopped and
:func:`tests.conformance.invariants.check` judges what happened.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from saga.api import Saga
from saga.config import Settings
from tests.conformance import model, notify_ops, pools_ops, resources_ops, revisions_ops

ROOT = Path(__file__).resolve().parents[2]
TERMINAL = {"completed", "failed", "compensated", "cancelled"}


@dataclass
class Trace:
    """What the driver did and saw: the input of the invariants."""

    run_id: str
    killed: set[int] = field(default_factory=set)
    stopped: set[int] = field(default_factory=set)
    cancelled: bool = False
    redrives: int = 0
    ops: list[str] = field(default_factory=list)
    reads: int = 0
    commands: int = 0
    problems: list[str] = field(default_factory=list)
    stuck: str | None = None
    children: set[str] = field(default_factory=set)
    restarts: int = 0
    #: When the driver SIGKILLed the worker holding the run's lease (POSIX time), and
    #: the seconds from each such kill to the run's next RunTakenOver (issue 44).
    holder_kills: list[float] = field(default_factory=list)
    recoveries: list[float] = field(default_factory=list)
    #: (POSIX time, "kill" | "stop" | "restart", pid or 0) as sent (resources_ops)
    signals: list[tuple[float, str, int]] = field(default_factory=list)


def store_env(settings: Settings) -> dict[str, str]:
    """The environment that points a new process at the store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    if settings.is_postgres:
        env["SAGA_DATABASE_URL"] = settings.database_url or ""
        env["SAGA_DATABASE_SCHEMA"] = settings.schema or ""
    else:
        env["SAGA_HOME"] = str(settings.home)
    return env


class Simulation:
    """One case, driven to its end by real workers under the case's operations."""

    def __init__(self, case: dict[str, Any], settings: Settings, workdir: Path, *,
                 lease: float = 1.0, deadline: float = 90.0,
                 restart: Callable[[], None] | None = None) -> None:
        self.case, self.settings, self.dir = case, settings, workdir
        self.lease, self.deadline, self.restart = lease, deadline, restart
        self.rng = random.Random(case["salt"])
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "files").mkdir(exist_ok=True)
        self.ledger = self.dir / "ledger.jsonl"
        self.env = store_env(settings) | {
            "SAGA_LEASE_SECONDS": str(lease), "SAGA_HOLD_SECONDS": "1", "SAGA_ACTOR": "sim",
            "SAGA_SNAPSHOT_INTERVAL": str(self.rng.choice([10, 13, 20])),
            "SIM_LEDGER": str(self.ledger),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.workers: list[subprocess.Popen[bytes]] = []
        self.others: list[tuple[float, subprocess.Popen[bytes]]] = []  # (stop at, process)
        self.later: list[tuple[float, str, Any]] = []  # internal follow-ups (unpause, cont)
        self.trace = Trace(run_id=f"SIM-{case['salt']}")
        self.saga: Saga | None = None
        self.no_workers_until = 0.0
        self.rev = revisions_ops.Revisions(self)  # migrate, reset, label (issue 40)
        self.receiver = notify_ops.configure(self)  # webhooks of every kind (issue 42)
        resources_ops.configure(self)  # [resources.r1] in some cases (issue 42)

    # -- processes ----------------------------------------------------------------------

    def cli(self, *args: str, tools: bool = False, timeout: float = 60) -> \
            subprocess.CompletedProcess[str]:
        """``python -m saga.cli ARGS`` in a new process."""
        extra = ["--tools", model.TOOLS] if tools else []
        self.trace.commands += 1
        try:
            return subprocess.run([sys.executable, "-m", "saga.cli", *args, *extra],
                                  cwd=self.dir, env=self.env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.trace.problems.append(f"`saga {' '.join(args)}` did not return in {timeout}s"
                                       f" ({(e.stderr or b'')[-300:]!r})")
            return subprocess.CompletedProcess(e.cmd, -1, "", "timeout")

    def spawn(self, *args: str, tools: bool = True) -> subprocess.Popen[bytes]:
        extra = ["--tools", model.TOOLS] if tools else []
        self.trace.commands += 1
        return subprocess.Popen([sys.executable, "-m", "saga.cli", *args, *extra],
                                cwd=self.dir, env=self.env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)

    def start_worker(self, *, tools: bool = True) -> subprocess.Popen[bytes]:
        if tools and pools_ops.pooled(self.case):  # workers in pools (issue 42)
            return pools_ops.start_worker(self)  # type: ignore[no-any-return]
        w = self.spawn("worker", "--poll", "0.05", "--lease", str(self.lease),
                       "--concurrency", "4", tools=tools)
        if tools:
            self.workers.append(w)
        return w

    def holder(self) -> int | None:
        """The pid of the worker holding the run's lease (its name is host:pid:...)."""
        if self.saga is None:
            return None
        held = self.saga.leases.holder(self.trace.run_id)
        if not held or held[1] < time.time():
            return None
        parts = str(held[0]).split(":")
        return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None

    def victim(self, at_random: bool = False) -> subprocess.Popen[bytes] | None:
        """The worker driving the run when it is one of ours (unless ``at_random``),
        else any live worker."""
        live = self.live_workers()
        pid = None if at_random else self.holder()
        mine = [w for w in live if w.pid == pid]
        return mine[0] if mine else (self.rng.choice(live) if live else None)

    def live_workers(self) -> list[subprocess.Popen[bytes]]:
        return [w for w in self.workers if w.poll() is None and w.pid not in self.stopped_now()]

    def stopped_now(self) -> set[int]:
        return {arg for _, what, arg in self.later if what == "cont"}

    # -- operations ---------------------------------------------------------------------

    def op(self, name: str, now: float) -> None:
        self.trace.ops.append(f"{now:.2f}s {name}")
        rid = self.trace.run_id
        if name in ("kill", "churn_kill"):
            # A kill aims at the run's driver. Churn kills workers at random, as a fleet's
            # deaths come: since a dead driver's run is taken over at once (liveness),
            # aiming each of churn's kills (every 0.1-0.6 s) at the driver would kill
            # every step's driver faster than the step takes, which is the quarantine
            # net's case (saga.scheduler.policy.QUARANTINE_NET), not a healthy run living
            # through churn.
            w = self.victim(at_random=name == "churn_kill")
            if w is not None:
                if w.pid == self.holder():
                    self.trace.holder_kills.append(time.time())
                self.trace.signals.append((time.time(), "kill", w.pid))
                w.send_signal(signal.SIGKILL)
                w.wait()
                self.trace.killed.add(w.pid)
            self.start_worker()
        elif name == "churn":
            at = now
            while at < now + 3.0:  # a kill every 0.1-0.6 s for 3 s
                at += self.rng.uniform(0.1, 0.6)
                self.later.append((at, "op", "churn_kill"))
        elif name == "zombie":
            w = self.victim()
            if w is not None:
                self.trace.signals.append((time.time(), "stop", w.pid))
                w.send_signal(signal.SIGSTOP)
                self.trace.stopped.add(w.pid)
                delay = self.lease * self.rng.uniform(1.5, 3.0)
                self.later.append((now + delay, "cont", w.pid))
                # continued on time even while an operator's command holds the driver up:
                # on SQLite a worker stopped inside a write holds everyone's writes up
                # (the lock's 30 s wait), and the driver would continue it only after
                timer = threading.Timer(delay, _cont, (w.pid,))
                timer.daemon = True
                timer.start()
                if not self.live_workers():
                    self.start_worker()
        elif name == "outage":
            # every worker with the tools stops (SIGTERM: gracefully) for a while, so
            # that what an operator does meanwhile is what moves the run
            for w in self.live_workers():
                w.terminate()
                w.wait()
            self.no_workers_until = now + 2.0
        elif name == "pause":
            r = self.cli("pause", rid, "--json")
            if r.returncode == 0:
                self.read_status("while paused")
                self.later.append((now + self.rng.uniform(0.3, 1.5), "unpause", None))
        elif name == "cancel":
            r = self.cli("cancel", rid, "--reason", "simulated", "--json", tools=True)
            if r.returncode == 0 or (r.returncode == 1 and _undo_failed(r.stdout)):
                # exit 1: taken, but one of its undos failed, so the run ended failed
                self.trace.cancelled = True
            elif "cannot" not in r.stderr and "is " not in r.stderr:
                self.trace.problems.append(f"saga cancel exited {r.returncode}: "
                                           f"{(r.stdout + r.stderr).strip()[-300:]}")
        elif name == "resume":
            self.others.append((float("inf"), self.spawn("resume", rid)))
        elif name == "resume_notools":
            self.cli("resume", rid, timeout=60)
        elif name == "worker_notools":
            self.others.append((now + self.rng.uniform(1, 3),
                                self.start_worker(tools=False)))
        elif name == "pg_restart":
            if self.restart is not None:  # only on a cluster of the test's own
                self.trace.signals.append((time.time(), "restart", 0))
                self.restart()
                self.trace.restarts += 1
        elif name == "read":
            self.read_everything()
        elif name.startswith("deploy:"):  # deploy:STEP, then its follow-ups
            self.deploy(*name.split(":")[1:], now=now)
        elif name.partition(":")[0] in revisions_ops.OPS:
            self.rev.op(name, now)
        else:
            raise ValueError(name)

    def deploy(self, step: str, left: str = "3", until: str = "", *, now: float) -> None:
        """A rolling deploy (break 6): while ``step`` runs, the worker driving it is killed,
        ``left`` times over, each time once its attempt has run a while (its worker lived
        past the attempt's start and renewed its lease: the run did not cause its death,
        and must not be blamed or quarantined for it)."""
        end = float(until) if until else now + 30.0
        run = self.saga.get(self.trace.run_id) if self.saga is not None else None
        if run is None or run.is_finished or now > end:
            return
        state = run.steps.get(step) or {}
        started = state.get("attempt_started_at")
        count = int(left)
        if state.get("status") == "running" and started and self.holder() is not None \
                and (datetime.now(UTC) - datetime.fromisoformat(started)).total_seconds() \
                >= 0.7 * self.lease:
            self.op("kill", now)
            count -= 1
        if count:
            self.later.append((now + 0.05, "op", f"deploy:{step}:{count}:{end}"))

    def answer(self, *args: str) -> bool:
        """A person's or a system's answer (approve, reject, signal); False to try again.

        A refusal because the run moved on (exit 2) is fine; one because another writer
        appended meanwhile (exit 5) is noted as a driver problem (the command could retry
        by itself) and tried again; any other failure is noted."""
        r = self.cli(*args)
        if r.returncode in (0, 2):  # 2: refused, the run having moved on (e.g. cancelled)
            return True
        note = f"saga {args[0]} exited {r.returncode}: {r.stderr.strip()[-200:]}"
        if note not in self.trace.problems:
            self.trace.problems.append(note)
        return r.returncode != 5

    def read_status(self, when: str) -> dict[str, Any] | None:
        """``saga status --json`` by a new process; a failure is a problem."""
        self.trace.reads += 1
        r = self.cli("status", self.trace.run_id, "--json")
        if r.returncode != 0:
            self.trace.problems.append(f"saga status ({when}) exited {r.returncode}: "
                                       f"{r.stderr.strip()[-400:]}")
            return None
        return json.loads(r.stdout)

    def read_everything(self) -> None:
        """Every read a user has, by new processes, of the run as it is now."""
        rid = self.trace.run_id
        self.read_status("read")
        for args in (["history", rid, "--json"], ["replay", rid, "--verify"],
                     ["watch", rid, "--json", "--no-follow"], ["audit", "verify", rid]):
            self.trace.reads += 1
            r = self.cli(*args)
            if r.returncode != 0:
                self.trace.problems.append(f"saga {' '.join(args)} (mid-run) exited "
                                           f"{r.returncode}: {r.stderr.strip()[-400:]}")

    # -- the drive ----------------------------------------------------------------------

    def run(self) -> Trace:
        """Submit, drive under the operations to the end, stop every process."""
        definition = pools_ops.assign(self.case, model.composition(self.case, self.dir))
        definition = resources_ops.assign(self.case, definition)  # issue 42
        self.rev.definition = self.rev.initial = definition
        flow = self.dir / "flow.json"
        flow.write_text(json.dumps(definition, indent=1), encoding="utf-8")
        rid = self.trace.run_id
        r = self.cli("submit", str(flow), "--id", rid, "--json", tools=True)
        if r.returncode != 0:
            raise AssertionError(f"saga submit exited {r.returncode}: {r.stderr}")
        for s in self.case["steps"]:
            if s["kind"] == "signal" and s.get("early"):
                self.cli("signal", rid, f"go_{s['id']}", "--data", '{"early": true}')
        for _ in range(self.case["workers"]):
            self.start_worker()
        try:
            self._drive()
        finally:
            self._stop_all()
        if self.trace.holder_kills:
            self.trace.recoveries = self.recoveries()
        return self.trace

    def recoveries(self) -> list[float]:
        """Seconds from each kill of the lease's holder to the run's next RunTakenOver
        (from the events' timestamps), for the kills another worker took the run over
        after before the next such kill."""
        with Saga(self.settings) as saga:
            taken = sorted(datetime.fromisoformat(e["timestamp"]).timestamp()
                           for e in saga.history(self.trace.run_id)
                           if e["type"] == "RunTakenOver")
        kills = self.trace.holder_kills
        found = []
        for k, at in enumerate(kills):
            until = kills[k + 1] if k + 1 < len(kills) else float("inf")
            after = [t - at for t in taken if at < t < until]
            if after:
                found.append(round(after[0], 3))
        return found

    def _drive(self) -> None:
        rid = self.trace.run_id
        ops = [(float(t), name) for t, name in self.case["ops"]]
        decided: set[tuple[str, tuple[int, int]]] = set()
        signalled = {s["id"] for s in self.case["steps"] if s.get("early")}
        spec = {s["id"]: s for s in self.case["steps"]}
        start = time.monotonic()
        with Saga(self.settings) as saga:
            self.saga = saga
            while True:
                now = time.monotonic() - start
                while ops and ops[0][0] <= now:
                    self.op(ops.pop(0)[1], now)
                for item in sorted(x for x in self.later if x[0] <= now):
                    self.later.remove(item)
                    _, what, arg = item
                    if what == "cont":
                        _cont(arg)
                    elif what == "unpause":
                        r = self.cli("unpause", rid)
                        if r.returncode != 0 and "not paused" not in r.stderr:
                            self.trace.problems.append(f"saga unpause: {r.stderr.strip()}")
                    elif what == "op":
                        self.op(arg, now)
                for at, p in list(self.others):
                    if at <= now and p.poll() is None:
                        p.terminate()
                if not self.live_workers() and not self.stopped_now() \
                        and now >= self.no_workers_until:
                    self.start_worker()
                try:
                    run = saga.get(rid)
                except Exception as e:
                    if self.restart is None:  # a new process cannot open the run: break 1
                        self.trace.problems.append(
                            f"readable: the driver's process could not open {rid}: "
                            f"{type(e).__name__}: {str(e)[:200]} (break 1?)")
                        return
                    time.sleep(0.2)  # the server restarting: the workers ride it out
                    continue
                if run.is_finished and ops:
                    # what is left to do to a finished run only refuses: skip it, but for
                    # one reset (it revives an ended run) and the labels
                    keep = [o for o in ops if o[1].partition(":")[0] in revisions_ops.AT_END]
                    keep = [o for o in keep if o[1] != "reset"] + \
                        [o for o in keep if o[1] == "reset"][:1]
                    self.trace.ops += [f"{t:.2f}s {name} (skipped: run ended)"
                                       for t, name in ops if (t, name) not in keep]
                    ops.clear()
                    for _, name in keep:
                        self.op(name, now)
                    if keep:
                        continue
                answering = now >= float(self.case.get("answer_delay", 0))
                # a reset asks its reopened confirmations again, and waits for signals again
                asked = (self.trace.redrives, self.rev.generation)
                signalled -= self.rev.take_reopened()
                for step_id in run.pending_approvals if answering else ():
                    choice = spec.get(step_id, {}).get("confirm")
                    if choice in ("approve", "reject") and (step_id, asked) not in decided:
                        decided.add((step_id, asked))
                        if not self.answer(choice, rid, step_id):
                            decided.discard((step_id, asked))
                for step_id, s in spec.items():
                    if s["kind"] == "signal" and step_id not in signalled \
                            and not s.get("never") \
                            and step_id in run.steps and answering \
                            and run.steps[step_id]["status"] not in revisions_ops.SETTLED:
                        signalled.add(step_id)
                        if not self.answer("signal", rid, f"go_{step_id}", "--data",
                                           '{"late": true}'):
                            signalled.discard(step_id)
                if run.is_finished and not self.later:
                    if (run.status == "failed" and self.case.get("retry_failed")
                            and not self.case["rollback"] and not self.trace.cancelled
                            and self.trace.redrives == 0):
                        self.trace.redrives += 1
                        self.trace.ops.append(f"{now:.2f}s retry")
                        signalled -= {k for k, s in spec.items() if not s.get("early")}
                        self.cli("retry", rid, "--json", tools=True)
                        continue
                    if not ops and self._children_settled(saga, rid):
                        return
                if now > self.deadline:
                    moving = [f"{c['run_id']} {c['status']}" for c in
                              saga.status(rid).get("children", [])
                              if c.get("status") not in TERMINAL]
                    self.trace.stuck = (f"run {rid} is {run.status} after {self.deadline:.0f}s "
                                        f"with children {moving} still moving "
                                        f"(paused={getattr(run, 'paused', None)}, waiting for "
                                        f"{run.pending_approvals})")
                    return
                time.sleep(0.1)

    def _children_settled(self, saga: Saga, rid: str) -> bool:
        """Whether the run's children have ended too (given a moment after the parent)."""
        return all(c.get("status") in TERMINAL for c in saga.status(rid).get("children", []))

    def _stop_all(self) -> None:
        for _, what, arg in self.later:
            if what == "cont":
                _cont(arg)
        self.later.clear()
        procs = [*self.workers, *(p for _, p in self.others)]
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.trace.problems.append(f"process {p.args[3:5]} ignored SIGTERM for 20 s")
                p.kill()
                p.wait()


def _undo_failed(stdout: str) -> bool:
    """A command's ``--json`` answer says the run ended with a failed compensation."""
    try:
        answer = json.loads(stdout)
    except ValueError:
        return False
    return isinstance(answer, dict) and answer.get("status") == "failed" \
        and bool((answer.get("error") or {}).get("compensation_failed"))


def _cont(pid: int) -> None:
    """SIGCONT to a stopped worker (it may have ended meanwhile: a kill, the timer's)."""
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
