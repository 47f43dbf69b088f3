"""The graph form of compositions (seed 004): nodes and edges, compiled into a plan the
executor drives like a step list, but which decides with its own readiness rules.

:func:`compile_graph` validates the document (pydantic models mirroring seed 004, unknown
keys are errors, plus every check of seed 004's ``validate_graph``) and returns a
:class:`GraphPlan`, a :class:`saga.plan.Plan` whose ``definition`` holds one synthesised
step per node and whose :meth:`GraphPlan.decide` is pure: it reads only the run's history.

Choices where seed 004 is silent (each is tested in tests/test_graph.py):

* **Loops.** A loop edge must start at a branch node. Taking it re-activates its *body*
  (the nodes on a path from its target back to the branch): a node's current execution
  is number k, recorded as ``node[k]``, where k counts the takes of the loops whose body
  holds it. Nodes outside the body run once. A re-activated node waits for the edges
  from inside the body (and its loop edge); edges from outside count only under ``all``.
* **{input}** is the node's input as text (a string as is, else sorted JSON). The input
  is the data on every edge that fired into it, plus the run input ``input`` (else all
  run inputs) for the entry node and the branch's input for a loop re-activation: one
  such value as is, several as an object keyed by source id (``input`` for the run
  input). Branch, parallel and human nodes pass their input on; ``data_mapping`` picks.
* **Gates** fail (``ExpectationFailed``, then fail_fast) unless they answer ``passed:
  true``, except a gate all of whose edges lead to branches: it only reports, and the
  branch reads its output (``field: test_status``).
* **Branches** evaluate their condition first. When the chosen target is the loop and
  the loop was taken ``max_iterations`` times in a row (the body ran max_iterations + 1
  times), the outcome is ``max_iterations_reached`` and the branch follows ``on_false``
  unless that is the loop; when no edge fires then, it fails with
  ``MaxIterationsReached`` (so the run fails, compensating first). An unconditional
  edge out of a branch fires when its target is the chosen one.
* **Skips.** A node is skipped once its wait rule cannot hold (``any``: every edge is
  dead; ``all``: one is). An edge is dead when its condition is false or its source was
  skipped or failed (the reason then says "upstream", which ``saga retry`` re-decides).
  A missing field or incomparable values make a condition false.
* **Human** approvals are keyed by instance (``review``, ``review[1]``); a decision
  completes the node with ``{"approved", "actor", "comment", "input"}``.
* **Outcome.** The run completes when nothing is left to do and every exit point
  finished or was skipped, with each exit point's output by id (null when skipped).
  Failed and compensated runs report each node's latest output.
* **Extensions**: ``task_config.compensate`` and ``task_config.retry`` (as in the
  step-list form). ``gates`` and ``worktree_id`` are passed to the role's tool;
  ``parallel_config.wait_for`` and ``gate_config.auto_approve`` are recorded only.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from saga import expressions, scheduler
from saga.definition import Definition, ErrorHandling, RetryPolicy, Step, ToolCall, definition_hash
from saga.domain import Run, step_key
from saga.errors import DefinitionError, Problem
from saga.nesting import child_run_id
from saga.plan import Plan

MAX_REACHED = "max_iterations_reached"
_TYPES = ("task", "gate", "branch", "merge", "parallel", "subgraph", "human")
_OPS = Literal["==", "!=", ">", "<", ">=", "<=", "in", "not_in", "contains", "starts_with",
               "ends_with"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Condition(_Model):
    field: str
    value: Any

    @field_validator("field")
    @classmethod
    def _safe_field(cls, value: str) -> str:
        if not value.replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"invalid field name: {value!r}")
        return value

    @field_validator("value")
    @classmethod
    def _plain_value(cls, value: Any) -> Any:
        if not isinstance(value, str | int | float | bool) and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ValueError("must be a string, number, boolean or list of strings")
        return value


class TransitionCondition(_Condition):
    """A structured edge condition: ``field`` (dotted) into the source's output."""

    operator: _OPS


class LoopCondition(_Condition):
    """A branch node's condition, with the bound on how often its loop may be taken."""

    operator: Literal["==", "!=", ">", "<", ">=", "<=", "in", "not_in"]
    max_iterations: int = Field(default=10, ge=1, le=10_000)


