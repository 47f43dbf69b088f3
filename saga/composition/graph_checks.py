"""The graph form's validation: every problem of a graph-form document at once, each at
the path the user wrote (``nodes[1].task_config.task_template``): seed 004's
``validate_graph`` checks, and the checks that refuse a field this engine would otherwise
accept and ignore."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from saga import expressions
from saga.composition import task_template
from saga.composition.graph_model import (
    Edge,
    Node,
    auto_approvers,
    body,
    feeders,
    meeting_point,
)
from saga.errors import Problem
from saga.lazy import lazy

if TYPE_CHECKING:
    import networkx as nx
else:
    nx = lazy("networkx")


def validate(model: type[BaseModel], raw: Any, prefix: str, problems: list[Problem]) -> Any:
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


def validate_list(data: dict[str, Any], key: str, model: type[BaseModel],
                   problems: list[Problem], required: bool) -> list[tuple[int, Any]]:
    """Each item validated on its own, so graph checks still run on the valid ones."""
    raw = data.get(key)
    if not required and (raw is None or raw == []):  # absent, or written empty (`edges:`)
        return []
    if not isinstance(raw, list) or not raw:
        problems.append(Problem(key, "must be a non-empty list" if required else "must be a list"))
        return []
    items = [(i, validate(model, item, f"{key}[{i}]", problems)) for i, item in enumerate(raw)]
    return [(i, item) for i, item in items if item is not None]


def graph_problems(entry: str | None, given: list[str], ids: list[tuple[int, str]],
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
            bodies[e.id] = body(flow, e)
    for (a, body_a), (b, body_b) in itertools.combinations(bodies.items(), 2):
        if body_a & body_b and not (body_a <= body_b or body_b <= body_a):
            add("edges", f"the loops of edges {a!r} and {b!r} overlap without nesting")
    if reach and entry in where:
        reached = nx.descendants(full, entry) | {entry}
        for n in where:
            if n not in reached:
                add(f"nodes[{where[n]}]", f"node {n!r} cannot be reached from the entry "
                                          f"point {entry!r}")
    auto_problems([(i, n) for i, n in nodes], [e for _, e in edges], add)
    parallel_problems(nodes, flow, where, add)
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
            if gate in task.gates[:k]:
                add(f"{at}.task_config.gates[{k}]", f"gate {gate!r} is listed twice "
                                                    f"(first at gates[{task.gates.index(gate)}])")
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


def auto_problems(nodes: list[tuple[int, Node]], edges: list[Edge], add: Any) -> None:
    """A gate's ``auto_approve`` must approve some human node, or it would be ignored."""
    types = {n.id: n.type for _, n in nodes}
    vouched = auto_approvers([n for _, n in nodes], edges)
    for i, node in nodes:
        if node.gate_config is None or not node.gate_config.auto_approve:
            continue
        if any(node.id in gates for gates in vouched.values()):
            continue
        humans = [h for h, t in types.items() if t == "human"
                  and node.id in feeders(h, edges, types)]
        if not humans:
            why = f"no human node follows gate {node.id!r} (directly or through merge " \
                  "and parallel nodes)"
        else:
            others = sorted(feeders(humans[0], edges, types) - {node.id})
            why = f"human node {humans[0]!r} also waits on {', '.join(map(repr, others))}, " \
                  "not gates with auto_approve, so a person is always asked"
        add(f"nodes[{i}].gate_config.auto_approve", f"auto_approve has no effect: {why}")


def parallel_problems(nodes: list[tuple[int, Node]], flow: nx.DiGraph, where: dict[str, int],
                      add: Any) -> None:
    """A parallel node's ``wait_for: any|first`` acts where its branches meet, which must
    be a merge node that does not insist on waiting for all of them."""
    by_id = {n.id: (i, n) for i, n in nodes}
    for i, node in nodes:
        config = node.parallel_config
        if config is None or config.wait_for == "all":
            continue
        at = f"nodes[{i}].parallel_config.wait_for"
        join = meeting_point(flow, config.branches, where)
        if join is None:
            add(at, f"wait_for {config.wait_for!r} needs the branches to meet at a merge node "
                    "(they never meet)")
            continue
        j, target = by_id.get(join, (where.get(join, 0), None))
        if target is not None and target.type != "merge":
            add(at, f"wait_for {config.wait_for!r} needs the branches to meet at a merge "
                    f"node; they first meet at {join!r}, a {target.type} node")
        elif target is not None and target.merge_config is not None \
                and "wait_for" in target.merge_config.model_fields_set \
                and target.merge_config.wait_for == "all":
            add(f"nodes[{j}].merge_config.wait_for",
                f"'all' contradicts parallel {node.id!r} (wait_for: {config.wait_for!r}), "
                "whose branches meet here: leave it out or say 'any'")
