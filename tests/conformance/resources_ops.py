"""Resource limits in the conformance simulator (issue 42): the **resources** invariant.

Some generated cases (chosen by their salt, so a saved case replays the same; see
:func:`limited`) limit a resource: the simulation's ``saga.toml`` says
``[resources.r1] concurrency = N`` (N = 1, or 2 in a third of them, by salt), and every
parallel group's member, every loop and about half the other top-level tool steps name
``resource: r1`` (:func:`assign`; a group's members and a loop's iterations then take
turns). The tools' ledger
(:mod:`tests.conformance.tools`) has each call's start (``call``) and end (``end``, also
when the tool raised). Kills, zombies, outages and restarts go on as in any case, and the
other invariants hold as for any case (a limit changes no outcome, but for one: a group's
member still waiting for its slot when another failed never starts, which the oracle
allows). On top of them:

- **at most N at once**: at no instant do more than N calls of the limited steps run,
  counting each call from its start to its end, except:

  - a call whose worker was SIGKILLed has no end: it ends at the kill (the signal's
    time, before the process died; its slot is free once its liveness lock is gone);
  - a call whose worker was SIGSTOPped while it ran stops counting at the stop: it
    renews nothing while stopped, so its slot lapses within a lease, and a call whose
    slot lapsed runs on uncounted when continued;
  - a call in flight when the PostgreSQL server restarted stops counting then (its
    worker's liveness lock went with the connection, and its slot with it);
  - a call with no end and no kill (its process ended another way) counts until the
    simulation ended, so it can only add overlaps, never hide one;

- **no wait for ever**: a step that waited for the resource (``StepWaitingForResource``)
  started after it, unless the run ended meanwhile: no run is left waiting for a slot;
- **no slot leaked**: once every process has stopped, ``saga resources --json`` (a new
  process) lists no call holding a slot of ``r1`` (a lease after, at the latest).

The kills, stops and restarts are those the harness recorded (``Trace.signals``).
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import TYPE_CHECKING, Any

from tests.conformance import model

if TYPE_CHECKING:
    from tests.conformance.harness import Simulation, Trace

RESOURCE = "r1"


def limited(case: dict[str, Any]) -> int:
    """The concurrency of ``r1`` in the case (0: the case limits nothing): half the
    generated cases, by salt, in the step-list form (none with ``SIM_RESOURCES=0``);
    never a case aimed at a known break (``model.TARGETED``), which keeps its timing."""
    if os.environ.get("SIM_RESOURCES") == "0" or case.get("form") == "graph" \
            or any(case == aimed for aimed in model.TARGETED.values()):
        return 0
    rng = random.Random(f"resources-{case['salt']}")
    return rng.choice([1, 1, 2]) if rng.random() < 0.5 else 0


def steps(case: dict[str, Any]) -> set[str]:
    """The top-level steps that name ``resource: r1``: every parallel group's member and
    every loop (their calls may run at once: they contend), and about half the other
    tool steps (theirs run one at a time)."""
    if not limited(case):
        return set()
    rng = random.Random(f"resources-of-{case['salt']}")
    return {s["id"] for s in case["steps"] if s["kind"] == "loop" or s.get("group")
            or (s["kind"] == "act" and rng.random() < 0.5)}


def configure(sim: Simulation) -> None:
    """Add the case's limit to the simulation's ``saga.toml`` (every process reads it)."""
    n = limited(sim.case)
    if n:
        toml = sim.dir / "saga.toml"
        before = toml.read_text(encoding="utf-8") if toml.exists() else ""
        toml.write_text(before + f"\n[resources.{RESOURCE}]\nconcurrency = {n}\n",
                        encoding="utf-8")


def assign(case: dict[str, Any], definition: dict[str, Any]) -> dict[str, Any]:
    """The case's composition with ``resource: r1`` on its limited steps."""
    chosen = steps(case)
    if not chosen or not isinstance(definition.get("steps"), list):
        return definition
    return {**definition, "steps": [
        {**s, "resource": RESOURCE} if isinstance(s, dict) and s.get("id") in chosen else s
        for s in definition["steps"]]}


