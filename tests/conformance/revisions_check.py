"""What the conformance simulator checks after the revising operations of
:mod:`tests.conformance.revisions_ops` (``saga migrate``, ``saga reset``, ``saga label``).

The invariants (``revise`` in a violation):

- a migration exits 0 with exactly one new ``DefinitionMigrated`` exactly when no step it
  changes had started (each event's ``from_hash`` is the hash in force before it: none
  lost, none doubled by racing writers); it exits 7 with nothing appended, the run's
  definition unchanged, when one had; a changed step that starts after the migration
  starts with its new parameters; a step appended by a migration runs exactly once when
  the run completes;
- a reset undoes exactly the completed, undoable step executions at or downstream of its
  step, newest first, each recorded ``StepCompensated`` with the reset's actor, then
  reopens every recorded execution there; a reopened step's attempts carry the next
  generation's idempotency key (``:resetN``); a refused reset appends nothing;
- the labels end as the last ``saga label`` left them, in ``saga status`` and in the
  read model, and ``saga list --label`` finds the run by them.

(``saga replay --verify``, ``saga audit verify`` and "a finished step never runs again"
are the simulator's invariants ``readable`` and ``once``, which run after these too.)
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from typing import TYPE_CHECKING, Any

from tests.conformance.revisions_ops import Revisions, base, step_key

if TYPE_CHECKING:
    from tests.conformance.harness import Simulation, Trace


def check(sim: Simulation, trace: Trace) -> list[str]:
    """Every violation by the revising operations of ``sim`` (empty when it had none)."""
    rev: Revisions = sim.rev
    if not (rev.migrations or rev.resets or rev.labelled):
        return []
    rid = trace.run_id
    r = sim.cli("history", rid, "--json")
    if r.returncode != 0:
        return [f"revise: saga history {rid} exited {r.returncode}"]
    h = json.loads(r.stdout)
    ledger = [json.loads(line) for line in sim.ledger.read_text().splitlines()] \
        if sim.ledger.exists() else []
    bad = _migrations(rev, h, ledger)
    bad += _resets(sim, rev, h, ledger)
    if rev.labelled:
        bad += _labels(sim, rev)
    return [f"revise: {b}" for b in bad]


def _migrations(rev: Revisions, h: list[dict[str, Any]],
                ledger: list[dict[str, Any]]) -> list[str]:
    bad: list[str] = []
    moved = [e for e in h if e["type"] == "DefinitionMigrated"]
    current = h[0]["payload"].get("definition_hash") or (moved[0]["payload"]["from_hash"]
                                                          if moved else None)
    for e in moved:  # each moved from the hash in force: no check ran on a stale history
        if current is not None and e["payload"]["from_hash"] != current:
            bad.append(f"DefinitionMigrated at version {e['version']} moved from "
                       f"{e['payload']['from_hash'][:12]}, but the run was on "
                       f"{current[:12]} (a check on a stale history?)")
        current = e["payload"]["to_hash"]
    counts = Counter(e["payload"]["to_hash"] for e in moved)
    wanted: set[str] = set()
    for m in rev.migrations:
        what = f"migration {m['n']} ({m['variant']} {m['target']}, {m['file']})"
        to_hash = next((x["out"].get("to_hash") for x in m["results"]
                        if x["out"].get("to_hash")), None)
        rcs = [x["rc"] for x in m["results"]]
        if to_hash is None:
            if not all(rc in (2, 5) for rc in rcs):
                bad.append(f"{what}: exit {rcs} without an answer: "
                           f"{[x['err'] for x in m['results']]}")
            continue
        n = counts.get(to_hash, 0)
        event = next((e for e in moved if e["payload"]["to_hash"] == to_hash), None)
        before = [e for e in h if event is None or e["version"] < event["version"]]
        hit = any(e["type"] == "StepStarted" and e["step_id"] == m["target"] for e in before)
        if 0 in rcs:
            wanted.add(to_hash)
            if n != 1:
                bad.append(f"{what}: exit {rcs} and {n} DefinitionMigrated events to "
                           f"{to_hash[:12]} (want exactly one)")
            if hit and m["variant"] not in ("append", "race"):
                bad.append(f"{what} was accepted, but {m['target']} had started before it: "
                           "the checker called a change of a recorded decision safe")
            if event is not None and m["param"]:
                name, value = m["param"]
                for e in h[h.index(event):]:
                    if e["type"] == "StepStarted" and e["step_id"] == m["target"] and \
                            e["payload"].get("parameters", {}).get(name) != value:
                        bad.append(f"{what}: {m['target']} started after the migration with "
                                   f"{name}={e['payload'].get('parameters', {}).get(name)!r}"
                                   f", not its new {value!r}")
        elif 7 in rcs:
            if n:
                bad.append(f"{what}: exit 7 but {n} DefinitionMigrated to {to_hash[:12]}")
            if m["hash_after"] != m["hash_before"]:
                bad.append(f"{what}: refused, yet the run's definition changed")
            if m["expect"] == "safe" and not (hit or any(
                    e["type"] == "StepStarted" and e["step_id"] == m["target"] for e in h)):
                bad.append(f"{what} was refused, but {m['target']} never started: a safe "
                           f"migration refused ({m['results'][0]['out'].get('divergence')})")
        elif m["expect"] == "unsafe" or (not m["finished"] and not all(rc == 5 for rc in rcs)):
            bad.append(f"{what}: exit {rcs}: {[x['err'] for x in m['results']]}")
        if m["expect"] == "unsafe" and 0 in rcs:
            bad.append(f"{what}: an unsafe change (of {m['target']}, which had started) "
                       "was accepted")
    extra = set(counts) - wanted
    if extra:
        bad.append(f"DefinitionMigrated to {sorted(x[:12] for x in extra)}, which no "
                   "migrate command reported")
    # a step a migration appended runs once when the run completes
    status_completed = h[-1]["type"] == "RunCompleted"
    for m in rev.migrations:
        if m["variant"] not in ("append", "race") or m["target"] is None:
            continue
        to_hash = next((x["out"].get("to_hash") for x in m["results"]
                        if x["out"].get("to_hash")), None)
        if to_hash not in wanted or not status_completed:
            continue
        sid = m["target"]
        done = [e for e in h if e["type"] == "StepCompleted" and e["step_id"] == sid]
        keys = Counter(c["key"] for c in ledger if c["kind"] == "call" and c["step"] == sid)
        cut = {(e["payload"].get("idempotency_key"), e["payload"]["attempt"]) for e in h
               if e["type"] == "StepStarted" and e["step_id"] == sid} - \
            {(c["key"], c["attempt"]) for c in ledger if c["kind"] == "call"}
        if not done:
            bad.append(f"{sid}, appended by migration {m['n']}, never completed in a "
                       "completed run")
        for key, calls in keys.items():
            interrupted = sum(1 for e in h if e["type"] == "StepFailed" and e["step_id"] == sid
                              and e["payload"].get("error_type") == "Interrupted")
            if calls > 1 + interrupted:
                bad.append(f"{sid}, appended by migration {m['n']}, was called {calls} "
                           f"times under {key} ({interrupted} interrupted; cut {cut})")
    return bad


def before_reset(h: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> \
        tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A run's history and the ledger up to its first reset: what the simulator's
    ``undo-exact`` judges (a reset's own undo and what follows it: :func:`check`)."""
    at = next((i for i, e in enumerate(h) if e["type"] == "RunReset"), None)
    if at is None:
        return h, ledger
    cut = datetime.fromisoformat(h[at]["timestamp"]).timestamp()
    return h[:at], [c for c in ledger if c["t"] < cut]