class Edge(_Model):
    """A directed edge, optionally conditional; a loop edge re-runs its target."""

    id: str
    source: str
    target: str
    condition: TransitionCondition | None = None
    data_mapping: dict[str, str] | None = None
    is_loop_edge: bool = False


class TaskNodeConfig(_Model):
    """Run a role (a tool) with the rendered task text."""

    role: str
    task_template: str = "{input}"
    timeout: int | None = Field(default=None, gt=0, description="seconds")
    gates: list[str] = Field(default_factory=list)
    worktree_id: str | None = None
    compensate: ToolCall | None = None  # extension: how to undo the task
    retry: RetryPolicy | None = None  # extension: retries of the role's tool

    @field_validator("compensate", mode="before")
    @classmethod
    def _no_compensation(cls, value: Any) -> Any:
        return None if value is False else value


class GateNodeConfig(_Model):
    """Run a verification gate (a tool answering ``{"passed": bool, ...}``)."""

    gate_type: str
    auto_approve: bool = False
    requires_worktree: bool = True


class BranchNodeConfig(_Model):
    """Choose ``on_true`` or ``on_false`` by a structured condition over the input."""

    condition: LoopCondition
    on_true: str
    on_false: str


class MergeNodeConfig(_Model):
    """Join incoming edges and merge their data."""

    wait_for: Literal["all", "any"] = "all"
    merge_strategy: Literal["union", "intersection", "first"] = "union"


class ParallelNodeConfig(_Model):
    """Fan out to ``branches`` (each needs an edge from this node)."""

    branches: list[str]
    wait_for: Literal["all", "any", "first"] = "all"


class SubgraphNodeConfig(_Model):
    """Run a composition file or template as a nested child run."""

    workflow_name: str = Field(min_length=1)
    input_mapping: dict[str, str] = Field(default_factory=dict)
    output_mapping: dict[str, str] = Field(default_factory=dict)


class HumanNodeConfig(_Model):
    """Wait for a person's approval."""

    title: str
    description: str | None = None


class Node(_Model):
    """One node: its type and the configuration of that type (and only that one)."""

    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")
    type: Literal["task", "gate", "branch", "merge", "parallel", "subgraph", "human"]
    label: str | None = None
    description: str | None = None
    task_config: TaskNodeConfig | None = None
    gate_config: GateNodeConfig | None = None
    branch_config: BranchNodeConfig | None = None
    merge_config: MergeNodeConfig | None = None
    parallel_config: ParallelNodeConfig | None = None
    subgraph_config: SubgraphNodeConfig | None = None
    human_config: HumanNodeConfig | None = None
    ui_metadata: dict[str, Any] | None = None
    wait_for_incoming: Literal["all", "any"] = "any"

    @model_validator(mode="after")
    def _one_config(self) -> Node:
        # A merge node may leave merge_config out: every field of it has a default.
        if getattr(self, f"{self.type}_config") is None and self.type != "merge":
            raise ValueError(f"a {self.type} node needs {self.type}_config")
        for kind in _TYPES:
            if kind != self.type and getattr(self, f"{kind}_config") is not None:
                raise ValueError(f"a {self.type} node takes no {kind}_config")
        return self

    @property
    def wait_rule(self) -> str:
        """``all`` or ``any``: which incoming edges must fire (a merge's ``wait_for``)."""
        if self.type == "merge":
            return (self.merge_config or MergeNodeConfig()).wait_for
        return self.wait_for_incoming


class GraphConfig(_Model):
    """Run-wide settings."""

    max_parallel_nodes: int = Field(default=4, ge=1, le=1024)
    fail_fast: bool = True


class _Head(_Model):
    id: str
    name: str = Field(min_length=1)
    description: str | None = None
    version: str = "1.0.0"
    entry_point: str
    exit_points: list[str] = Field(default_factory=list)
    config: GraphConfig = Field(default_factory=GraphConfig)

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value


class WorkflowGraph(_Head):
    """A whole graph-form composition."""

    nodes: list[Node] = Field(min_length=1)
    edges: list[Edge] = Field(default_factory=list)


