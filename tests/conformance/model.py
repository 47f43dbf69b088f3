"""Cases for the conformance simulator, and the oracle that says how each must end.

A **case** is plain data (JSON-able, printed on failure, replayed with
``ops/conformance.sh --case FILE``): a list of step specs, whether the run rolls back on
failure, and a schedule of operations. :func:`composition` turns it into saga's
step-list text (and the children's files); :func:`cases` is the Hypothesis strategy.

The **oracle** (:func:`expect`) is a reference model written apart from the scheduler:
it imports nothing from saga. It walks the steps in list order (a ``parallel_group`` is
one unit whose members all start together) and says, for the run and each step, what
must happen:

- a step whose ``when`` is false is ``skipped``; a rejected approval (by a person or by a
  confirmation's ``default: false`` at its timeout) fails the step; a tool that fails its
  first ``fail_times`` attempts fails for good when that exceeds ``retries`` (one more
  attempt per redrive by ``saga retry``);
- ``on_error: retry:N`` gives N retries; a failure for good with ``on_error: continue``
  is recorded and the run goes on; any other stops the run (``on_error: compensate``
  rolls back even when ``rollback_on_failure`` is false): with rollback, exactly the
  completed steps that can be undone (a ``compensate``, the tool's own undo, a child
  run, a written file) are compensated in reverse completion order, and the run ends
  ``compensated``, or ``failed`` when one of those compensations fails or there was
  nothing to undo; without rollback it ends ``failed`` and a redrive may continue it;
- with no failure the run ends ``completed``;
- an undo is called once. A worker's death (or a stop past its lease) in the middle of
  an undo call leaves its ``StepCompensationStarted`` with no end: the worker that takes
  the run over records ``RunTakenOver`` and calls the undo again, knowingly (the next
  attempt, the same idempotency key). So an undo runs once per recorded start, and
  again only after a takeover found it in flight, never after its end was recorded;
- a step whose attempt was cut short before it recorded an output (a worker's death, a
  cancel) may have acted, so it is undone too when its undo can be said without that
  output (the tool's own undo, a child run); an explicit ``compensate`` that reads
  ``{{ output.step }}`` cannot be, so the step is named not undone (``StepNotUndone``,
  "interrupted before its output was recorded") and the other undos go on: it is never
  a failed compensation. Only an undo the case makes fail (``failing``), or a written
  file's whose write was cut short, may be recorded failed (:func:`undo_may_fail`).

**Where timing decides, the oracle gives a set of allowed outcomes**, not one:

- a ``cancel`` that saga accepted ends the run ``cancelled``, or ``failed`` when one of
  its undos fails (its compensations are
  then checked exactly against the log by the invariants, since which steps had
  completed depends on when the cancel landed); one that saga refused because the run
  had already ended leaves the uncancelled outcome;
- a step whose attempt the log records as ``Interrupted`` (its worker died, or was
  stopped past its lease) may end completed or failed (an interrupted attempt uses an
  attempt of its budget), and everything after it follows either way;
- members of a parallel group complete in any order; when a resource limit makes them
  take turns (``turns``), a member still waiting for its slot when another failed is
  never started (``fail_fast`` starts nothing new): it may stay ``pending``.

Pause/unpause, reads, kills, zombies, workers without the tools module and
``saga resume`` change no outcome: the oracle ignores them (that is the promise). Nor do
the revisions of :mod:`tests.conformance.revisions_ops`: a migration changes only the
``value`` of steps that have not started or appends plain steps after the last, labels
are no input, and a reset re-runs the same deterministic tools under new keys (a step
fails its first ``fail_times`` attempts of each key), so the run ends as it would have.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

TOOLS = "tests.conformance.tools"

#: Operations the driver interleaves, with what each does.
OPERATIONS = {
    "kill": "SIGKILL a worker, start a fresh one",
    "zombie": "SIGSTOP a worker past its lease, then SIGCONT it",
    "pause": "saga pause, then saga unpause a little later",
    "cancel": "saga cancel",
    "resume": "saga resume RUN (foreground drive in a new process, with the tools)",
    "resume_notools": "saga resume RUN without --tools (must change nothing)",
    "worker_notools": "start a worker without --tools for a while (must change nothing)",
    "read": "status, history, replay --verify, watch and audit verify by new processes",
    "churn": "kill a worker every 0.1-0.6 s for a few seconds",
    "outage": "stop every worker (SIGTERM) for 2 s: what an operator does then moves the run",
    "pg_restart": "restart the PostgreSQL server (long mode, on a cluster the test started)",
    "migrate": "saga migrate RUN --to a new definition, safe or not (tests.conformance"
               ".revisions_ops): exit 0 exactly when no changed step had started",
    "reset": "saga reset RUN --to a step (mid-run, or once it ended: failed, compensated or"
             " completed): undo exactly what is downstream, re-run it under new keys",
    "label": "saga label RUN k=v k2= beside the workers: the labels end as the last set them",
}


@dataclass
class Expected:
    """What the oracle allows: final run statuses, and per step the allowed statuses."""

    statuses: set[str]
    steps: dict[str, set[str]] = field(default_factory=dict)
    #: steps (ids) the compensation must undo, in this order (None: checked from the log)
    undo: list[str] | None = None


def _undoable(step: dict[str, Any]) -> bool:
    kind = step["kind"]
    if kind in ("use", "file", "loop"):
        return True
    if kind != "act":
        return False
    return step["undo"] in ("explicit", "own", "failing")


def undoable(case: dict[str, Any], step_id: str) -> bool:
    """Whether a completed step of the case has a compensation."""
    for s in case["steps"]:
        if s["id"] == step_id:
            return _undoable(s)
    return False


def undo_may_fail(case: dict[str, Any], step_id: str) -> bool:
    """Whether a step's compensation may be recorded failed (``CompensationFailed``): an
    undo the case makes fail, or a ``file`` write's, whose own undo reads the state its
    write recorded (a write cut short recorded none). Every other undo of the simulator's
    succeeds: an interrupted step whose undo reads the output it never recorded is named
    not undone instead, and a child run's undo ends with the child undone."""
    spec = next((s for s in case["steps"] if s["id"] == step_id), None)
    if spec is None:
        return True  # not one of the case's steps: nothing to say
    return spec["kind"] == "file" or spec.get("undo") == "failing"