def intervals(sim: Simulation, ledger: list[dict[str, Any]],
              until: float) -> list[tuple[float, float, str]]:
    """Each call of a limited step of the run: (start, end as counted, what it was)."""
    chosen = steps(sim.case)
    rid = sim.trace.run_id
    ends = {(c["key"], c["attempt"], c["pid"]): c["t"] for c in ledger if c["kind"] == "end"}
    signals = sim.trace.signals
    out = []
    for c in ledger:
        if c["kind"] != "call" or c["run"] != rid or c["step"] not in chosen:
            continue
        start, pid = c["t"], c["pid"]
        end = ends.get((c["key"], c["attempt"], pid))
        what = f"{c['key']} attempt {c['attempt']} (pid {pid})"
        if end is None:
            kills = [t for t, kind, p in signals if kind == "kill" and p == pid and t >= start]
            end = min(kills) if kills else until
            what += " killed" if kills else " (no end)"
        cut = [t for t, kind, p in signals if start <= t < end
               and (kind == "restart" or (kind == "stop" and p == pid))]
        if cut:
            end = min(cut)
            what += " (uncounted from a stop or restart)"
        out.append((start, end, what))
    return out


def overlaps(calls: list[tuple[float, float, str]], n: int) -> list[str]:
    """The instants at which more than ``n`` of ``calls`` ran (the first three)."""
    points = sorted([(s, 1, i) for i, (s, _, _) in enumerate(calls)]
                    + [(e, -1, i) for i, (_, e, _) in enumerate(calls)],
                    key=lambda p: (p[0], p[1]))  # an end before a start at one instant
    running: set[int] = set()
    found: list[str] = []
    for t, step, i in points:
        if step < 0:
            running.discard(i)
            continue
        running.add(i)
        if len(running) > n:
            found.append(f"resources: at {t:.3f} {len(running)} calls of {RESOURCE} ran at "
                         f"once (concurrency {n}): "
                         + ", ".join(calls[j][2] for j in sorted(running)))
    return found[:3]


def check(sim: Simulation, histories: dict[str, list[dict[str, Any]]],
          ledger: list[dict[str, Any]]) -> list[str]:
    """The resources invariant's violations (see the module's docs)."""
    n = limited(sim.case)
    if not n:
        return []
    calls = intervals(sim, ledger, until=time.time())
    bad = overlaps(calls, n)
    h = histories.get(sim.trace.run_id, [])
    bad += _waits(sim.trace, h)
    bad += _leaked(sim)
    waits = sum(1 for e in h if e["type"] == "StepWaitingForResource")
    _stats(sim, n, len(calls), waits)
    return bad


def _waits(trace: Trace, h: list[dict[str, Any]]) -> list[str]:
    """Step executions left waiting for a slot by a run that has not ended."""
    if any(e["type"] in ("RunCompleted", "RunFailed", "RunCompensated", "RunCancelled")
           for e in h):
        return []
    waiting: dict[tuple[str, int], int] = {}
    for e in h:
        at = (e.get("step_id") or "", int(e["payload"].get("iteration") or 0))
        if e["type"] == "StepWaitingForResource":
            waiting[at] = e["version"]
        elif e["type"] in ("StepStarted", "StepFailed", "StepSkipped"):
            waiting.pop(at, None)
        elif e["type"] in ("RunReset", "StepsReopened"):
            waiting.clear()  # asked again, or not, from here
    return [f"resources: {trace.run_id} {step}[{it}] waits for {RESOURCE} for ever (since "
            f"v{v}), the run not ended" for (step, it), v in sorted(waiting.items())]


def _leaked(sim: Simulation) -> list[str]:
    """Slots still held once every process stopped (a lease is given to lapse)."""
    for look in range(2):
        r = sim.cli("resources", "--json")
        sim.trace.reads += 1
        if r.returncode != 0:
            return [f"resources: saga resources --json exited {r.returncode}: "
                    f"{r.stderr.strip()[-300:]}"]
        held = [h for entry in json.loads(r.stdout) if entry["resource"] == RESOURCE
                for h in entry.get("holders", [])]
        if not held:
            return []
        if look == 0:
            time.sleep(sim.lease + 0.2)
    return [f"resources: {len(held)} slot(s) of {RESOURCE} still held after every process "
            f"stopped and a lease passed: {held}"]


def _stats(sim: Simulation, n: int, calls: int, waits: int) -> None:
    """One line per limited case beside SIM_STATS's (``<SIM_STATS>.resources``)."""
    stats = os.environ.get("SIM_STATS")
    if stats:
        with open(stats + ".resources", "a", encoding="utf-8") as f:
            f.write(json.dumps({"salt": sim.case["salt"], "concurrency": n, "calls": calls,
                                "waits": waits, "steps": len(steps(sim.case))}) + "\n")
