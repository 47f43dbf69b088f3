"""The invariants the conformance simulator checks, each named after the promise it keeps.

After a case's run has ended and its workers are stopped, :func:`check` reads the run and
its children by new processes and returns every violation (an empty list is a pass).
Each violation names its invariant, and the known break it looks like when it does:

- **readable** — every run (the parent and each child) opens in a new process:
  ``saga status --json``, ``saga history --json``, ``saga replay RUN --verify``, and
  ``saga replay RUN --at V`` at its first version, at the first and the last version
  past a snapshot, and at its last; ``saga audit verify --all`` passes; and mid-run,
  the ``read`` operation's status, history, replay, watch and audit (Promise 6; break 1.)
- **once** — from the tools' ledger: a step attempt (idempotency key, attempt) calls its
  tool at most once; every call belongs to an attempt the log started (``StepStarted``
  before the call); no call is made for a later attempt of a key whose attempt
  completed (a finished step never runs again); no call of an attempt is made after the
  log recorded that attempt ``Interrupted`` (a lapsed lease starts nothing). An undo
  call (its key, its attempt) is made at most once, and only one the log started
  (``StepCompensationStarted``); a later attempt of an undo starts only after a
  takeover found the earlier in flight (``RunTakenOver`` between), never once the
  undo's end is recorded. (Promises 1, 4, 8; breaks 2, 6, 7.)
- **undo-exact** — when a run compensates, its ``CompensationStarted`` names exactly the
  completed steps that can be undone (a ``compensate``, the tool's own undo, a child,
  a written file, loop iterations), in reverse completion order (plus, at most, an
  interrupted attempt, and the attempts in flight when someone asked for the rollback,
  which may have acted); each is recorded once, in that order, and
  the ledger's undos happened in that order; every other completed step is still
  ``completed`` in ``saga status`` (named not undone); a written file exists exactly when
  its step completed and was not undone; a step is recorded not undone
  (``StepNotUndone``) only when it never completed (cut short, so no output). (Promise 5;
  breaks 3, 6.)
- **live** — the run ended (nothing is left ``running``, ``waiting`` or ``paused`` when
  the driver has answered every approval and signal and the timers are due); every
  child has ended too, and none is still moving when its parent was cancelled or failed.
  (Promise 7; breaks 4, 5, 6.)
- **no-harm** — an operator's mistake (a worker or ``saga resume`` without the tools
  module) changes no run: no step fails for want of a tool. (Promise 7; break 5.)
- **projection** — ``saga status`` of every run = its row in ``saga list --json`` = that
  row after ``saga projection rebuild``.
- **oracle** — the final status, each step's status and the compensation order are
  among those the oracle (:func:`tests.conformance.model.expect`) allows; a failed
  compensation is only one the oracle says may fail (:func:`~tests.conformance.model.
  undo_may_fail`): never an interrupted step's undo that reads the output it lacks.
- **resources** — at most N calls of a limited resource at once, but for holders killed
  or stopped; no step waits for a slot for ever; no slot leaked
  (:mod:`tests.conformance.resources_ops`).
- **heartbeat** — what tools beat is recorded once per attempt, before its end, and
  handed to the next attempt from the log (:mod:`tests.conformance.heartbeats_ops`).
- **driver** — a command the driver issued failed unexpectedly (a crash, a traceback),
  or a read mid-run failed (e.g. ``saga status`` of a paused run: break 2).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.conformance import (
    heartbeats_ops,
    model,
    notify_ops,
    pools_ops,
    resources_ops,
    revisions_check,
)
from tests.conformance.harness import TERMINAL, Simulation, Trace


def _key(e: dict[str, Any]) -> str:
    it = e["payload"].get("iteration", 0)
    return e["step_id"] if not it else f"{e['step_id']}[{it}]"


def _ts(e: dict[str, Any]) -> float:
    return datetime.fromisoformat(e["timestamp"]).timestamp()


def _base(key: str) -> str:
    return key.split("[", 1)[0]


def _json(sim: Simulation, *args: str) -> tuple[Any, str | None]:
    r = sim.cli(*args)
    sim.trace.reads += 1
    if r.returncode != 0:
        return None, f"saga {' '.join(args)} exited {r.returncode}: {r.stderr.strip()[-500:]}"
    try:
        return json.loads(r.stdout), None
    except ValueError as e:
        return None, f"saga {' '.join(args)} printed no JSON: {e}"


def check(sim: Simulation, trace: Trace) -> list[str]:
    """Every violation of the invariants by the simulated run (and its children)."""
    bad: list[str] = [f"driver: {p}" for p in trace.problems]
    rid, case = trace.run_id, sim.case
    if trace.stuck:
        bad.append(f"live: {trace.stuck}")
    status, err = _json(sim, "status", rid, "--json")
    if err:
        return [*bad, f"readable: {err} (break 1 or 2)"]
    children = status.get("children", [])
    trace.children = {c["run_id"] for c in children}
    runs = {rid: status} | {c["run_id"]: c for c in children}
    histories: dict[str, list[dict[str, Any]]] = {}
    for run_id in runs:
        h, err = _json(sim, "history", run_id, "--json")
        if err:
            bad.append(f"readable: {err}")
            continue
        histories[run_id] = h
        bad += _readable(sim, run_id, len(h))
    r = sim.cli("audit", "verify", "--all")
    if r.returncode != 0:
        bad.append(f"readable: saga audit verify --all exited {r.returncode}: "
                   f"{(r.stdout + r.stderr).strip()[-400:]}")
    ledger = [json.loads(line) for line in sim.ledger.read_text().splitlines()] \
        if sim.ledger.exists() else []
    bad += _once(ledger, histories, trace)
    bad += notify_ops.check(sim, histories)  # issue 42
    bad += heartbeats_ops.check(histories, ledger)  # issue 42
    bad += pools_ops.check(sim, histories)  # issue 42
    bad += resources_ops.check(sim, histories, ledger)  # issue 42
    for run_id, h in histories.items():
        undoable = _parent_undoable(case) if run_id == rid else _child_undoable
        # up to a reset (issue 40): revisions_check checks the reset's undo and what follows
        upto, seen = revisions_check.before_reset(h, ledger)
        bad += _undo_exact(run_id, upto, runs[run_id], seen, undoable, trace)
    bad += _live(status, children, trace)
    bad += _no_harm(histories)
    bad += _projection(sim, runs)
    bad += _files(sim, case, status)
    if rid in histories:
        bad += _oracle(case, status, histories[rid], trace)
    return bad


def _readable(sim: Simulation, run_id: str, versions: int) -> list[str]:
    bad = []
    r = sim.cli("replay", run_id, "--verify")
    if r.returncode != 0:
        bad.append(f"readable: saga replay {run_id} --verify exited {r.returncode}: "
                   f"{(r.stdout + r.stderr).strip()[-400:]}")
    interval = int(sim.env["SAGA_SNAPSHOT_INTERVAL"])
    # the first version, the first past a snapshot, the last past one, and the last
    past = list(range(interval + 1, versions, interval))
    ats = sorted({1, versions, *past[:1], *past[-1:]})
    for v in ats:
        r = sim.cli("replay", run_id, "--at", str(v), "--json")
        sim.trace.reads += 1
        if r.returncode != 0:
            bad.append(f"readable: saga replay {run_id} --at {v} exited {r.returncode}: "
                       f"{r.stderr.strip()[-300:]} (break 1?)")
    return bad


def _once(ledger: list[dict[str, Any]], histories: dict[str, list[dict[str, Any]]],
          trace: Trace) -> list[str]:
    bad = []
    calls = [c for c in ledger if c["kind"] == "call"]
    per_attempt = Counter((c["key"], c["attempt"]) for c in calls)
    started: dict[str, set[tuple[str, int]]] = defaultdict(set)
    completed_attempt: dict[str, int] = {}
    interrupted_at: dict[tuple[str, int], float] = {}
    for run_id, h in histories.items():
        keys: dict[tuple[str, int], str] = {}  # a step execution's key (a reset renews it)
        for e in h:
            p = e["payload"]
            if e.get("step_id") is not None and "iteration" in p:
                at = (e["step_id"], p["iteration"])
                key = keys.get(at, f"{run_id}:{e['step_id']}:{p['iteration']}")
            if e["type"] == "StepStarted":
                started[run_id].add((p.get("idempotency_key"), p["attempt"]))
                keys[at] = p.get("idempotency_key") or key
            elif e["type"] == "StepCompleted":
                completed_attempt[key] = p["attempt"]
            elif e["type"] == "StepFailed" and p.get("error_type") == "Interrupted":
                interrupted_at[(key, p["attempt"])] = _ts(e)
    hint = _hint(trace)
    workers = {(p["idempotency_key"], p["attempt"]): p.get("worker", "")
               for h in histories.values() for e in h if e["type"] == "StepStarted"
               for p in [e["payload"]]}
    for key, attempt in interrupted_at:
        who = str(workers.get((key, attempt), ""))
        parts = who.split(":")
        pid = int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None
        if pid is not None and pid not in trace.killed | trace.stopped:
            n = per_attempt.get((key, attempt), 0)
            bad.append(f"once: {key} attempt {attempt} was recorded Interrupted, but its "
                       f"worker {who} neither died nor stopped (its call ran {n} time(s); "
                       f"the step is called again){hint}")
    for (key, attempt), n in per_attempt.items():
        if n > 1:
            pids = sorted({c["pid"] for c in calls if (c["key"], c["attempt"]) == (key, attempt)})
            bad.append(f"once: {key} attempt {attempt} called its tool {n} times "
                       f"(pids {pids}){hint}")
    for c in calls:
        if c["run"] in histories and (c["key"], c["attempt"]) not in started[c["run"]]:
            bad.append(f"once: {c['key']} attempt {c['attempt']} was called (pid {c['pid']}) "
                       "with no StepStarted in the log")
        done = completed_attempt.get(c["key"])
        if done is not None and c["attempt"] > done:
            bad.append(f"once: {c['key']} completed at attempt {done} and was called again "
                       f"(attempt {c['attempt']}, pid {c['pid']}): a finished step ran "
                       f"again{hint}")
        cut = interrupted_at.get((c["key"], c["attempt"]))
        if cut is not None and c["t"] > cut + 0.05 and c["pid"] not in trace.killed:
            bad.append(f"once: {c['key']} attempt {c['attempt']} was called by pid {c['pid']} "
                       f"{c['t'] - cut:.2f}s after the log recorded it Interrupted: a lapsed "
                       f"lease started a call (break 7: zombie worker)")
    return bad + _undos_once(ledger, histories, hint)


def _undos_once(ledger: list[dict[str, Any]], histories: dict[str, list[dict[str, Any]]],
                hint: str) -> list[str]:
    """Each undo call the log started (``StepCompensationStarted``: key, attempt) is made
    at most once, and none the log did not start; a later attempt starts only after a
    takeover (``RunTakenOver``) found the earlier in flight, never after the undo ended."""
    bad = []
    started: set[tuple[str, int]] = set()
    for h in histories.values():
        last: dict[tuple[str, int], tuple[str, int]] = {}  # step execution: (key, index)
        ended: set[str] = set()
        taken = [i for i, e in enumerate(h) if e["type"] == "RunTakenOver"]
        for i, e in enumerate(h):
            p = e["payload"]
            execution = (e.get("step_id") or "", p.get("iteration", 0))
            if e["type"] == "StepCompensationStarted":
                key = p["idempotency_key"]
                started.add((key, p["attempt"]))
                if key in ended:
                    bad.append(f"once: {key} undo attempt {p['attempt']} started after the "
                               f"undo's end was recorded: a finished undo ran again{hint}")
                before = last.get(execution)
                if key not in ended and before is not None and before[0] == key \
                        and not any(before[1] < t < i for t in taken):
                    bad.append(f"once: {key} undo attempt {p['attempt']} started while the "
                               f"one before was in flight, with no takeover between{hint}")
                last[execution] = (key, i)
            elif e["type"] in ("StepCompensated", "CompensationFailed", "StepNotUndone") \
                    and execution in last:
                ended.add(last[execution][0])
    undos = [c for c in ledger if c["kind"] == "undo" and c["run"] in histories]
    for (key, attempt), n in Counter((c["key"], c["attempt"]) for c in undos).items():
        if n > 1:
            pids = sorted({c["pid"] for c in undos if (c["key"], c["attempt"]) == (key, attempt)})
            bad.append(f"once: {key} undo attempt {attempt} was called {n} times (pids "
                       f"{pids}){hint}")
    for c in undos:
        if (c["key"], c["attempt"]) not in started:
            bad.append(f"once: {c['key']} undo attempt {c['attempt']} was called (pid "
                       f"{c['pid']}) with no StepCompensationStarted in the log: a taker "
                       "cannot know it was in flight")
    return bad


def _hint(trace: Trace) -> str:
    ops = {o.split()[1] for o in trace.ops if "skipped" not in o}
    said = []
    if "pause" in ops:
        said.append("break 2: pause re-ran the step in flight")
    if "zombie" in ops:
        said.append("break 7: a stopped worker past its lease")
    if ops & {"kill", "churn"}:
        said.append("break 6: worker churn")
    if "cancel" in ops:
        said.append("break 8c: a cancel waited for the call in flight, or took the run "
                    "over from its live worker")
    if "resume" in ops:
        said.append("saga resume drove the run beside a live worker")
    if any(o.partition(":")[0] in ("label", "migrate") for o in ops):
        said.append("issue 40: a label or a migration recorded while a call was in flight; "
                    "the live worker gave the run up, took it over from itself and called "
                    "the step again")
    return f" ({'; or '.join(said)})" if said else " (a new break)"


def _parent_undoable(case: dict[str, Any]) -> Any:
    def undoable(key: str) -> bool:
        sid = _base(key)
        spec = next((s for s in case["steps"] if s["id"] == sid), None)
        if spec is None:
            return False
        if spec["kind"] == "loop":
            return "[" in key  # the iterations are undone, not the loop's summary
        return model.undoable(case, sid)
    return undoable


def _child_undoable(key: str) -> bool:
    return not key.endswith("_wait") and not key.endswith("_bad")


def _in_flight(h: list[dict[str, Any]], start: dict[str, Any]) -> set[str]:
    """The attempts of calls in flight when someone asked for the rollback ``start`` (a
    cancel, ``saga compensate``): it names them first, as they may act (their driver cuts
    them short, or records how they ended)."""
    flying: set[str] = set()
    if not start["payload"].get("requested"):
        return flying
    for e in h:
        if e is start:
            break
        if e["type"] == "StepStarted":
            flying.add(_key(e))
        elif e["type"] in ("StepCompleted", "StepFailed", "StepSkipped", "StepWaiting"):
            flying.discard(_key(e))
    return flying


def _undo_exact(run_id: str, h: list[dict[str, Any]], status: dict[str, Any],
                ledger: list[dict[str, Any]], undoable: Any, trace: Trace) -> list[str]:
    bad = []
    starts = [e for e in h if e["type"] == "CompensationStarted"]
    if not starts:
        return bad
    order: list[str] = []
    for e in h:
        if e["type"] == "StepCompleted" and _key(e) not in order:
            order.append(_key(e))
        if e is starts[0]:
            break
    interrupted = {_key(e) for e in h if e["type"] == "StepFailed"  # a deadline's cut too
                   and e["payload"].get("error_type") in ("Interrupted", "RunTimeout")}
    interrupted |= _in_flight(h, starts[0])
    named = starts[0]["payload"]["steps"]
    want = [k for k in reversed(order) if undoable(k)]
    # an attempt cut short by a worker's death (or the run's deadline) may have acted: if
    # its tool was called and the step never completed, it counts as done for undo
    # (promise 5)
    last: dict[str, dict[str, Any]] = {}
    for e in h:
        if e["type"] in ("StepCompleted", "StepFailed") and e is not starts[0]:
            last[_key(e)] = e
        if e is starts[0]:
            break
    called = {(c["key"], c["attempt"]) for c in ledger if c["kind"] == "call"}
    for k, e in last.items():
        p = e["payload"]
        if (e["type"] == "StepFailed"
                and p.get("error_type") in ("Interrupted", "Quarantined", "RunTimeout")
                and undoable(k) and k not in named
                and (f"{run_id}:{e['step_id']}:{p['iteration']}", p["attempt"]) in called):
            bad.append(f"undo-exact: {run_id} step {k}'s attempt {p['attempt']} called its "
                       f"tool and was cut short ({p.get('error_type')}), but the compensation "
                       f"{named} leaves it out (break 6: interrupted effects left undone)")
    if [k for k in named if k not in interrupted or k in want] != want:
        missing = [k for k in want if k not in named]
        extra = [k for k in named if k not in want and k not in interrupted]
        why = ""
        if missing:
            why = (" (break 3: a step lost its tool's own undo: whole-template parameters, "
                   "or a graph-form task?)")
        bad.append(f"undo-exact: {run_id} compensates {named}, but its completed undoable "
                   f"steps in reverse order are {want} (missing {missing}, extra {extra}){why}")
    done = [_key(e) for e in h
            if e["type"] in ("StepCompensated", "CompensationFailed", "StepNotUndone")]
    for e in h:  # not undone: only a step that never completed (no output to undo with)
        if e["type"] == "StepNotUndone" and _key(e) in order:
            bad.append(f"undo-exact: {run_id} step {_key(e)} completed but was recorded "
                       f"not undone: {e['payload'].get('reason')}")
    if len(done) != len(set(done)):
        bad.append(f"undo-exact: {run_id} recorded a compensation twice: {done}")
    if done != named[:len(done)] or (h[-1]["type"] in ("RunCompensated", "RunCancelled")
                                     and done != named):
        bad.append(f"undo-exact: {run_id} compensated {done}, announced {named}")
    steps = status.get("steps", {})
    for k in order:
        if k not in named and steps.get(k, {}).get("status") not in ("completed", None):
            bad.append(f"undo-exact: {run_id} step {k} was not to be undone but is "
                       f"{steps[k]['status']}")
    undone_order = []
    for c in ledger:
        if c["kind"] == "undo" and c["run"] == run_id:
            # RUN:STEP:ITERATION[:resetN]:compensate
            it = int(re.sub(r"(:reset\d+)?:compensate$", "", c["key"]).rsplit(":", 1)[-1])
            k = c["step"] if not it else f"{c['step']}[{it}]"
            if k not in undone_order:
                undone_order.append(k)
    if undone_order and undone_order != [k for k in named if k in undone_order]:
        bad.append(f"undo-exact: {run_id}'s tools undid in the order {undone_order}, "
                   f"not {named}")
    return bad


def _live(status: dict[str, Any], children: list[dict[str, Any]], trace: Trace) -> list[str]:
    bad = []
    if status["status"] not in TERMINAL:
        bad.append(f"live: the run is {status['status']} at the end "
                   f"({status.get('waiting_for')}; children "
                   f"{[c['status'] for c in children]})")
    for c in children:
        if c["status"] not in TERMINAL:
            which = "break 4: a waiting child orphaned" if status["status"] in TERMINAL \
                else "break 4?"
            bad.append(f"live: child {c['run_id']} is {c['status']} while its parent is "
                       f"{status['status']} ({which}; break 6 if the parent was quarantined)")
    return bad


def _no_harm(histories: dict[str, list[dict[str, Any]]]) -> list[str]:
    bad = []
    for run_id, h in histories.items():
        for e in h:
            p = e["payload"]
            text = f"{p.get('error_type', '')} {p.get('message', '')} {p.get('error', '')}"
            if e["type"] in ("StepFailed", "RunFailed", "CompensationFailed") and (
                    "unknown tool" in text.lower() or "UnknownTool" in text
                    or "ToolNotFound" in text):
                bad.append(f"no-harm: {run_id} {e['type']} for want of a tool: {text.strip()}"
                           " (break 5: a process without --tools failed the run)")
                break
    return bad


def _projection(sim: Simulation, runs: dict[str, dict[str, Any]]) -> list[str]:
    bad = []
    rows, err = _json(sim, "list", "--json", "--limit", "0")
    if err:
        return [f"projection: {err}"]
    listed = {r["run_id"]: r["status"] for r in rows}
    for run_id, s in runs.items():
        if listed.get(run_id) != s["status"]:
            bad.append(f"projection: saga list says {run_id} is {listed.get(run_id)}, "
                       f"saga status {s['status']}")
    r = sim.cli("projection", "rebuild")
    if r.returncode != 0:
        return [*bad, f"projection: rebuild exited {r.returncode}: {r.stderr.strip()[-300:]}"]
    rows, err = _json(sim, "list", "--json", "--limit", "0")
    if err:
        return [*bad, f"projection: {err}"]
    rebuilt = {r["run_id"]: r["status"] for r in rows}
    if rebuilt != listed:
        bad.append(f"projection: a rebuild differs: {listed} became {rebuilt}")
    return bad


def _files(sim: Simulation, case: dict[str, Any], status: dict[str, Any]) -> list[str]:
    bad = []
    for s in case["steps"]:
        if s["kind"] != "file":
            continue
        state = status["steps"].get(s["id"], {}).get("status")
        exists = (sim.dir / "files" / f"{s['id']}.txt").exists()
        if exists != (state == "completed"):
            form = "whole-template" if s.get("whole") else "literal"
            bad.append(f"undo-exact: file of {s['id']} ({form} parameters) "
                       f"{'exists' if exists else 'is gone'} but the step is {state}"
                       + (" (break 3)" if s.get("whole") and exists else ""))
    return bad


#: Interruptions of one step after which saga quarantines its run whoever is to blame
#: (quarantine_after 3 × the net's 3, as docs/concepts/workers.md says; written here, not
#: imported, as the oracle imports nothing of the scheduler).
NET = 9


def _oracle(case: dict[str, Any], status: dict[str, Any], h: list[dict[str, Any]],
            trace: Trace) -> list[str]:
    interrupted = {e["step_id"] for e in h if e["type"] == "StepFailed"
                   and e["payload"].get("error_type") in ("Interrupted", "Quarantined")}
    exp = model.expect(case, cancelled=trace.cancelled, interrupted=interrupted,
                       redrives=trace.redrives, turns=bool(resources_ops.limited(case)))
    bad = []
    quarantined = any(e["type"] == "StepFailed"
                      and e["payload"].get("error_type") == "Quarantined" for e in h)
    cuts = Counter((e["step_id"], e["payload"].get("iteration")) for e in h
                   if e["type"] == "StepFailed"
                   and e["payload"].get("error_type") == "Interrupted")
    if quarantined and max(cuts.values(), default=0) + 1 >= NET:
        # the documented safety net (docs/concepts/workers.md): a step whose workers died
        # under it 9 times quarantines its run whoever is to blame; churn on a loaded
        # machine can get there. Break 6 was quarantine after 3: still caught below.
        return bad
    if quarantined:
        # the simulator's tools never crash their process: only churn and zombies made
        # the workers "die" under this run
        bad.append(f"oracle: a healthy run was quarantined after {len(trace.killed)} kills "
                   f"and {len(trace.stopped)} stopped workers; it ended {status['status']} "
                   "(break 6: worker churn failed a healthy run)")
    for key in (status.get("error") or {}).get("compensation_failed") or []:
        if not model.undo_may_fail(case, _base(key)):
            error = steps_error(status, key)
            bad.append(f"oracle: the compensation of {key} failed ({error}), but its undo "
                       "cannot fail: an interrupted step's undo that needs the output it "
                       "never recorded is named not undone, not a failed compensation")
    resets_undid = {_base(k) for e in h if e["type"] == "RunReset" for k in e["payload"]["undo"]}
    broken = (status.get("error") or {}).get("compensation_failed") or []
    if status["status"] == "failed" and broken \
            and {_base(k) for k in broken} <= resets_undid:
        # a reset whose undo failed ends the run failed, reopening nothing
        # (docs/howto/migrate-and-reset.md); the undo itself is checked above
        return bad
    if status["status"] not in exp.statuses:
        why = " (break 6: a healthy run quarantined under churn)" if quarantined else ""
        bad.append(f"oracle: the run ended {status['status']} ({status.get('error')}); the "
                   f"oracle allows {sorted(exp.statuses)}{why}")
        return bad
    steps = status.get("steps", {})
    for sid, allowed in exp.steps.items():
        got = steps.get(sid, {}).get("status", "pending")
        spec = next(s for s in case["steps"] if s["id"] == sid)
        if spec["kind"] == "loop" and allowed == {"compensated"}:
            allowed = {"completed"}  # its iterations are what is undone
        if got not in allowed:
            bad.append(f"oracle: step {sid} ({spec['kind']}) is {got}; the oracle allows "
                       f"{sorted(allowed)}")
    if exp.undo is not None:
        starts = [e for e in h if e["type"] == "CompensationStarted"]
        named: list[str] = []
        for k in (starts[0]["payload"]["steps"] if starts else []):
            if not named or named[-1] != _base(k):
                named.append(_base(k))
        if named != exp.undo:
            bad.append(f"oracle: compensated {named}; the oracle says {exp.undo}")
    return bad


def steps_error(status: dict[str, Any], key: str) -> Any:
    """A step's recorded compensation error in ``saga status --json``."""
    return (status.get("steps", {}).get(key) or {}).get("compensation_error")


def describe(case: dict[str, Any], trace: Trace, where: Path) -> str:
    """The case and what the driver did, for a failure message."""
    return (f"case (replay: bash ops/conformance.sh --case {where}):\n"
            f"{json.dumps(case)}\noperations done: {trace.ops}\nkilled pids "
            f"{sorted(trace.killed)}, stopped pids {sorted(trace.stopped)}, cancelled "
            f"{trace.cancelled}, redrives {trace.redrives}")