def _fails(step: dict[str, Any], redrives: int) -> bool:
    if step["kind"] == "act":
        if step.get("confirm") in ("reject", "default_false"):
            return True
        retries = int(step["retries"])
        if str(step.get("on_error") or "").startswith("retry:"):
            retries = int(step["on_error"].split(":")[1])
        return int(step["fail_times"]) > (retries + 1) * (1 + redrives) - 1
    if step["kind"] == "use":
        return bool(step.get("child_fails"))
    return False


def _units(case: dict[str, Any]) -> list[list[dict[str, Any]]]:
    units: list[list[dict[str, Any]]] = []
    for s in case["steps"]:
        if s.get("group") and units and units[-1][0].get("group") == s["group"]:
            units[-1].append(s)
        else:
            units.append([s])
    return units


def expect(case: dict[str, Any], *, cancelled: bool = False, interrupted: set[str] | None = None,
           redrives: int = 0, turns: bool = False) -> Expected:
    """The allowed outcomes of a case, given what the driver did (an accepted cancel,
    redrives by ``saga retry``) and the step attempts the log records as interrupted.
    ``turns``: a resource limit makes a parallel group's members take turns."""
    interrupted = interrupted or set()
    if cancelled:  # a cancel's undo the case makes fail ends the run failed
        return Expected({"cancelled", "failed"} if any(undo_may_fail(case, s["id"])
                                                       for s in case["steps"])
                        else {"cancelled"})
    if case.get("timeout"):
        # its last step waits for a signal nobody sends: the run's deadline ends it,
        # undoing what it did (or failing when there was nothing to undo), unless a
        # failure ended it first; which steps had run by then is timing's
        return Expected({"compensated", "failed"})
    steps: dict[str, set[str]] = {}
    completed: list[str] = []
    failed = False
    uncertain = False  # timing made some step's outcome a set: check undo from the log
    forced = False  # on_error: compensate rolls back even without rollback_on_failure
    for unit in _units(case):
        if failed:
            for s in unit:
                steps[s["id"]] = {"pending"}
            continue
        stop = False
        for s in unit:
            sid = s["id"]
            if s.get("when") is False:
                steps[sid] = {"skipped"}
                continue
            if sid in interrupted and s["kind"] == "act":
                steps[sid] = {"completed", "failed", "compensated"}
                uncertain = True
                continue
            if _fails(s, redrives):
                steps[sid] = {"failed"}
                if s.get("on_error") != "continue":
                    stop = True
                    forced = forced or s.get("on_error") == "compensate"
                continue
            steps[sid] = {"completed"}
            completed.append(sid)
        if stop and len(unit) > 1:
            # the group's other members started together; one still retrying when the
            # failure came may be cut short (fail_fast starts nothing new)
            for s in unit:
                if steps[s["id"]] == {"completed"} and s.get("fail_times"):
                    steps[s["id"]] = {"completed", "failed", "compensated"}
                    uncertain = True
                if turns and steps[s["id"]] != {"skipped"}:
                    # taking turns for a slot, it may not have started yet (whether it
                    # would have completed or failed)
                    steps[s["id"]] = steps[s["id"]] | {"compensated", "pending"}
                    uncertain = True
        failed = stop
    if uncertain:
        return Expected({"completed", "compensated", "failed"} if not failed
                        else {"compensated", "failed"})
    if not failed:
        return Expected({"completed"}, steps)
    if not case["rollback"] and not forced:
        return Expected({"failed"}, steps)
    undo = [sid for sid in reversed(completed) if undoable(case, sid)]
    for sid in undo:
        steps[sid] = {"compensated"}
    spec = {s["id"]: s for s in case["steps"]}
    bad_undo = any(spec[sid].get("undo") == "failing" for sid in undo)
    status = "failed" if bad_undo or not undo else "compensated"
    if bad_undo:
        for sid in undo:
            steps[sid] = {"compensated", "completed", "failed"}
    grouped = any(s.get("group") for s in case["steps"])
    return Expected({status}, steps, None if grouped else undo)