def _undoable(sim: Simulation) -> Any:
    from tests.conformance.invariants import _parent_undoable
    return _parent_undoable(sim.case)


def _downstream(definition: dict[str, Any], step: str) -> set[str]:
    """The steps at or downstream of ``step``: the later units of the step list (the
    members of its own parallel group start beside it, not after it), or the later
    nodes of the graph form's chain."""
    items = definition.get("nodes") or definition.get("steps") or []
    ids = [s["id"] for s in items]
    if step not in ids:
        return {step}
    i = ids.index(step)
    group = items[i].get("parallel_group")
    out = {step}
    for s in items[i + 1:]:
        if group and s.get("parallel_group") == group:
            continue
        group = None
        out.add(s["id"])
    return out


def _resets(sim: Simulation, rev: Revisions, h: list[dict[str, Any]],
            ledger: list[dict[str, Any]]) -> list[str]:
    bad: list[str] = []
    undoable = _undoable(sim)
    by_actor = {e["payload"].get("actor"): e for e in h if e["type"] == "RunReset"}
    for r in rev.resets:
        what = f"reset {r['n']} to {r['step']} ({r['aim']}, run {r['status']})"
        event = by_actor.get(r["actor"])
        if r["rc"] != 0:
            if event is not None:
                bad.append(f"{what} exited {r['rc']} but RunReset was recorded")
            # (a step its compensation undid stays undone: a reset past it is refused)
            if r["status"] in ("completed", "failed", "compensated") and r["aim"] == "ran" \
                    and "was undone by its compensation" not in r["err"]:
                bad.append(f"{what} was refused on an ended run: {r['err']}")
            continue
        if event is None:
            bad.append(f"{what} exited 0 but no RunReset by {r['actor']} is recorded")
            continue
        ran = any(e.get("step_id") == r["step"] and e["type"] != "ApprovalRequested"
                  for e in h[:h.index(event)])
        if r["aim"] == "unrun" and not ran:  # (it may have run since the driver looked)
            bad.append(f"{what}: a reset to a step that had not run was recorded")
    # the definitions in force, as this module wrote them (the recorded form is compiled)
    written = {x["out"].get("to_hash"): m["definition"] for m in rev.migrations
               for x in m["results"] if x["out"].get("to_hash")}
    definition = rev.initial
    order: list[str] = []  # step executions completed and still standing, in order
    cut: set[str] = set()  # those whose last attempt a worker's death cut short
    generation: dict[str, int] = {}
    reopened_at: dict[str, int] = {}
    for i, e in enumerate(h):
        t, p = e["type"], e["payload"]
        if t == "DefinitionMigrated":
            definition = written.get(p["to_hash"], definition)
        elif t == "StepFailed" and p.get("error_type") in ("Interrupted", "Quarantined"):
            cut.add(step_key(e))
        elif t == "StepCompleted" and step_key(e) not in order:
            order.append(step_key(e))
            cut.discard(step_key(e))
        elif t in ("StepCompensated", "CompensationFailed") and step_key(e) in order:
            order.remove(step_key(e))
        elif t == "StepStarted" and e["step_id"] in generation:
            want = f":reset{generation[e['step_id']]}"
            if not str(p.get("idempotency_key", "")).endswith(want):
                bad.append(f"{e['step_id']} started at version {e['version']} with key "
                           f"{p.get('idempotency_key')}, after StepsReopened (generation "
                           f"{generation[e['step_id']]}) at {reopened_at[e['step_id']]}: "
                           f"want a key ending {want}")
        elif t == "StepsReopened":
            for k in p["steps"]:
                generation[base(k)] = p["generation"]
                reopened_at[base(k)] = e["version"]
            order = [k for k in order if k not in set(p["steps"])]
            cut -= set(p["steps"])
        elif t == "RunReset":
            bad += _one_reset(h, i, order, _downstream(definition, p["step"]), undoable,
                              ledger, cut)
    return bad


