"""Revising a run in flight as operations of the conformance simulator (issue 40):
``saga migrate``, ``saga reset`` and ``saga label``, interleaved with the kills, pauses
and answers of :mod:`tests.conformance.harness`, and what is checked after.

Each operation draws from a random generator of its own, seeded by the case's salt, so a
saved case makes the same choices again (what they apply to is the run as it stands,
which timing decides, as for every other operation).

- **migrate** writes a new definition made from the run's current one. Safe variants:
  ``append`` (a step after the last, so after any recorded frontier), ``change`` (the
  parameters of a step the log has not touched yet), ``race`` (``append`` by two
  processes at once: one ``DefinitionMigrated``, both exit 0). Unsafe ones:
  ``change_started`` (a started step's parameters), ``remove_started``,
  ``reorder_started``. Sometimes the worker holding the run is killed just before (the
  migration lands between a kill and the recovery).
- **reset** resets the run to a step it has recorded (now and then to one it has not:
  refused), mid-run or once it ended (failed, compensated or completed; the driver
  keeps one reset for that moment), sometimes right after a kill.
- **label** sets and removes labels while workers drive the run.

What is checked after: :mod:`tests.conformance.revisions_check`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.conformance.harness import Simulation

#: The operations of this module (see :data:`tests.conformance.model.OPERATIONS`).
OPS = ("migrate", "reset", "label")
#: Those the driver still performs once the run has ended (the rest are skipped then).
AT_END = ("reset", "label")
SAFE = ("append", "change", "race")
UNSAFE = ("change_started", "remove_started", "reorder_started")
#: What a step is once it has run (a signal step still waiting has not).
SETTLED = {"completed", "failed", "skipped", "compensated"}
_REFUSED_RESET = ("in flight", "compensating", "has not run yet", "nothing to reset",
                  "was undone by its compensation")


def base(key: str) -> str:
    """The step id of a step execution's key (``s3[2]`` -> ``s3``)."""
    return key.split("[", 1)[0]


def step_key(e: dict[str, Any]) -> str:
    """A step event's execution key, as the run names it (``s3``, ``s3[2]``)."""
    it = e["payload"].get("iteration", 0)
    return e["step_id"] if not it else f"{e['step_id']}[{it}]"


