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
* **task_template** is filled as seed 004 fills it, ``task_template.format(input=...,
  **input_data)`` (:mod:`saga.composition.task_template`): ``{input}`` as above, any
  other ``{field}`` from the node's input data (the run inputs for the entry node, the
  fields of each object that arrived, later edges winning, anything else under its
  source's id). A field that is not there fails the task before its call
  (``TemplateError``); positional fields, attribute access and bad braces are refused
  at validation, and so is a field no ``data_mapping`` into the node provides.
* **Task gates** (``task_config.gates``) run after the task, one at a time in the order
  listed, each as a step of its own, ``<node>.<gate>`` (the gate's tool, given
  ``{"input": <the task's output>}`` and the task's ``worktree_id``), so each result is
  in the log. The task counts as done when every gate passed; a gate that does not answer
  ``passed: true`` fails it: fail_fast stops the run and compensates (the task's own
  compensation included: its effect already happened), and its outgoing edges are dead.
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
* **auto_approve** (seed: "skip human approval if gate passes"): a human node whose
  feeders (the nodes before it, looking through merge and parallel nodes) are all gates
  with ``auto_approve`` is approved without asking when each of them passed, recorded as
  ``{"approved": true, "actor": "auto", ...}``; otherwise a person is asked. An
  ``auto_approve`` that can never apply (no human after it, or a human that also waits
  on other work) is refused at validation.
* **Parallel wait_for** acts where the branches meet, which must be a merge node: under
  ``any`` and ``first`` it goes on with the first branch to arrive (its own
  ``wait_for`` becomes ``any``; an explicit ``all`` there is refused). Under ``any`` the
  other branches run on; under ``first`` their nodes not yet started are skipped
  (``cancelled: ...``). A call already in flight finishes and is recorded (a call is
  never abandoned half-way), and what the losing branches completed is not compensated:
  compensation undoes a whole run, not part of one. ``all`` (the default) is as before.
* ``gate_config.requires_worktree: false`` is passed to the gate's tool.
* **Outcome.** The run completes when nothing is left to do and every exit point
  finished or was skipped, with each exit point's output by id (null when skipped).
  Failed and compensated runs report each node's latest output.
* **Extensions**: ``task_config.compensate`` and ``task_config.retry`` (as in the
  step-list form: a task that says nothing about ``compensate`` is undone by its role's
  own compensation, when the tool has one). ``worktree_id`` is passed to the role's tool
  and its gates; ``ui_metadata``, ``label`` and ``description`` are for people and editors.

The language is :mod:`.graph_model`, its checks :mod:`.graph_checks`; this module
compiles; the readiness rules that carry these choices out are :mod:`saga.scheduler.graph`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from saga.composition.definition import Definition, ErrorHandling, Step, ToolCall
from saga.composition.graph_checks import graph_problems, validate, validate_list
from saga.composition.graph_model import (
    BranchNodeConfig,
    Edge,
    GateNodeConfig,
    GraphConfig,
    GraphHead,
    HumanNodeConfig,
    LoopCondition,
    MergeNodeConfig,
    Node,
    ParallelNodeConfig,
    SubgraphNodeConfig,
    TaskNodeConfig,
    TransitionCondition,
    WorkflowGraph,
    auto_approvers,
    body,
    meeting_point,
)
from saga.composition.plan import Plan, own_undo
from saga.errors import DefinitionError, Problem
from saga.lazy import lazy

if TYPE_CHECKING:
    import networkx as nx
else:
    nx = lazy("networkx")

__all__ = ["BranchNodeConfig", "Edge", "GateNodeConfig", "GraphConfig", "GraphPlan",
           "HumanNodeConfig", "LoopCondition", "MergeNodeConfig", "Node", "ParallelNodeConfig",
           "SubgraphNodeConfig", "TaskNodeConfig", "TransitionCondition", "WorkflowGraph",
           "compile_graph"]


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
    head = validate(GraphHead, {k: v for k, v in data.items() if k not in ("nodes", "edges")},
                     "", problems)
    nodes = validate_list(data, "nodes", Node, problems, required=True)
    edges = validate_list(data, "edges", Edge, problems, required=False)
    # Graph checks run even when other parts are malformed, on what can be read.
    entry = data.get("entry_point") if head is None else head.entry_point
    given = data.get("exit_points") if head is None else head.exit_points
    given = [x for x in given if isinstance(x, str)] if isinstance(given, list) else []
    raw: list[Any] = data["nodes"] if isinstance(data.get("nodes"), list) else []
    ids = [(i, n["id"]) for i, n in enumerate(raw)
           if isinstance(n, dict) and isinstance(n.get("id"), str)]
    raw_edges = data.get("edges") or []
    # Reachability is judged only with every edge read (edges: 12 is not a list of any).
    reach = isinstance(raw_edges, list) and len(edges) == len(raw_edges)
    exits = graph_problems(entry if isinstance(entry, str) else None, given, ids, nodes,
                            edges, tools, problems, reach)
    if problems:
        raise DefinitionError(problems, source)
    given_edges = {"edges": data["edges"] or []} if "edges" in data else {}  # `edges:` is none
    model = _own_compensations(WorkflowGraph.model_validate({**data, **given_edges}).model_copy(
        update={"exit_points": exits}), tools)
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


def _own_compensations(model: WorkflowGraph, tools: Any) -> WorkflowGraph:
    """A task node that says nothing about compensation is undone by its role's own
    compensation when the tool has one, as a step-list step is (:func:`own_undo`). Written
    into the graph itself, as ``compensate: {}``, because the graph is what a run records
    (``RunStarted``) and a new process recompiles it without the tools."""
    nodes = []
    for node in model.nodes:
        task = node.task_config
        if task is not None and own_undo(_step(model, node), tools):
            task = task.model_copy(update={"compensate": ToolCall()})
            node = node.model_copy(update={"task_config": task})
        nodes.append(node)
    return model.model_copy(update={"nodes": nodes})


def _step(model: WorkflowGraph, node: Node) -> Step:
    """The synthesised step of a node: what the executor calls, times out, retries and
    compensates. Branch, merge, parallel and human nodes never reach the executor."""
    base: dict[str, Any] = {"id": node.id, "description": node.label or node.description}
    if node.task_config is not None:
        task = node.task_config
        # Only a compensation the node states (``false`` included) is passed on: an
        # unset one is the role's own undo, when it has one (_own_compensations).
        stated = {"compensate": task.compensate} if "compensate" in task.model_fields_set \
            else {}
        return Step.model_validate({**base, "tool": task.role,
                                    "parameters": {"task": task.task_template},
                                    "timeout": task.timeout, "retry": task.retry, **stated})
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
    # A human node is a step that asks for a person's confirmation before it runs.
    title = node.human_config.title if node.human_config is not None else None
    return Step(**base, tool="noop", confirm=title)


def gate_step_id(node_id: str, gate: str) -> str:
    """The step that runs gate ``gate`` of task ``node_id``."""
    return f"{node_id}.{gate}"


@dataclass(frozen=True)
class GraphPlan(Plan):
    """A compiled graph: the Plan interface (``graph`` holds the non-loop edges, so levels
    and the critical path ignore loops), with the graph's nodes, edges and loops at hand
    for its scheduler (:mod:`saga.scheduler.graph`)."""

    form: ClassVar[str] = "graph"

    model: WorkflowGraph

    def step(self, step_id: str) -> Step:
        """The step of a node, or of one of a task's gates (``fix.lint_gate``)."""
        gate = self.gate_steps.get(step_id)
        return gate if gate is not None else super().step(step_id)

    @functools.cached_property
    def gate_steps(self) -> dict[str, Step]:
        """The steps that run a task's ``gates`` after it, by id: ``<node>.<gate>`` (a
        node id has no dot), each failing unless its gate answers ``passed: true``."""
        steps = {}
        for node in self.model.nodes:
            for gate in node.task_config.gates if node.task_config is not None else []:
                step = Step(id="gate", tool=gate, expect="output.passed == True",
                            description=f"gate {gate} of task {node.id}")
                steps[gate_step_id(node.id, gate)] = step.model_copy(
                    update={"id": gate_step_id(node.id, gate)})
        return steps

    def tools_named(self) -> set[str]:
        """Every tool a run may call, its tasks' gates included."""
        gates = {step.tool for step in self.gate_steps.values() if step.tool is not None}
        return super().tools_named() | gates

    def _dump(self) -> dict[str, Any]:
        # Recorded in ``RunStarted``: the normalised graph, exit points filled in.
        record = self.model.model_dump(mode="json", exclude_defaults=True)
        # ``compensate: false`` equals the default yet means "not the role's own undo":
        # kept, so the record compiled again with the tools says the same.
        for node, raw in zip(self.model.nodes, record["nodes"], strict=True):
            task = node.task_config
            if task is not None and task.compensate is None \
                    and "compensate" in task.model_fields_set:
                raw["task_config"]["compensate"] = False
        return record

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
    def auto_approved(self) -> dict[str, tuple[str, ...]]:
        """Human nodes that ``auto_approve`` gates vouch for, with those gates."""
        return auto_approvers(self.model.nodes, self.model.edges)

    @functools.cached_property
    def joins(self) -> dict[str, tuple[str, frozenset[str]]]:
        """Each parallel node with ``wait_for: any|first``: where its branches meet (a
        merge node, which then goes on with the first branch to arrive) and the nodes
        between (its branches, which ``first`` cancels once the merge went on)."""
        order = {node.id: i for i, node in enumerate(self.model.nodes)}
        joins = {}
        for node in self.model.nodes:
            config = node.parallel_config
            if config is None or config.wait_for == "all":
                continue
            join = meeting_point(self.graph, config.branches, order)
            assert join is not None  # checked by validation
            between = set(nx.descendants(self.graph, node.id)) & set(
                nx.ancestors(self.graph, join))
            joins[node.id] = (join, frozenset(between))
        return joins

    def wait_rule(self, node_id: str) -> str:
        """``all`` or ``any``: which incoming edges a node waits for (a merge where the
        branches of a ``wait_for: any|first`` parallel node meet waits for any)."""
        if any(join == node_id for join, _ in self.joins.values()):
            return "any"
        return self.nodes[node_id].wait_rule

    @functools.cached_property
    def loops(self) -> dict[str, tuple[Edge, frozenset[str]]]:
        """Each loop edge with its body, by edge id."""
        return {e.id: (e, frozenset(body(self.graph, e)))
                for e in self.model.edges if e.is_loop_edge}