# -- the composition text -----------------------------------------------------------------


def _act(s: dict[str, Any]) -> dict[str, Any]:
    tool = {"explicit": "sim_act", "failing": "sim_act", "own": "sim_own",
            "none": "sim_plain"}[s["undo"]]
    if s.get("slow"):
        tool = "sim_slow" if s["undo"] in ("explicit", "failing") else tool
    params: dict[str, Any] = {"value": s["id"], "fail_times": s["fail_times"]}
    if s.get("slow"):
        params["seconds"] = s["slow"]
    step: dict[str, Any] = {"id": s["id"], "tool": tool}
    if s.get("whole"):
        inner = ", ".join(f"'{k}': {json.dumps(v)}" for k, v in params.items())
        step["parameters"] = "{{ {" + inner + "} }}"
    else:
        step["parameters"] = params
    if s["undo"] in ("explicit", "failing"):
        step["compensate"] = {"tool": "sim_undo", "args": {
            "what": "{{ output.step }}", "fail": s["undo"] == "failing"}}
    if s["retries"]:
        step["retry"] = {"max_attempts": s["retries"] + 1, "delay": 0.05, "backoff": "fixed"}
    if s.get("on_error"):
        step["on_error"] = s["on_error"]
    if s.get("confirm") in ("approve", "reject"):
        step["confirm"] = f"Run {s['id']}?"
    return step


