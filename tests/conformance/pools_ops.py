"""Worker pools in the conformance simulator (issue 42): the **pools** invariant.

Half the generated cases (chosen by their salt, so a saved case replays the same; see
:func:`pooled`) are pooled:
each top-level step of the step-list form gets pool ``a``, pool ``b`` or none
(:func:`assign`), and the workers the simulation starts are of three kinds, ``--pool a
--only-pools``, ``--pool b`` (and unpooled steps) and plain (unpooled steps only)
(:func:`start_worker`). Whenever a worker is started (at first, after a kill, after an
outage) every kind that has no live worker gets one, so every pool is served again
eventually; meanwhile kills, zombies and outages leave a pool without a worker, and its
steps wait. Pools change no outcome: the oracle ignores them (a run never fails for
lack of a worker), and the other invariants hold as for any case. On top of them, the
log must show that:

- each step attempt (``StepStarted``, but a loop's own entry, which is no call) and each
  undo attempt (``StepCompensationStarted``) a simulated worker recorded, it recorded
  for a step of a pool it serves (one recorded by ``saga resume`` or another command
  driving the run in its own process is no worker's, and runs every step);
- each ``StepAwaitingPool`` names the step's own pool, one that the worker that recorded
  it does not serve (it handed the run over only for a step it could not run).
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Any

from tests.conformance import model

if TYPE_CHECKING:
    from tests.conformance.harness import Simulation

#: The kinds of worker: their ``saga worker`` arguments, and what each serves.
KINDS: dict[str, tuple[tuple[str, ...], frozenset[str | None]]] = {
    "a-only": (("--pool", "a", "--only-pools"), frozenset({"a"})),
    "b": (("--pool", "b"), frozenset({"b", None})),
    "plain": ((), frozenset({None})),
}


def pooled(case: dict[str, Any]) -> bool:
    """Whether the case runs with pools: half the generated cases, by salt, in the
    step-list form (none with ``SIM_POOLS=0``); never a case aimed at a known break
    (``model.TARGETED``), which keeps the timing it was made for."""
    return os.environ.get("SIM_POOLS") != "0" and case.get("form") != "graph" and \
        random.Random(f"pools-{case['salt']}").random() < 0.5 and \
        not any(case == aimed for aimed in model.TARGETED.values())


def pools(case: dict[str, Any]) -> dict[str, str | None]:
    """The pool of each top-level step of a pooled case (None: unpooled). The members of
    a parallel group share one: members of different pools run one pool after the other
    (one driver at a time), so one that fails before another pool's member started
    stops the run without it, where the oracle has every member start together."""
    rng = random.Random(f"pools-of-{case['salt']}")
    groups: dict[str, str | None] = {}
    chosen: dict[str, str | None] = {}
    for s in case["steps"]:
        pool = rng.choice(["a", "b", None])
        chosen[s["id"]] = groups.setdefault(s["group"], pool) if s.get("group") else pool
    return chosen


def assign(case: dict[str, Any], definition: dict[str, Any]) -> dict[str, Any]:
    """The case's composition with its steps' pools (unchanged when not pooled)."""
    if not pooled(case) or not isinstance(definition.get("steps"), list):
        return definition
    chosen = pools(case)
    steps = []
    for step in definition["steps"]:
        pool = chosen.get(step.get("id")) if isinstance(step, dict) else None
        steps.append({**step, "pool": pool} if pool is not None else step)
    return {**definition, "steps": steps}


def start_worker(sim: Simulation) -> Any:
    """Start a worker of each kind that has no live one (at least one worker); the first
    started. Each worker's kind is kept by its pid (:func:`check` reads it)."""
    kinds: dict[int, str] = sim.__dict__.setdefault("pool_kinds", {})
    live = {kinds.get(w.pid) for w in sim.live_workers()}
    missing = [k for k in KINDS if k not in live] or [sim.rng.choice(list(KINDS))]
    first = None
    for kind in missing:
        w = sim.spawn("worker", "--poll", "0.05", "--lease", str(sim.lease),
                      "--concurrency", "4", *KINDS[kind][0])
        sim.workers.append(w)
        kinds[w.pid] = kind
        first = first or w
    return first


def check(sim: Simulation, histories: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The pools invariant's violations (see the module's docs)."""
    rid = sim.trace.run_id
    if not pooled(sim.case) or rid not in histories:
        return []
    chosen = pools(sim.case)
    loops = {s["id"] for s in sim.case["steps"] if s["kind"] == "loop"}
    kinds: dict[int, str] = sim.__dict__.get("pool_kinds", {})
    bad: list[str] = []
    for e in histories[rid]:
        kind, p = e["type"], e["payload"]
        step = e.get("step_id")
        if step not in chosen or kind not in ("StepStarted", "StepCompensationStarted",
                                              "StepAwaitingPool"):
            continue
        if kind == "StepStarted" and step in loops and not p.get("iteration"):
            continue  # a loop's own entry is decided, not called: any worker records it
        parts = str(p.get("worker") or "").split(":")
        pid = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
        worker = kinds.get(pid) if pid is not None else None
        where = f"{rid} {step} ({kind} v{e['version']}, worker {p.get('worker')})"
        if kind == "StepAwaitingPool":
            if p.get("pool") != chosen[step]:
                bad.append(f"pools: {where} waits for pool {p.get('pool')!r}, but the "
                           f"step's is {chosen[step]!r}")
            elif worker is not None and chosen[step] in KINDS[worker][1]:
                bad.append(f"pools: {where}: a {worker} worker handed over a step it serves")
        elif worker is not None and chosen[step] not in KINDS[worker][1]:
            bad.append(f"pools: {where}: a {worker} worker ran a step of pool "
                       f"{chosen[step]!r}")
    return bad