class Revisions:
    """The revising operations of one simulation, and what they did (for :func:`check`)."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.rng = random.Random(f"{sim.case['salt']}:revisions")
        self.definition: dict[str, Any] = {}  # the one in force (the harness sets it)
        self.initial: dict[str, Any] = {}
        self.n = 0
        self.migrations: list[dict[str, Any]] = []
        self.resets: list[dict[str, Any]] = []
        self.labels: dict[str, str] = {}
        self.labelled = 0
        #: successful resets so far: the driver answers a re-asked approval again
        self.generation = 0
        self.reopened: set[str] = set()  # signal steps a reset reopened (signal again)

    # -- the operations -----------------------------------------------------------------

    def op(self, name: str, now: float) -> None:
        """Perform one operation: ``migrate``, ``reset``, ``label``; ``migrate:VARIANT``
        names the variant (the aimed cases do), else it is drawn."""
        name, _, variant = name.partition(":")
        if name == "migrate":
            self.migrate(now, variant or None)
        else:
            getattr(self, name)(now)

    def _history(self) -> list[dict[str, Any]]:
        assert self.sim.saga is not None
        return self.sim.saga.history(self.sim.trace.run_id)

    def _maybe_kill(self) -> bool:
        """Now and then kill the worker holding the run first: the command lands between
        a kill and the recovery (a fresh worker is started after it)."""
        if self.rng.random() < 0.3:
            w = self.sim.victim()
            if w is not None:
                w.send_signal(signal.SIGKILL)
                w.wait()
                self.sim.trace.killed.add(w.pid)
                self.sim.trace.ops.append("  (killed the holder first)")
                return True
        return False

    def migrate(self, now: float, variant: str | None = None) -> None:
        self.n += 1
        h = self._history()
        started = {e["step_id"] for e in h if e["type"] == "StepStarted"}
        touched = {e["step_id"] for e in h if e.get("step_id")}
        variant = variant or self.rng.choice(["append"] * 3 + ["change"] * 3 + ["race"]
                                  + ["change_started"] * 2 + ["remove_started",
                                                              "reorder_started"])
        made = self._variant(variant, started, touched)
        if made is None:
            variant, made = "append", self._variant("append", started, touched)
        assert made is not None
        new, target, param = made
        path = self.sim.dir / f"flow-m{self.n}.json"
        path.write_text(json.dumps(new, indent=1), encoding="utf-8")
        record: dict[str, Any] = {"n": self.n, "variant": variant, "target": target,
                                  "param": param, "expect": "safe" if variant in SAFE
                                  else "unsafe", "file": path.name, "definition": new}
        killed = self._maybe_kill()
        run = self.sim.saga.get(self.sim.trace.run_id) if self.sim.saga else None
        record["hash_before"] = run.definition_hash if run is not None else None
        args = ["migrate", self.sim.trace.run_id, "--to", str(path), "--json",
                "--reason", f"sim {variant}", "--actor", f"sim-migrate-{self.n}"]
        results = self._race(args) if variant == "race" else [self.sim.cli(*args, tools=True)]
        if killed:
            self.sim.start_worker()
        record["results"] = []
        for r in results:
            out: dict[str, Any] = {}
            with contextlib.suppress(ValueError):
                out = json.loads(r.stdout) if r.stdout.strip() else {}
            record["results"].append({"rc": r.returncode, "out": out,
                                      "err": r.stderr.strip()[-300:]})
        after = self.sim.saga.get(self.sim.trace.run_id) if self.sim.saga else None
        record["hash_after"] = after.definition_hash if after is not None else None
        record["finished"] = bool(after is not None and after.is_finished)
        self.sim.trace.ops.append(f"  migrate {variant} {target}: exit "
                                  f"{[x['rc'] for x in record['results']]}")
        if any(x["rc"] == 0 and x["out"].get("migrated") for x in record["results"]) or \
                (after is not None and after.definition_hash
                 == next((x["out"].get("to_hash") for x in record["results"]
                          if x["out"].get("to_hash")), None)):
            self.definition = new
        self.migrations.append(record)

    def _race(self, args: list[str]) -> list[subprocess.CompletedProcess[str]]:
        """The same migration by two processes at once."""
        cmd = [sys.executable, "-m", "saga.cli", *args, "--tools", "tests.conformance.tools"]
        procs = [subprocess.Popen(cmd, cwd=self.sim.dir, env=self.sim.env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(2)]
        self.sim.trace.commands += 2
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                self.sim.trace.problems.append(f"`saga {' '.join(args)}` hung for 60 s")
            results.append(subprocess.CompletedProcess(cmd, p.returncode, out, err))
        return results

    # -- new definitions ----------------------------------------------------------------

    def _variant(self, variant: str, started: set[str], touched: set[str]) -> \
            tuple[dict[str, Any], str, Any] | None:
        """A new definition: (it, the step it adds or changes, the parameter the changed
        step must then start with), or None when the run has no step that fits."""
        new = copy.deepcopy(self.definition)
        graph = "nodes" in new
        items = new["nodes"] if graph else new["steps"]
        ids = [s["id"] for s in items]
        if variant in ("append", "race"):
            sid = f"m{self.n}"
            if graph:
                last = new["exit_points"][-1]
                items.append({"id": sid, "type": "task", "task_config": {
                    "role": "sim_plain", "task_template": f"do {sid}: {{input}}"}})
                new["edges"].append({"id": f"e_{sid}", "source": last, "target": sid})
                new["exit_points"] = [sid]
            else:
                items.append({"id": sid, "tool": "sim_plain", "parameters": {"value": sid}})
            return new, sid, None
        if variant in ("change", "change_started"):
            pool = [s for s in items if (s["id"] in started) == (variant == "change_started")
                    and (variant == "change_started" or s["id"] not in touched)
                    and self._changeable(s)]
            if not pool:
                return None
            step = self.rng.choice(pool)
            return new, step["id"], self._change(step)
        if graph:
            return None  # removing or reordering a graph's node: the step-list form only
        pool = [s for s in items if s["id"] in started]
        if not pool:
            return None
        step = self.rng.choice(pool)
        i = ids.index(step["id"])
        if variant == "remove_started":
            items.pop(i)
            if new.get("confirmations"):
                new["confirmations"] = [c for c in new["confirmations"]
                                        if c["step"] != step["id"]]
            return new, step["id"], None
        j = i + 1 if i + 1 < len(items) else i - 1
        if j < 0 or items[i].get("parallel_group") or items[j].get("parallel_group") \
                or items[j].get("when") == "false":
            return None
        items[i], items[j] = items[j], items[i]
        return new, step["id"], None

    @staticmethod
    def _changeable(s: dict[str, Any]) -> bool:
        if "task_config" in s or "use" in s or "loop" in s:
            return True
        p = s.get("parameters")
        return isinstance(p, str) or (isinstance(p, dict) and ("value" in p or "content" in p))

    def _change(self, s: dict[str, Any]) -> Any:
        """Change one step's parameters (or its child's file); returns (name, value) the
        step must start with from now on, or None when that is not a parameter."""
        tag = f"v{self.n}"
        if "task_config" in s:
            s["task_config"]["task_template"] = f"do {s['id']} {tag}: {{input}}"
            return None  # the rendered task holds the input too
        if "use" in s:
            child = Path(s["use"])
            copy_path = child.with_name(f"{child.stem}_{tag}.json")
            copy_path.write_text(child.read_text(encoding="utf-8"), encoding="utf-8")
            s["use"] = str(copy_path)
            return None
        p = s["parameters"]
        if "loop" in s:
            p["tag"] = tag
            return ["tag", tag]
        if isinstance(p, dict):
            if "value" in p:
                p["value"] = f"{s['id']}.{tag}"
                return ["value", p["value"]]
            p["content"] = f"made by {s['id']} {tag}"
            return ["content", p["content"]]
        if "'value'" in p:
            s["parameters"] = re.sub(r"'value': \"[^\"]*\"", f"'value': \"{s['id']}.{tag}\"", p)
            return ["value", f"{s['id']}.{tag}"]
        s["parameters"] = re.sub(r"'content': '[^']*'", f"'content': 'made by {s['id']} {tag}'",
                                 p)
        return ["content", f"made by {s['id']} {tag}"]

    # -- reset and label ----------------------------------------------------------------

    def reset(self, now: float) -> None:
        assert self.sim.saga is not None
        rid = self.sim.trace.run_id
        run = self.sim.saga.get(rid)
        if run.status == "cancelled" or self.sim.trace.cancelled:
            self.sim.trace.ops.append("  reset skipped: the run was cancelled")
            return
        # the step executions it records (a step awaiting its approval has not run yet)
        ran = list(dict.fromkeys(s["step_id"] for s in run.steps.values()))
        items = self.definition.get("nodes") or self.definition.get("steps") or []
        unrun = [s["id"] for s in items if s["id"] not in ran]
        aim = "unrun" if unrun and (not ran or self.rng.random() < 0.15) else "ran"
        if aim == "ran" and not ran:
            return
        step = self.rng.choice(unrun if aim == "unrun" else ran)
        n = len(self.resets) + 1
        actor = f"sim-reset-{n}"
        status = run.status
        killed = self._maybe_kill()
        r = self.sim.cli("reset", rid, "--to", step, "--no-drive", "--actor", actor,
                         "--reason", f"sim reset {n}", "--json")
        if killed:
            self.sim.start_worker()
        self.resets.append({"n": n, "step": step, "actor": actor, "aim": aim,
                            "status": status, "rc": r.returncode,
                            "err": r.stderr.strip()[-300:]})
        self.sim.trace.ops.append(f"  reset to {step} ({aim}, run {status}): exit "
                                  f"{r.returncode}")
        if r.returncode == 0:
            self.generation += 1
            spec = {s["id"]: s for s in self.sim.case["steps"]}
            self.reopened |= {sid for sid, s in spec.items() if s["kind"] == "signal"}
        elif r.returncode != 2 or not any(w in r.stderr for w in _REFUSED_RESET):
            self.sim.trace.problems.append(f"saga reset --to {step} (run {status}) exited "
                                           f"{r.returncode}: {r.stderr.strip()[-300:]}")

    def take_reopened(self) -> set[str]:
        """The signal steps a reset may have reopened since the last call (the driver
        signals them again once they wait)."""
        out, self.reopened = self.reopened, set()
        return out

    def label(self, now: float) -> None:
        keys = self.rng.sample(["team", "tier", "ticket"], self.rng.randint(1, 2))
        changes = {k: self.rng.choice(["a", "b", f"x{self.labelled}", ""]) for k in keys}
        self.labelled += 1
        r = self.sim.cli("label", self.sim.trace.run_id,
                         *[f"{k}={v}" for k, v in changes.items()], "--json")
        self.sim.trace.ops.append(f"  label {changes}: exit {r.returncode}")
        if r.returncode == 0:
            for k, v in changes.items():
                if v:
                    self.labels[k] = v
                else:
                    self.labels.pop(k, None)
            got = json.loads(r.stdout).get("labels")
            if got != self.labels:
                self.sim.trace.problems.append(f"revise: saga label {changes} answered "
                                               f"labels {got}, expected {self.labels}")
        else:
            self.sim.trace.problems.append(f"saga label exited {r.returncode}: "
                                           f"{r.stderr.strip()[-300:]}")