def _one_reset(h: list[dict[str, Any]], i: int, order: list[str], downstream: set[str],
               undoable: Any, ledger: list[dict[str, Any]], cut: set[str]) -> list[str]:
    bad = []
    e = h[i]
    p = e["payload"]
    what = f"RunReset to {p['step']} at version {e['version']}"
    want = [k for k in reversed(order) if base(k) in downstream and undoable(k)]
    # an attempt cut short by a worker's death may have acted: undone first (promise 5)
    maybe = [k for k in p["undo"] if k in cut and base(k) in downstream]
    if [k for k in p["undo"] if k not in maybe] != want:
        bad.append(f"{what} undoes {p['undo']}; the completed undoable executions at or "
                   f"downstream of it, newest first, are {want}")
    recorded = set()
    for x in h[:i]:
        if x.get("step_id") and base(step_key(x)) in downstream:
            recorded.add(base(step_key(x)))
    if {base(k) for k in p["reopen"]} - recorded:
        bad.append(f"{what} reopens {p['reopen']}, some never recorded")
    undone, reopened = [], None
    for x in h[i + 1:]:
        if x["type"] in ("StepCompensated", "CompensationFailed"):
            undone.append(step_key(x))
            if x["payload"].get("actor") != p["actor"]:
                bad.append(f"{what}: {x['type']} of {step_key(x)} is recorded for "
                           f"{x['payload'].get('actor')!r}, not the reset's {p['actor']!r}")
        elif x["type"] == "StepsReopened":
            reopened = x
            break
        elif x["type"] in ("RunReset", "RunFailed", "RunCancelled", "CompensationStarted"):
            break
    if reopened is not None:
        if undone != p["undo"]:
            bad.append(f"{what}: undid {undone} before reopening, announced {p['undo']}")
        if reopened["payload"]["steps"] != p["reopen"]:
            bad.append(f"{what}: StepsReopened {reopened['payload']['steps']}, announced "
                       f"{p['reopen']}")
        t0, t1 = e["timestamp"], reopened["timestamp"]
        lo, hi = (datetime.fromisoformat(t).timestamp() for t in (t0, t1))
        tools_order = []
        for c in ledger:
            if c["kind"] == "undo" and lo - 0.05 <= c["t"] <= hi + 0.05 \
                    and c["run"] == e.get("run_id", c["run"]):
                k = c["step"]
                parts = c["key"].split(":")
                it = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
                k = k if not it else f"{k}[{it}]"
                if k not in tools_order:
                    tools_order.append(k)
        if [k for k in tools_order if k in p["undo"]] != \
                [k for k in p["undo"] if k in tools_order]:
            bad.append(f"{what}: the tools undid in the order {tools_order}, not {p['undo']}")
    return bad


def _labels(sim: Simulation, rev: Revisions) -> list[str]:
    bad = []
    rid = sim.trace.run_id
    r = sim.cli("status", rid, "--json")
    got = (json.loads(r.stdout).get("labels") or {}) if r.returncode == 0 else None
    if got != rev.labels:
        bad.append(f"saga status shows labels {got}; the last saga label left {rev.labels}")
    # the read model: the run's row has them, and a label filter finds it by them
    wanted = [f"{k}={v}" for k, v in sorted(rev.labels.items())]
    r = sim.cli("list", "--json", "--limit", "0",
                *[x for w in wanted for x in ("--label", w)])
    rows = {x["run_id"]: x for x in json.loads(r.stdout)} if r.returncode == 0 else {}
    if rid not in rows:
        bad.append(f"saga list {' '.join(wanted) or '(no label)'} does not find {rid} "
                   f"({r.stderr.strip()[-200:]})")
    elif rows[rid].get("labels") != rev.labels:
        bad.append(f"saga list shows labels {rows[rid].get('labels')}; the last saga label "
                   f"left {rev.labels}")
    return bad
