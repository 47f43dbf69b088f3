"""The graph form of compositions (seed 004): nodes and edges, compiled into a plan the
executor drives like a step list, but which decides with its own readiness rules.

:func:`compile_graph` validates the document (pydantic models mirroring seed 004, unknown
keys are errors, plus every check of seed 004's ``validate_graph``) and returns a
:class:`GraphPlan`, a :class:`saga.plan.Plan` whose ``definition`` holds one synthesised
step per node; :mod:`saga.scheduler.graph` decides over it from the run's history alone.

Choices where seed 004 is silent (each is tested in tests/composition/test_graph_form.py):

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

This module is the language and its checks; the readiness rules that carry these choices
out are :mod:`saga.scheduler.graph`.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any, Literal

import networkx as nx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from saga import expressions
from saga.chain import definition_hash
from saga.composition import task_template
from saga.composition.definition import Definition, ErrorHandling, RetryPolicy, Step, ToolCall
from saga.composition.plan import Plan
from saga.errors import DefinitionError, Problem

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
    raw: list[Any] = data["nodes"] if isinstance(data.get("nodes"), list) else []
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
        error_handling=ErrorHandling(failure_strategy=strategy),  # type: ignore[arg-type]
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
    loop_targets = {e.target for _, e in edges if e.is_loop_edge}
    for i, node in nodes:
        _node_problems(node, f"nodes[{i}]", pairs, full, tools, add, [e for _, e in edges],
                       entry, loop_targets)
    return exits


def _node_problems(node: Node, at: str, pairs: dict[Any, int], full: nx.DiGraph, tools: Any,
                   add: Any, edges: list[Edge], entry: str | None,
                   loop_targets: set[str]) -> None:
    def tool(path: str, name: str, what: str) -> None:
        if tools is not None and name not in tools:
            add(f"{at}.{path}", f"unknown {what} {name!r} (no tool of that name)")

    if node.type == "merge" and full.in_degree(node.id) < 2:
        add(at, f"merge node {node.id!r} should have at least 2 incoming edges "
                f"(has {full.in_degree(node.id)})")
    if node.task_config is not None:
        task = node.task_config
        tool("task_config.role", task.role, "role")
        for msg in task_template.problems(task.task_template):
            add(f"{at}.task_config.task_template", msg)
        # Fields no input can hold: every edge in maps its data to named fields.
        into = [e for e in edges if e.target == node.id]
        if into and all(e.data_mapping for e in into) and node.id not in loop_targets \
                and node.id != entry and not task_template.problems(task.task_template):
            names = {k for e in into for k in e.data_mapping or {}}
            for name in task_template.fields(task.task_template):
                if name != "input" and name not in names:
                    add(f"{at}.task_config.task_template",
                        f"{{{name}}}: no edge into {node.id!r} maps a field {name!r} "
                        f"(they map: {', '.join(sorted(names))})")
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
    return (set(nx.descendants(flow, e.target)) | {e.target}) & \
        (set(nx.ancestors(flow, e.source)) | {e.source})


def _step(model: WorkflowGraph, node: Node) -> Step:
    """The synthesised step of a node: what the executor calls, times out, retries and
    compensates. Branch, merge, parallel and human nodes never reach the executor."""
    base: dict[str, Any] = {"id": node.id, "description": node.label or node.description}
    if node.task_config is not None:
        task = node.task_config
        return Step.model_validate({**base, "tool": task.role,
                                    "parameters": {"task": task.task_template},
                                    "timeout": task.timeout, "retry": task.retry,
                                    "compensate": task.compensate})
    if node.gate_config is not None:
        types = {n.id: n.type for n in model.nodes}
        onward = [types[e.target] for e in model.edges if e.source == node.id]
        # A gate read by branches only reports: the branch decides what failure means.
        reports = bool(onward) and all(t == "branch" for t in onward)
        return Step(**base, tool=node.gate_config.gate_type,
                    expect=None if reports else "output.passed == True")
    if node.subgraph_config is not None:
        return Step.model_validate({**base, "use": node.subgraph_config.workflow_name,
                                    "parameters": dict(node.subgraph_config.input_mapping)})
    # `confirm` on a human step makes nesting refuse a graph that waits for people.
    title = node.human_config.title if node.human_config is not None else None
    return Step(**base, tool="noop", confirm=title)


@dataclass(frozen=True)
class GraphPlan(Plan):
    """A compiled graph: the Plan interface (``graph`` holds the non-loop edges, so levels
    and the critical path ignore loops), with the graph's nodes, edges and loops at hand
    for its scheduler (:mod:`saga.scheduler.graph`)."""

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