def graph_eligible(case: dict[str, Any]) -> bool:
    """Whether the case is a plain chain the graph form can say the same way (the graph
    form always rolls back on failure: it has no ``rollback_on_failure``)."""
    return bool(case["rollback"]) and not case.get("timeout") and all(
        s["kind"] == "act" and not s.get("confirm") and s.get("when") is None
               and not s.get("group") and not s["retries"] and not s.get("slow")
               and not s.get("on_error") and s["fail_times"] in (0, 9)
               for s in case["steps"])


def graph(case: dict[str, Any]) -> dict[str, Any]:
    """The case as seed 004's graph form: a chain of task nodes."""
    nodes = []
    for s in case["steps"]:
        role = {"explicit": "sim_act", "failing": "sim_act", "own": "sim_own",
                "none": "sim_plain"}[s["undo"]]
        if s["fail_times"]:
            role = "sim_fail"
        config: dict[str, Any] = {"role": role, "task_template": f"do {s['id']}: {{input}}"}
        if s["undo"] in ("explicit", "failing") or (s["fail_times"] and s["undo"] == "own"):
            config["compensate"] = {"tool": "sim_undo", "args": {
                "what": s["id"], "fail": s["undo"] == "failing"}}
        nodes.append({"id": s["id"], "type": "task", "task_config": config})
    ids = [s["id"] for s in case["steps"]]
    return {"id": "conformance-graph", "name": "conformance-graph", "entry_point": ids[0],
            "exit_points": [ids[-1]], "nodes": nodes,
            "edges": [{"id": f"e{i}", "source": a, "target": b}
                      for i, (a, b) in enumerate(itertools.pairwise(ids))],
            "config": {"fail_fast": True}}


def composition(case: dict[str, Any], where: Path) -> dict[str, Any]:
    """The case's composition: seed 004's graph form when the case asks for it and is a
    plain chain, else the step-list form (children are written under ``where``)."""
    if case.get("form") == "graph" and graph_eligible(case):
        return graph(case)
    steps: list[dict[str, Any]] = []
    confirmations = []
    for s in case["steps"]:
        kind = s["kind"]
        if kind == "act":
            step = _act(s)
            if s.get("confirm") in ("default_true", "default_false"):
                confirmations.append({"step": s["id"], "message": "go?", "timeout": 1,
                                      "default": s["confirm"] == "default_true"})
        elif kind == "sleep":
            step = {"id": s["id"], "sleep": s["seconds"]}
        elif kind == "signal":
            step = {"id": s["id"], "signal": f"go_{s['id']}"}
        elif kind == "file":
            path = f"files/{s['id']}.txt"
            step = {"id": s["id"], "tool": "file"}
            if s.get("whole"):
                step["parameters"] = ("{{ {'action': 'write', 'path': '" + path
                                      + "', 'content': 'made by " + s["id"] + "'} }}")
            else:
                step["parameters"] = {"action": "write", "path": path,
                                      "content": f"made by {s['id']}"}
        elif kind == "loop":
            step = {"id": s["id"], "tool": "sim_act", "loop": list(range(s["items"])),
                    "loop_concurrency": 2,
                    "parameters": {"value": "{{ item }}"},
                    "compensate": {"tool": "sim_undo", "args": {"what": "{{ item }}"}}}
        elif kind == "use":
            child = {"name": f"child-{s['id']}", "steps": [
                {"id": f"{s['id']}_c{i}", "tool": "sim_act", "parameters": {"value": i},
                 "compensate": {"tool": "sim_undo", "args": {"what": "{{ output.step }}"}}}
                for i in range(s["child_steps"])]}
            if s.get("child_sleep"):
                child["steps"].insert(1, {"id": f"{s['id']}_wait", "sleep": s["child_sleep"]})
            if s.get("child_fails"):
                child["steps"].append({"id": f"{s['id']}_bad", "tool": "sim_act",
                                       "parameters": {"fail": True}})
            path = where / f"child_{s['id']}.json"
            path.write_text(json.dumps(child, indent=1), encoding="utf-8")
            step = {"id": s["id"], "use": str(path)}
        else:
            raise ValueError(kind)
        if s.get("when") is not None:
            step["when"] = "true" if s["when"] else "false"
        if s.get("group"):
            step["parallel_group"] = s["group"]
        steps.append(step)
    out: dict[str, Any] = {"name": "conformance", "steps": steps,
                           "error_handling": {"rollback_on_failure": case["rollback"]}}
    if confirmations:
        out["confirmations"] = confirmations
    if case.get("timeout"):
        out["timeout"] = case["timeout"]
    return out