def compile_graph(data: dict[str, Any], *, tools: Any = None,
                  source: str | None = None) -> GraphPlan:
    """Compile a graph-form composition into a GraphPlan, or raise DefinitionError with
    every problem found (model problems and graph problems together).

    Args:
        data: the composition as loaded from YAML/JSON (``nodes``, ``edges``, ...).
        tools: the available tools by name; when given, unknown roles, gate types and
            compensation tools are problems.
        source: a file name to mention in the error.
    """
    if not isinstance(data, dict):
        raise DefinitionError([Problem("", "a composition must be a mapping")], source)
    problems: list[Problem] = []
    head = _validate(_Head, {k: v for k, v in data.items() if k not in ("nodes", "edges")},
                     "", problems)
    nodes = _validate_list(data, "nodes", Node, problems, required=True)
    edges = _validate_list(data, "edges", Edge, problems, required=False)
    # Graph checks run even when other parts are malformed, on what can be read.
    entry = data.get("entry_point") if head is None else head.entry_point
    given = data.get("exit_points") if head is None else head.exit_points
    given = [x for x in given if isinstance(x, str)] if isinstance(given, list) else []
    raw = data.get("nodes") if isinstance(data.get("nodes"), list) else []
    ids = [(i, n["id"]) for i, n in enumerate(raw)
           if isinstance(n, dict) and isinstance(n.get("id"), str)]
    reach = len(edges) == len(data.get("edges") or [])  # judged only with every edge read
    exits = _graph_problems(entry if isinstance(entry, str) else None, given, ids, nodes,
                            edges, tools, problems, reach)
    if problems:
        raise DefinitionError(problems, source)
    model = WorkflowGraph.model_validate(data).model_copy(update={"exit_points": exits})
    flow = nx.DiGraph()
    for node in model.nodes:
        flow.add_node(node.id, step=_step(model, node))
    flow.add_edges_from((e.source, e.target) for e in model.edges if not e.is_loop_edge)
    index = {node.id: i for i, node in enumerate(model.nodes)}
    order = tuple(nx.lexicographical_topological_sort(flow, key=lambda n: f"{index[n]:08d}"))
    strategy = "fail_fast" if model.config.fail_fast else "partial_success"
    definition = Definition(
        name=model.name, version=model.version, description=model.description,
        steps=[flow.nodes[n.id]["step"] for n in model.nodes],
        max_concurrency=model.config.max_parallel_nodes,
        error_handling=ErrorHandling(failure_strategy=strategy),
        metadata={"form": "graph", "graph_id": model.id})
    return GraphPlan(definition, flow, order, model)


