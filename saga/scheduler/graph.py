"""Deciding what a run of the graph form (seed 004) does next: its readiness rules.

Pure, like the step-list scheduler: it reads only the compiled graph and the run's
history. The choices where seed 004 is silent are listed in
:mod:`saga.composition.graph_form`; this module is where they are carried out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from saga.composition import task_template
from saga.composition.graph_form import (
    Edge,
    GraphPlan,
    LoopCondition,
    MergeNodeConfig,
    Node,
    TransitionCondition,
    gate_step_id,
)
from saga.domain import Run, StepState, child_run_id, step_key
from saga.scheduler.actions import (
    Action,
    CompleteStep,
    FailStep,
    FinishRun,
    RequestApproval,
    SkipStep,
    StartCompensation,
    StartStep,
)
from saga.scheduler.policy import (
    compensation_ending,
    compensation_order,
    namespace,
    next_compensation,
    retry_pending,
)

MAX_REACHED = "max_iterations_reached"


def decide(plan: GraphPlan, run: Run) -> list[Action]:
    """What a graph-form run does next, from its recorded history alone."""
    return [] if run.is_finished else _Decision(plan, run).actions()


def _lookup(value: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def _holds(cond: TransitionCondition | LoopCondition, value: Any, source: str = "") -> bool:
    found, actual = _lookup(value, cond.field)
    if not found and source and cond.field.startswith(source + "."):
        found, actual = _lookup(value, cond.field[len(source) + 1:])  # "node.field" form
    want = cond.value
    checks: dict[str, Callable[[], Any]] = {
            "==": lambda: actual == want, "!=": lambda: actual != want,
            ">": lambda: actual > want, "<": lambda: actual < want,
            ">=": lambda: actual >= want, "<=": lambda: actual <= want,
            "in": lambda: actual in want, "not_in": lambda: actual not in want,
            "contains": lambda: isinstance(actual, str | list | dict) and want in actual,
            "starts_with": lambda: isinstance(actual, str) and actual.startswith(want),
            "ends_with": lambda: isinstance(actual, str) and actual.endswith(want),
    }
    try:
        return found and bool(checks[cond.operator]())
    except TypeError:
        return False


def _describe(cond: TransitionCondition | LoopCondition) -> str:
    return f"{cond.field} {cond.operator} {cond.value!r}"


Contribution = tuple[str, Any, str | None]  # name, data, key of the source instance


class _Decision:
    """One call of :func:`decide`, with the run's state read once."""

    def __init__(self, plan: GraphPlan, run: Run) -> None:
        self.plan, self.run = plan, run
        self.instances: dict[str, dict[int, StepState]] = {}
        for state in run.steps.values():
            self.instances.setdefault(state["step_id"], {})[state["iteration"]] = state
        self.position = {key: i for i, key in enumerate(run.completion_order)}
        # Each loop's takes (completed branch instances its edge fired from), oldest first.
        self.takes: dict[str, list[tuple[int, str]]] = {}
        for eid, (edge, _) in plan.loops.items():
            keys = [step_key(edge.source, s["iteration"])
                    for s in self.instances.get(edge.source, {}).values()
                    if s["status"] == "completed" and self.fires(edge, s["output"])]
            self.takes[eid] = sorted((self.position.get(key, -1), key) for key in keys)
        self.index = {n: sum(len(self.takes[eid]) for eid, (_, body) in plan.loops.items()
                             if n in body) for n in plan.nodes}

    def state(self, node: str, iteration: int | None = None) -> StepState:
        """A node's state at an iteration (default: its current one)."""
        i = self.index[node] if iteration is None else iteration
        return self.instances.get(node, {}).get(i) or {"status": "pending", "iteration": i}

    def fires(self, edge: Edge, output: Any) -> bool:
        """Whether an edge fires from a completed instance of its source."""
        if self.plan.nodes[edge.source].type == "branch":
            output = output if isinstance(output, dict) else {}
            if edge.is_loop_edge and output.get("branch_outcome") == MAX_REACHED:
                return False  # the bound holds whatever the edge's condition says
            if edge.condition is None:
                return bool(output.get("target") == edge.target)
        if edge.condition is None:
            return True
        return _holds(edge.condition, self.data(edge.source, output, raw=True), edge.source)

    def data(self, node_id: str, output: Any, edge: Edge | None = None,
             raw: bool = False) -> Any:
        """What an instance's output offers: to conditions (``raw``) the output, or a
        subgraph's (mapped) child outputs; as data, routing nodes pass their input on."""
        node = self.plan.nodes[node_id]
        value = output
        if node.subgraph_config is not None and isinstance(output, dict):
            value, mapping = output.get("outputs"), node.subgraph_config.output_mapping
            if mapping:  # ``outputs.x`` or the seed's bare ``x``
                value = {k: _lookup(value, path.removeprefix("outputs."))[1]
                         for k, path in mapping.items()}
        elif node.type in ("branch", "parallel", "human") and not raw:
            value = output.get("input") if isinstance(output, dict) else None
        if edge is not None and edge.data_mapping:
            value = {k: _lookup(value, src)[1] for k, src in edge.data_mapping.items()}
        return value

    def edge(self, e: Edge) -> tuple[str, str]:
        """``live``, ``dead`` (with why) or ``open``, for the source's current instance."""
        s = self.state(e.source)
        gates, failing = self.gates(e.source)
        if s["status"] == "completed" and gates == "failed":
            return "dead", f"edge {e.id}: upstream node {e.source!r} failed its gate " \
                           f"{failing!r}"
        if s["status"] == "completed" and gates == "open":
            return "open", ""
        if s["status"] == "completed":
            if self.fires(e, s["output"]):
                return "live", ""
            if e.condition is None:
                return "dead", f"edge {e.id}: branch {e.source!r} chose " \
                               f"{s['output'].get('target')!r}"
            return "dead", f"edge {e.id}: condition {_describe(e.condition)} is false"
        if s["status"] == "skipped" or (s["status"] == "failed"
                                        and not retry_pending(s)):
            verb = "was skipped" if s["status"] == "skipped" else "failed"
            return "dead", f"edge {e.id}: upstream node {e.source!r} {verb}"
        return "open", ""

    def incoming(self, v: str, i: int) -> tuple[str, list[Contribution], str]:
        """(``ready``/``wait``/``skip``, what flows in, why skipped) for instance i of v."""
        plan = self.plan
        live: list[Contribution] = []
        if v == plan.model.entry_point:
            live.append(("input", self.run.inputs.get("input", self.run.inputs), None))
        inside: frozenset[str] | None = None  # the body that re-activated this instance
        activator: Contribution | None = None
        latest = max(((self.takes[eid][-1], eid) for eid, (_, body) in plan.loops.items()
                      if v in body and self.takes[eid]), default=None) if i else None
        if latest is not None:
            (_, key), eid = latest
            loop, inside = plan.loops[eid]
            if loop.target == v:
                out = self.run.steps[key]["output"]
                activator = (loop.source, self.data(loop.source, out, loop), key)
        any_live = bool(live) or activator is not None
        dead: list[str] = []
        waiting = False
        for e in plan.incoming[v]:
            status, why = self.edge(e)
            # Under `any`, a re-run waits for its own body, not for edges fired long ago.
            counts = inside is None or e.source in inside or plan.wait_rule(v) == "all"
            if status == "live":
                s = self.state(e.source)
                live.append((e.source, self.data(e.source, s["output"], e),
                             step_key(e.source, s["iteration"])))
                any_live = any_live or counts
            elif status == "dead" and counts:
                dead.append(why)
            elif status == "open" and counts:
                waiting = True
        live += [activator] if activator else []
        if plan.wait_rule(v) == "all":
            if dead:
                return "skip", live, "; ".join(dead)
            return ("wait" if waiting else "ready"), live, ""
        if any_live:
            return "ready", live, ""
        return ("wait" if waiting else "skip"), live, \
            "no incoming edge can fire: " + "; ".join(dead)

    def actions(self) -> list[Action]:
        """Compensate, stop after a failure, start or decide what is ready, or finish."""
        run, plan = self.run, self.plan
        if run.compensation is not None:
            return self.compensation()
        failed = self.failed()
        if failed is not None and plan.definition.error_handling.failure_strategy == "fail_fast":
            return [] if self.busy() else self.after_failure(failed)
        starts: list[Action] = [
            StartStep(s["step_id"], s["iteration"], s["attempt"] + 1,
                                s["parameters"], not_before=s["retry_at"])
            for s in run.steps.values() if retry_pending(s) and "parameters" in s]
        slots = plan.definition.max_concurrency - self.busy()
        for v in plan.order:
            state = self.state(v)
            # A failure decided here, before any call, is decided again on a redrive.
            redo = retry_pending(state) and "parameters" not in state
            if state["status"] != "pending" and not redo:
                gate = self.next_gate(v)
                if gate is not None and slots > 0:
                    slots -= 1
                    starts.append(gate)
                continue
            action = self.ready(v, self.index[v])
            if isinstance(action, StartStep):
                if slots > 0:
                    slots -= 1
                    starts.append(action)
            elif isinstance(action, RequestApproval):
                starts.append(action)
            elif action is not None:
                # One structural decision at a time: it may change what else is ready
                # (a loop re-activates its body), and replay checks each against decide.
                return [action]
        if starts or self.busy() or run.pending_approvals:
            return starts
        return self.after_failure(failed) if failed is not None else [self.finish()]

    def ready(self, v: str, i: int) -> Action | None:
        """What to do with a pending instance: start, decide, skip it, or wait (None)."""
        cancelled = self.cancelled(v)
        if cancelled is not None:
            return SkipStep(v, i, cancelled)
        status, live, reason = self.incoming(v, i)
        if status != "ready":
            return SkipStep(v, i, reason) if status == "skip" else None
        node = self.plan.nodes[v]
        data = live[0][1] if len(live) == 1 else {name: value for name, value, _ in live}
        if node.task_config is not None:
            task = node.task_config
            text = data if isinstance(data, str) else json.dumps(
                data, sort_keys=True, ensure_ascii=False, default=str)
            try:
                rendered = task_template.render(task.task_template, text, self.fields(live))
            except task_template.TemplateFieldError as e:
                return FailStep(node.id, i, 1, "TemplateError", f"task_template: {e}")
            params: dict[str, Any] = {"task": rendered}
            if task.worktree_id:
                params["worktree_id"] = task.worktree_id
            return StartStep(node.id, i, 1, params)
        if node.gate_config is not None:
            extra = {} if node.gate_config.requires_worktree else {"requires_worktree": False}
            return StartStep(node.id, i, 1, {"input": data, **extra})
        if node.subgraph_config is not None:
            return self.subgraph(node, i, data)
        if node.branch_config is not None:
            return self.branch(node, i, live, data)
        if node.human_config is not None:
            return self.human(node, i, data)
        if node.parallel_config is not None:
            output = {"branches": node.parallel_config.branches, "input": data}
        else:
            output = self.merge(node, live)
        return CompleteStep(node.id, i, output)

    def gates(self, v: str) -> tuple[str, str | None]:
        """A completed task's gates, at its current instance: ``completed`` (all passed),
        ``failed`` (with the gate that failed for good) or ``open``."""
        node = self.plan.nodes[v]
        for gate in node.task_config.gates if node.task_config is not None else []:
            s = self.state(gate_step_id(v, gate), self.index[v])
            if s["status"] == "failed" and not retry_pending(s):
                return "failed", gate
            if s["status"] != "completed":
                return "open", None
        return "completed", None

    def next_gate(self, v: str) -> StartStep | None:
        """Start the next gate of a task that completed: after the task, one at a time,
        in the order listed, each given the task's output (and worktree)."""
        state = self.state(v)
        node = self.plan.nodes[v]
        if state["status"] != "completed" or node.task_config is None:
            return None
        for gate in node.task_config.gates:
            s = self.state(gate_step_id(v, gate), self.index[v])
            if s["status"] == "completed":
                continue
            if s["status"] != "pending":
                return None
            params: dict[str, Any] = {"input": state["output"]}
            if node.task_config.worktree_id:
                params["worktree_id"] = node.task_config.worktree_id
            return StartStep(gate_step_id(v, gate), self.index[v], 1, params)
        return None

    def cancelled(self, v: str) -> str | None:
        """Why a pending node is cancelled: it lies on a branch of a ``wait_for: first``
        parallel node whose merge already went on with another branch."""
        for p, (join, between) in self.plan.joins.items():
            config = self.plan.nodes[p].parallel_config
            if v not in between or config is None or config.wait_for != "first":
                continue
            fan, met = self.state(p), self.state(join)
            if fan["status"] == met["status"] == "completed" and \
                    self.position.get(step_key(join, met["iteration"]), -1) > \
                    self.position.get(step_key(p, fan["iteration"]), -1):
                return f"cancelled: {join!r} went on with the first branch of parallel " \
                       f"{p!r} to finish (wait_for: first)"
        return None

    def fields(self, live: list[Contribution]) -> dict[str, Any]:
        """The fields a task_template may name, as seed 004's ``input_data`` holds them:
        the run inputs (for the entry node), then each dict that arrived, field by field
        (later edges win), and anything else under its source's id."""
        fields: dict[str, Any] = {}
        for name, value, key in live:
            if key is None and name == "input":
                fields.update(self.run.inputs)
            elif isinstance(value, dict):
                fields.update(value)
            else:
                fields[name] = value
        return fields

    def subgraph(self, node: Node, i: int, data: Any) -> Action:
        config = node.subgraph_config
        assert config is not None
        inputs = data if isinstance(data, dict) else {"input": data}
        if config.input_mapping:
            names, inputs = {"input": data, "inputs": self.run.inputs}, {}
            for name, path in config.input_mapping.items():
                found, inputs[name] = _lookup(names, path)
                if not found and path.split(".")[0] not in names:
                    # seed 004's bare name (``topic: task``): the node's data, else the
                    # run's inputs
                    found, inputs[name] = _lookup(data, path)
                    if not found:
                        found, inputs[name] = _lookup(self.run.inputs, path)
                if not found:
                    return FailStep(node.id, i, 1, "ExpressionError",
                                              f"input_mapping.{name}: nothing at {path!r}")
        return StartStep(node.id, i, 1, {
            "use": config.workflow_name, "inputs": inputs,
            "run": child_run_id(self.run.run_id, node.id, i,
                                (self.run.__dict__.get("generations") or {}).get(node.id, 0))})

    def branch(self, node: Node, i: int, live: list[Contribution],
               data: Any) -> Action:
        """The branch's decision, bounded by ``max_iterations``."""
        config = node.branch_config
        assert config is not None
        # The condition reads its sources' outputs as edge conditions do (a human's
        # ``approved``, a gate's ``test_status``), or by source (``test.test_status``).
        outputs = {name: value if key is None else
                   self.data(name, self.run.steps[key]["output"], raw=True)
                   for name, value, key in live}
        names = dict(outputs)
        for value in outputs.values():
            names.update(value if isinstance(value, dict) else {})
        holds = _holds(config.condition, names)
        target: str | None
        outcome, target = ("on_true", config.on_true) if holds else ("on_false", config.on_false)
        loops = [edge for edge, _ in self.plan.loops.values() if edge.source == node.id]
        count = 0  # how many instances just before this one took the loop, in a row
        while count < i:
            before = self.state(node.id, i - count - 1)
            if before["status"] != "completed" \
                    or not any(self.fires(e, before["output"]) for e in loops):
                break
            count += 1
        if any(e.target == target for e in loops) and count >= config.condition.max_iterations:
            exit_on_false = not any(e.target == config.on_false for e in loops)
            outcome, target = MAX_REACHED, config.on_false if exit_on_false else None
        output = {"branch_outcome": outcome, "target": target, "iteration": count, "input": data}
        onward = [e for e in self.plan.model.edges if e.source == node.id]
        if outcome == MAX_REACHED and not any(self.fires(e, output) for e in onward):
            return FailStep(node.id, i, 1, "MaxIterationsReached",
                                      f"branch {node.id!r} reached max_iterations "
                                      f"({config.condition.max_iterations} loops) and "
                                      f"{_describe(config.condition)} still does not hold")
        return CompleteStep(node.id, i, output)

    def human(self, node: Node, i: int, data: Any) -> Action | None:
        config = node.human_config
        assert config is not None
        key = step_key(node.id, i)
        approval = self.run.approvals.get(key)
        gates = self.plan.auto_approved.get(node.id, ())
        if approval is None and gates and all(
                self.state(g)["status"] == "completed"
                and (self.state(g).get("output") or {}).get("passed") is True for g in gates):
            return CompleteStep(node.id, i, {
                "approved": True, "actor": "auto",
                "comment": f"auto_approve: gate{'s' if len(gates) > 1 else ''} "
                           f"{', '.join(gates)} passed", "input": data})
        if approval is None:
            text = f"{config.title}: {config.description}" if config.description else config.title
            return RequestApproval(key, text)
        if approval["status"] == "requested":
            return None
        return CompleteStep(node.id, i, {
            "approved": approval["status"] == "granted", "actor": approval.get("actor"),
            "comment": approval.get("comment"), "input": data})

    def merge(self, node: Node, live: list[Contribution]) -> Any:
        """The inputs merged by the strategy, in the order their sources completed."""
        strategy = (node.merge_config or MergeNodeConfig()).merge_strategy
        ordered = sorted(live, key=lambda c: self.position.get(c[2] or "", -1))
        if strategy == "first":
            return ordered[0][1] if ordered else None
        parts = [v if isinstance(v, dict) else {name: v} for name, v, _ in ordered]
        merged = {k: v for part in parts for k, v in part.items()}  # later inputs win
        if strategy == "intersection":
            common = set.intersection(*(set(p) for p in parts)) if parts else set()
            merged = {k: v for k, v in merged.items() if k in common}
        return merged

    def busy(self) -> int:
        """Instances running or waiting for their retry."""
        return sum(1 for s in self.run.steps.values()
                   if s["status"] == "running" or retry_pending(s))

    def failed(self) -> str | None:
        """The first instance that failed for good."""
        return next((key for key, s in self.run.steps.items()
                     if s["status"] == "failed" and not retry_pending(s)), None)

    def latest_outputs(self) -> dict[str, Any]:
        """Each node's latest completed (or compensated) output."""
        out: dict[str, Any] = {}
        for node in self.plan.nodes:
            for _, s in sorted(self.instances.get(node, {}).items()):
                if s["status"] in ("completed", "compensated"):
                    out[node] = s["output"]
        return out

    def after_failure(self, key: str) -> list[Action]:
        error = self.run.steps[key].get("error") or {}
        to_undo = compensation_order(self.plan, self.run)
        if to_undo:
            reason = f"node {key!r} failed: {error.get('message', '')}"
            return [StartCompensation(reason, to_undo)]
        return [FinishRun("failed", self.latest_outputs(), dict(error, step=key), key)]

    def compensation(self) -> list[Action]:
        comp = self.run.compensation
        assert comp is not None
        if any(key not in comp["done"] for key in comp["steps"]):
            action = next_compensation(self.plan, self.run, namespace(self.plan, self.run))
            return [action] if action is not None else []
        return [compensation_ending(self.run, self.failed(), self.latest_outputs())]

    def finish(self) -> FinishRun:
        exits = self.plan.model.exit_points
        stuck = [x for x in exits if self.state(x)["status"] not in ("completed", "skipped")]
        if stuck:  # a safety net: every node is eventually decided, so this is a bug
            return FinishRun("failed", self.latest_outputs(), {
                "type": "Stalled", "message": f"exit point {stuck[0]!r} never finished"})
        return FinishRun("completed",
                                   {x: self.state(x).get("output") for x in exits})