# -- the generator ------------------------------------------------------------------------

_ident = st.integers(0, 10**6)


@st.composite
def act_steps(draw: st.DrawFn, *, plain: bool = False) -> dict[str, Any]:
    """A tool step: its undo, failures, retries, on_error, confirm, parameters' form."""
    retries = draw(st.sampled_from([0, 0, 1, 2]))
    fail_times = draw(st.sampled_from([0, 0, 0, 0, 1, 2, 9]))
    step = {"kind": "act", "undo": draw(st.sampled_from(["explicit", "explicit", "own", "own",
                                                         "none", "failing"])),
            "retries": retries, "fail_times": fail_times,
            "whole": draw(st.booleans()),
            "on_error": draw(st.sampled_from([None, None, None, None, "continue", "compensate",
                                              "retry:2"])),
            "when": draw(st.sampled_from([None, None, None, True, False])),
            "slow": draw(st.sampled_from([0, 0, 0, 0.3, 0.8]))}
    if step["on_error"] == "retry:2":
        step["retries"] = 0  # on_error says how often
    if not plain:
        step["confirm"] = draw(st.sampled_from([None] * 8 + ["approve", "reject",
                                                             "default_true", "default_false"]))
    return step


@st.composite
def any_step(draw: st.DrawFn) -> dict[str, Any]:
    """One step of any kind the simulator knows."""
    kind = draw(st.sampled_from(["act"] * 6 + ["sleep", "signal", "use", "file", "loop"]))
    if kind == "act":
        return draw(act_steps())
    if kind == "sleep":
        return {"kind": "sleep", "seconds": draw(st.sampled_from([0.2, 0.5, 1.5]))}
    if kind == "signal":
        return {"kind": "signal", "early": draw(st.booleans())}
    if kind == "file":
        return {"kind": "file", "whole": draw(st.booleans()),
                "when": draw(st.sampled_from([None, None, False]))}
    if kind == "loop":
        return {"kind": "loop", "items": draw(st.integers(1, 4))}
    return {"kind": "use", "child_steps": draw(st.integers(1, 3)),
            "child_sleep": draw(st.sampled_from([0, 0.5, 1.5])),
            "child_fails": draw(st.sampled_from([False, False, False, True]))}


@st.composite
def operations(draw: st.DrawFn, *, horizon: float, churn: bool,
               restarts: bool = False) -> list[list[Any]]:
    """A schedule of ``[seconds after submit, operation]``."""
    kinds = ["kill", "kill", "zombie", "pause", "pause", "read", "read", "resume",
             "zombie", "resume_notools", "worker_notools", "cancel", "outage",
             "migrate", "migrate", "reset", "label"]
    if churn:
        kinds.append("churn")
    if restarts:
        kinds += ["pg_restart", "pg_restart"]
    n = draw(st.integers(1, 6))
    ops = [[round(draw(st.floats(0.1, horizon)), 2), draw(st.sampled_from(kinds))]
           for _ in range(n)]
    return sorted(ops)