def _validate(model: type[BaseModel], raw: Any, prefix: str, problems: list[Problem]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        for err in e.errors():
            path = prefix
            for part in err["loc"]:
                if isinstance(part, int):
                    path += f"[{part}]"
                elif "function-" not in str(part):
                    path += f".{part}" if path else str(part)
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key (not part of the graph form)"
            problems.append(Problem(path, message))
        return None


def _validate_list(data: dict[str, Any], key: str, model: type[BaseModel],
                   problems: list[Problem], required: bool) -> list[tuple[int, Any]]:
    """Each item validated on its own, so graph checks still run on the valid ones."""
    raw = data.get(key)
    if not required and not raw:
        return []
    if not isinstance(raw, list) or not raw:
        problems.append(Problem(key, "must be a non-empty list" if required else "must be a list"))
        return []
    items = [(i, _validate(model, item, f"{key}[{i}]", problems)) for i, item in enumerate(raw)]
    return [(i, item) for i, item in items if item is not None]


def _graph_problems(entry: str | None, given: list[str], ids: list[tuple[int, str]],
                    nodes: list[tuple[int, Node]], edges: list[tuple[int, Edge]], tools: Any,
                    problems: list[Problem], reach: bool) -> list[str]:
    """Seed 004's validate_graph checks and this engine's own; returns the exit points.
    ``ids`` are every node id that can be read, so an edge to a malformed node is not also
    reported as an edge to an unknown one."""
    def add(path: str, message: str) -> None:
        problems.append(Problem(path, message))

    where: dict[str, int] = {}
    for i, node_id in ids:
        if node_id in where:
            add(f"nodes[{i}].id",
                f"duplicate node id {node_id!r} (first at nodes[{where[node_id]}])")
        where.setdefault(node_id, i)
    seen: dict[str, int] = {}
    pairs: dict[tuple[str, str], int] = {}
    full, flow = nx.DiGraph(), nx.DiGraph()
    full.add_nodes_from(where)
    flow.add_nodes_from(where)
    for i, e in edges:
        if e.id in seen:
            add(f"edges[{i}].id", f"duplicate edge id {e.id!r} (first at edges[{seen[e.id]}])")
        if (e.source, e.target) in pairs:
            add(f"edges[{i}]", f"duplicate edge from {e.source!r} to {e.target!r} "
                               f"(first at edges[{pairs[e.source, e.target]}])")
        seen.setdefault(e.id, i)
        pairs.setdefault((e.source, e.target), i)
        for end in ("source", "target"):
            if getattr(e, end) not in where:
                add(f"edges[{i}].{end}", f"{end} {getattr(e, end)!r} not found")
        if e.source in where and e.target in where:
            full.add_edge(e.source, e.target)
            if not e.is_loop_edge:
                flow.add_edge(e.source, e.target)
    if entry is not None and entry not in where:
        add("entry_point", f"entry point {entry!r} not found")
    for i, x in enumerate(given):
        if x not in where:
            add(f"exit_points[{i}]", f"exit point {x!r} not found")
    exits = list(given) or [n for n in where if full.out_degree(n) == 0]
    if not exits:
        add("exit_points", "no exit points found (no terminal nodes)")
    for cycle in itertools.islice(nx.simple_cycles(flow), 10):
        first = min(range(len(cycle)), key=lambda k: where[cycle[k]])  # a stable start
        cycle = cycle[first:] + cycle[:first]
        add("edges", f"cycle without loop control: {' -> '.join([*cycle, cycle[0]])}")
    types = {node.id: node.type for _, node in nodes}
    bodies: dict[str, set[str]] = {}
    for i, e in edges:
        if not e.is_loop_edge or e.source not in where or e.target not in where:
            continue
        if not nx.has_path(flow, e.target, e.source):
            add(f"edges[{i}].is_loop_edge",
                f"{e.target!r} does not lead back to {e.source!r}: not a loop")
        elif types.get(e.source, "branch") != "branch":
            path = " -> ".join([*nx.shortest_path(flow, e.target, e.source), e.target])
            add(f"edges[{i}]", f"cycle without loop control: {path} (a loop edge must start "
                               "at a branch node, whose max_iterations bounds it)")
        else:
            bodies[e.id] = _body(flow, e)
    for (a, body_a), (b, body_b) in itertools.combinations(bodies.items(), 2):
        if body_a & body_b and not (body_a <= body_b or body_b <= body_a):
            add("edges", f"the loops of edges {a!r} and {b!r} overlap without nesting")
    if reach and entry in where:
        reached = nx.descendants(full, entry) | {entry}
        for n in where:
            if n not in reached:
                add(f"nodes[{where[n]}]", f"node {n!r} cannot be reached from the entry "
                                          f"point {entry!r}")
    for i, node in nodes:
        _node_problems(node, f"nodes[{i}]", pairs, full, tools, add)
    return exits


def _node_problems(node: Node, at: str, pairs: dict[Any, int], full: nx.DiGraph, tools: Any,
                   add: Any) -> None:
    def tool(path: str, name: str, what: str) -> None:
        if tools is not None and name not in tools:
            add(f"{at}.{path}", f"unknown {what} {name!r} (no tool of that name)")

    if node.type == "merge" and full.in_degree(node.id) < 2:
        add(at, f"merge node {node.id!r} should have at least 2 incoming edges "
                f"(has {full.in_degree(node.id)})")
    if node.task_config is not None:
        task = node.task_config
        tool("task_config.role", task.role, "role")
        for k, gate in enumerate(task.gates):
            tool(f"task_config.gates[{k}]", gate, "gate type")
        if task.compensate is not None:
            if task.compensate.tool is not None:
                tool("task_config.compensate.tool", task.compensate.tool, "tool")
            for msg in expressions.check_template(task.compensate.parameters):
                add(f"{at}.task_config.compensate.parameters", msg)
    if node.gate_config is not None:
        tool("gate_config.gate_type", node.gate_config.gate_type, "gate type")
    targets = []
    if node.branch_config is not None:
        targets = [("branch_config.on_true", node.branch_config.on_true),
                   ("branch_config.on_false", node.branch_config.on_false)]
    if node.parallel_config is not None:
        targets = [(f"parallel_config.branches[{k}]", b)
                   for k, b in enumerate(node.parallel_config.branches)]
    for path, target in targets:
        if target not in full:
            add(f"{at}.{path}", f"node {target!r} not found")
        elif (node.id, target) not in pairs:
            add(f"{at}.{path}", f"no edge from {node.id!r} to {target!r}")


def _body(flow: nx.DiGraph, e: Edge) -> set[str]:
    """The nodes a loop edge re-runs: on a path from its target back to its source."""
    return (nx.descendants(flow, e.target) | {e.target}) & \
        (nx.ancestors(flow, e.source) | {e.source})


def _step(model: WorkflowGraph, node: Node) -> Step:
    """The synthesised step of a node: what the executor calls, times out, retries and
    compensates. Branch, merge, parallel and human nodes never reach the executor."""
    base: dict[str, Any] = {"id": node.id, "description": node.label or node.description}
    if node.task_config is not None:
        task = node.task_config
        return Step(**base, tool=task.role, parameters={"task": task.task_template},
                    timeout=task.timeout, retry=task.retry, compensate=task.compensate)
    if node.gate_config is not None:
        types = {n.id: n.type for n in model.nodes}
        onward = [types[e.target] for e in model.edges if e.source == node.id]
        # A gate read by branches only reports: the branch decides what failure means.
        reports = bool(onward) and all(t == "branch" for t in onward)
        return Step(**base, tool=node.gate_config.gate_type,
                    expect=None if reports else "output.passed == True")
    if node.subgraph_config is not None:
        return Step(**base, use=node.subgraph_config.workflow_name,
                    parameters=dict(node.subgraph_config.input_mapping))
    # `confirm` on a human step makes nesting refuse a graph that waits for people.
    title = node.human_config.title if node.human_config is not None else None
    return Step(**base, tool="noop", confirm=title)


@dataclass(frozen=True)
class GraphPlan(Plan):
    """A compiled graph: the Plan interface (``graph`` holds the non-loop edges, so levels
    and the critical path ignore loops) plus :meth:`decide`, the graph's readiness rules."""

    model: WorkflowGraph

    def record(self) -> dict[str, Any]:
        """The normalised graph (exit points filled in) as recorded in ``RunStarted``."""
        return self.model.model_dump(mode="json", exclude_defaults=True)

    def digest(self) -> str:
        """sha256 of :meth:`record`'s canonical JSON."""
        return definition_hash(self.record())

    @functools.cached_property
    def nodes(self) -> dict[str, Node]:
        """Nodes by id."""
        return {node.id: node for node in self.model.nodes}

    @functools.cached_property
    def incoming(self) -> dict[str, list[Edge]]:
        """Each node's incoming non-loop edges, in document order."""
        return {n: [e for e in self.model.edges if e.target == n and not e.is_loop_edge]
                for n in self.nodes}

    @functools.cached_property
    def loops(self) -> dict[str, tuple[Edge, frozenset[str]]]:
        """Each loop edge with its body, by edge id."""
        return {e.id: (e, frozenset(_body(self.graph, e)))
                for e in self.model.edges if e.is_loop_edge}

    def decide(self, run: Run) -> list[scheduler.Action]:
        """What the run does next, from its recorded history alone (pure)."""
        return [] if run.is_finished else _Decision(self, run).actions()


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
    try:
        return found and bool({
            "==": lambda: actual == want, "!=": lambda: actual != want,
            ">": lambda: actual > want, "<": lambda: actual < want,
            ">=": lambda: actual >= want, "<=": lambda: actual <= want,
            "in": lambda: actual in want, "not_in": lambda: actual not in want,
            "contains": lambda: isinstance(actual, str | list | dict) and want in actual,
            "starts_with": lambda: isinstance(actual, str) and actual.startswith(want),
            "ends_with": lambda: isinstance(actual, str) and actual.endswith(want),
        }[cond.operator]())
    except TypeError:
        return False


def _describe(cond: TransitionCondition | LoopCondition) -> str:
    return f"{cond.field} {cond.operator} {cond.value!r}"


Contribution = tuple[str, Any, str | None]  # name, data, key of the source instance


class _Decision:
    """One call of :meth:`GraphPlan.decide`, with the run's state read once."""

    def __init__(self, plan: GraphPlan, run: Run) -> None:
        self.plan, self.run = plan, run
        self.instances: dict[str, dict[int, dict[str, Any]]] = {}
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

    def state(self, node: str, iteration: int | None = None) -> dict[str, Any]:
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
                return output.get("target") == edge.target
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
            if mapping:
                value = {k: _lookup(value, path)[1] for k, path in mapping.items()}
        elif node.type in ("branch", "parallel", "human") and not raw:
            value = output.get("input") if isinstance(output, dict) else None
        if edge is not None and edge.data_mapping:
            value = {k: _lookup(value, src)[1] for k, src in edge.data_mapping.items()}
        return value

    def edge(self, e: Edge) -> tuple[str, str]:
        """``live``, ``dead`` (with why) or ``open``, for the source's current instance."""
        s = self.state(e.source)
        if s["status"] == "completed":
            if self.fires(e, s["output"]):
                return "live", ""
            if e.condition is None:
                return "dead", f"edge {e.id}: branch {e.source!r} chose " \
                               f"{s['output'].get('target')!r}"
            return "dead", f"edge {e.id}: condition {_describe(e.condition)} is false"
        if s["status"] == "skipped" or (s["status"] == "failed"
                                        and not scheduler._retry_pending(s)):
            verb = "was skipped" if s["status"] == "skipped" else "failed"
            return "dead", f"edge {e.id}: upstream node {e.source!r} {verb}"
        return "open", ""

    def incoming(self, v: str, i: int) -> tuple[str, list[Contribution], str]:
        """(``ready``/``wait``/``skip``, what flows in, why skipped) for instance i of v."""
        node, plan = self.plan.nodes[v], self.plan
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
            counts = inside is None or e.source in inside or node.wait_rule == "all"
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
        if node.wait_rule == "all":
            if dead:
                return "skip", live, "; ".join(dead)
            return ("wait" if waiting else "ready"), live, ""
        if any_live:
            return "ready", live, ""
        return ("wait" if waiting else "skip"), live, \
            "no incoming edge can fire: " + "; ".join(dead)

    def actions(self) -> list[scheduler.Action]:
        """Compensate, stop after a failure, start or decide what is ready, or finish."""
        run, plan = self.run, self.plan
        if run.compensation is not None:
            return self.compensation()
        failed = self.failed()
        if failed is not None and plan.definition.error_handling.failure_strategy == "fail_fast":
            return [] if self.busy() else self.after_failure(failed)
        starts: list[scheduler.Action] = [
            scheduler.StartStep(s["step_id"], s["iteration"], s["attempt"] + 1,
                                s["parameters"], not_before=s["retry_at"])
            for s in run.steps.values() if scheduler._retry_pending(s) and "parameters" in s]
        slots = plan.definition.max_concurrency - self.busy()
        for v in plan.order:
            state = self.state(v)
            # A failure decided here, before any call, is decided again on a redrive.
            redo = scheduler._retry_pending(state) and "parameters" not in state
            if state["status"] != "pending" and not redo:
                continue
            action = self.ready(v, self.index[v])
            if isinstance(action, scheduler.StartStep):
                if slots > 0:
                    slots -= 1
                    starts.append(action)
            elif isinstance(action, scheduler.RequestApproval):
                starts.append(action)
            elif action is not None:
                # One structural decision at a time: it may change what else is ready
                # (a loop re-activates its body), and replay checks each against decide.
                return [action]
        if starts or self.busy() or run.pending_approvals:
            return starts
        return self.after_failure(failed) if failed is not None else [self.finish()]

    def ready(self, v: str, i: int) -> scheduler.Action | None:
        """What to do with a pending instance: start, decide, skip it, or wait (None)."""
        status, live, reason = self.incoming(v, i)
        if status != "ready":
            return scheduler.SkipStep(v, i, reason) if status == "skip" else None
        node = self.plan.nodes[v]
        data = live[0][1] if len(live) == 1 else {name: value for name, value, _ in live}
        if node.task_config is not None:
            task = node.task_config
            text = data if isinstance(data, str) else json.dumps(
                data, sort_keys=True, ensure_ascii=False, default=str)
            params: dict[str, Any] = {"task": task.task_template.replace("{input}", text)}
            params.update({k: x for k, x in (("gates", task.gates),
                                             ("worktree_id", task.worktree_id)) if x})
            return scheduler.StartStep(node.id, i, 1, params)
        if node.gate_config is not None:
            return scheduler.StartStep(node.id, i, 1, {"input": data})
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
        return scheduler.CompleteStep(node.id, i, output)

    def subgraph(self, node: Node, i: int, data: Any) -> scheduler.Action:
        config = node.subgraph_config
        assert config is not None
        inputs = data if isinstance(data, dict) else {"input": data}
        if config.input_mapping:
            names, inputs = {"input": data, "inputs": self.run.inputs}, {}
            for name, path in config.input_mapping.items():
                found, inputs[name] = _lookup(names, path)
                if not found:
                    return scheduler.FailStep(node.id, i, 1, "ExpressionError",
                                              f"input_mapping.{name}: nothing at {path!r}")
        return scheduler.StartStep(node.id, i, 1, {
            "use": config.workflow_name, "inputs": inputs,
            "run": child_run_id(self.run.run_id, node.id, i)})

    def branch(self, node: Node, i: int, live: list[Contribution],
               data: Any) -> scheduler.Action:
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
            return scheduler.FailStep(node.id, i, 1, "MaxIterationsReached",
                                      f"branch {node.id!r} reached max_iterations "
                                      f"({config.condition.max_iterations} loops) and "
                                      f"{_describe(config.condition)} still does not hold")
        return scheduler.CompleteStep(node.id, i, output)

    def human(self, node: Node, i: int, data: Any) -> scheduler.Action | None:
        config = node.human_config
        assert config is not None
        key = step_key(node.id, i)
        approval = self.run.approvals.get(key)
        if approval is None:
            text = f"{config.title}: {config.description}" if config.description else config.title
            return scheduler.RequestApproval(key, text)
        if approval["status"] == "requested":
            return None
        return scheduler.CompleteStep(node.id, i, {
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
                   if s["status"] == "running" or scheduler._retry_pending(s))

    def failed(self) -> str | None:
        """The first instance that failed for good."""
        return next((key for key, s in self.run.steps.items()
                     if s["status"] == "failed" and not scheduler._retry_pending(s)), None)

    def latest_outputs(self) -> dict[str, Any]:
        """Each node's latest completed (or compensated) output."""
        out: dict[str, Any] = {}
        for node in self.plan.nodes:
            for _, s in sorted(self.instances.get(node, {}).items()):
                if s["status"] in ("completed", "compensated"):
                    out[node] = s["output"]
        return out

    def after_failure(self, key: str) -> list[scheduler.Action]:
        error = self.run.steps[key].get("error") or {}
        to_undo = scheduler.compensation_order(self.plan, self.run)
        if to_undo:
            reason = f"node {key!r} failed: {error.get('message', '')}"
            return [scheduler.StartCompensation(reason, to_undo)]
        return [scheduler.FinishRun("failed", self.latest_outputs(), dict(error, step=key), key)]

    def compensation(self) -> list[scheduler.Action]:
        comp = self.run.compensation
        assert comp is not None
        if any(key not in comp["done"] for key in comp["steps"]):
            return scheduler._compensation(scheduler._View(self.plan, self.run))
        failed = self.failed()
        error = dict(self.run.steps[failed].get("error") or {}, step=failed) \
            if failed else {"message": comp["reason"]}
        broken = [k for k, v in comp["done"].items() if v == "failed"]
        if comp.get("cancel") and not broken:
            return [scheduler.FinishRun("cancelled", error={"message": comp["reason"]},
                                        actor=comp.get("actor"))]
        status = "failed" if broken else "compensated"
        error = dict(error, compensation_failed=broken) if broken else error
        return [scheduler.FinishRun(status, self.latest_outputs(), error, failed)]

    def finish(self) -> scheduler.FinishRun:
        exits = self.plan.model.exit_points
        stuck = [x for x in exits if self.state(x)["status"] not in ("completed", "skipped")]
        if stuck:  # a safety net: every node is eventually decided, so this is a bug
            return scheduler.FinishRun("failed", self.latest_outputs(), {
                "type": "Stalled", "message": f"exit point {stuck[0]!r} never finished"})
        return scheduler.FinishRun("completed",
                                   {x: self.state(x).get("output") for x in exits})