@st.composite
def cases(draw: st.DrawFn, *, max_steps: int = 20, long_chain: int = 0,
          horizon: float = 6.0, churn: bool = False, restarts: bool = False) -> dict[str, Any]:
    """A case: steps mixing every kind, rollback or not, and a schedule of operations.

    ``long_chain`` adds a prefix of that many plain tool steps (up to 300 in the long
    mode), so that runs pass several snapshots."""
    if draw(st.integers(0, 4)) == 0:  # a plain chain, which the graph form can say too
        steps = draw(st.lists(st.builds(lambda u, f: {
            "kind": "act", "undo": u, "retries": 0, "fail_times": f, "whole": False,
            "on_error": None, "when": None, "slow": 0, "confirm": None},
            st.sampled_from(["explicit", "own", "none", "failing"]),
            st.sampled_from([0, 0, 0, 0, 9])), min_size=1, max_size=max_steps))
    else:
        steps = draw(st.lists(any_step(), min_size=1, max_size=max_steps))
    if long_chain:
        n = draw(st.integers(long_chain // 3, long_chain))
        steps = [{"kind": "act", "undo": "explicit", "retries": 0, "fail_times": 0,
                  "whole": i % 2 == 0, "on_error": None, "when": None, "slow": 0}
                 for i in range(n)] + steps
    # a parallel group: a few consecutive plain tool steps that start together
    if draw(st.booleans()) and not all(s["kind"] == "act" and not s.get("slow")
                                       and s.get("confirm") is None for s in steps):
        at = draw(st.integers(0, len(steps)))
        members = draw(st.lists(act_steps(plain=True), min_size=2, max_size=4))
        for m in members:
            m["group"] = "g"
        steps[at:at] = members
    timeout = draw(st.sampled_from([None] * 7 + [3.0]))
    if timeout:  # a run timeout, and a last step only the timeout can end
        steps.append({"kind": "signal", "early": False, "never": True})
    for i, s in enumerate(steps):
        s["id"] = f"s{i}"
    return {"steps": steps, "timeout": timeout,
            "rollback": draw(st.sampled_from([True, True, True, False])),
            "retry_failed": draw(st.booleans()),
            "ops": draw(operations(horizon=horizon, churn=churn, restarts=restarts)),
            "answer_delay": draw(st.sampled_from([0, 0, 1.0, 2.5])),
            "form": draw(st.sampled_from(["list", "list", "graph"])),
            "workers": draw(st.integers(1, 2)), "salt": draw(_ident)}


# -- cases aimed at the known breaks (run first, in every budget) --------------------------


def _a(sid: str, **kw: Any) -> dict[str, Any]:
    return {"id": sid, "kind": "act", "undo": "explicit", "retries": 0, "fail_times": 0,
            "whole": False, "on_error": None, "when": None, "slow": 0, "confirm": None, **kw}


def _case(steps: list[dict[str, Any]], ops: list[list[Any]], salt: int, **kw: Any) -> \
        dict[str, Any]:
    return {"steps": steps, "rollback": True, "retry_failed": False, "ops": ops,
            "workers": 1, "salt": salt, "answer_delay": 0} | kw


TARGETED: dict[str, dict[str, Any]] = {
    # break 1: past several snapshots (interval 10-20), read by new processes mid-run
    "snapshots": _case([_a(f"s{i}", whole=i % 2 == 0) for i in range(35)],
                       [[0.5, "read"], [1.0, "kill"], [1.5, "read"]], 101),
    # break 2: paused while a slow call is in flight; status read while paused
    "pause_in_flight": _case([_a("s0"), _a("s1", slow=1.5), _a("s2", confirm="approve"),
                              _a("s3", slow=0.5)],
                             [[0.6, "pause"], [0.9, "read"], [2.6, "pause"]], 102),
    # break 3: whole-template parameters of tools with their own undo, then a failure
    "own_undo_whole": _case([_a("s0"), _a("s1", undo="own", whole=True),
                             {"id": "s2", "kind": "file", "whole": True},
                             {"id": "s3", "kind": "file", "whole": False},
                             _a("s4", fail_times=9)], [[0.2, "read"]], 103),
    # break 4: a child that sleeps; its parent is cancelled while it waits
    "child_waits_cancel": _case([_a("s0"), {"id": "s1", "kind": "use", "child_steps": 2,
                                            "child_sleep": 3, "child_fails": False},
                                 _a("s2")], [[1.2, "cancel"]], 104),
    # break 5: a run waiting for a person; resume and a worker without the tools module
    "waiting_without_tools": _case([_a("s0"), _a("s1", confirm="approve"),
                                    {"id": "s2", "kind": "signal", "early": False}, _a("s3")],
                                   [[0.6, "resume_notools"], [0.8, "outage"],
                                    [1.6, "resume_notools"], [2.0, "worker_notools"],
                                    [2.5, "resume_notools"]], 105, answer_delay=1.2),
    # break 6: worker churn over a healthy chain with a child and compensations, then a
    # rolling deploy: the driver of a long step killed three times, each past a renewal
    "churn": _case([*[_a(f"s{i}", slow=0.1) for i in range(8)],
                    {"id": "s8", "kind": "use", "child_steps": 2, "child_sleep": 0.5,
                     "child_fails": False}, _a("s9", slow=0.2), _a("s10", slow=1.5)],
                   [[0.3, "churn"], [0.5, "deploy:s10"], [2.0, "churn"], [4.0, "churn"]],
                   106, workers=2),
    # break 8c: a cancel while a call is in flight in a live worker
    "cancel_in_flight": _case([_a("s0"), _a("s1", slow=1.0)], [[0.5, "cancel"]], 108),
    # a new break: saga resume beside the live worker, during a step's retries
    "resume_beside_worker": _case([_a("s0", undo="none", retries=2, fail_times=2, slow=0.3)],
                                  [[0.43, "resume"]], 111),
    # a run timeout while a child sleeps: the run is undone, and so is the child
    "timeout_child": _case([_a("s0"), {"id": "s1", "kind": "use", "child_steps": 1,
                                       "child_sleep": 6, "child_fails": False},
                            {"id": "s2", "kind": "signal", "early": False, "never": True}],
                           [[0.5, "read"]], 110, timeout=2.5),
    # the run's deadline cuts two calls short: the one with its tool's own undo is undone
    # once it returns, the one whose compensate reads its output is named not undone
    "timeout_cut": _case([_a("s0"), _a("s1", undo="own", slow=2.0, group="g"),
                          _a("s2", slow=2.0, group="g")], [[0.5, "read"]], 113, timeout=1.0),
    # the graph form: a chain of task nodes, the last failing, compensated in reverse
    "graph_undo": _case([_a("s0"), _a("s1", undo="none"), _a("s2", undo="own"), _a("s3"),
                         _a("s4", fail_times=9)], [[0.3, "kill"], [0.8, "read"]], 109,
                        form="graph"),
    # issue 40: migrations (safe and not) while a worker holds the run and after a kill,
    # labels, a reset mid-run and one once the run ended; calls in flight as they land
    # (a live worker takes a label or a migration in, and calls nothing twice: 8de91e3)
    "revisions": _case([_a("s0"), _a("s1", slow=0.4), _a("s2", confirm="approve"),
                        _a("s3", undo="own", slow=0.3), _a("s4", undo="none"), _a("s5")],
                       [[0.2, "migrate:change"], [0.5, "migrate:change_started"],
                        [0.8, "reset"], [1.0, "migrate:race"], [1.2, "label"],
                        [9.0, "reset"]], 112, answer_delay=2.5),
    # break 7: a worker stopped past its lease in the middle of a chain of calls
    "zombie": _case([_a(f"s{i}", slow=0.05 if i % 3 else 0.4) for i in range(12)],
                    [[0.3, "zombie"], [1.6, "zombie"]], 107, workers=2),
}
