"""Drawing a plan, or a run coloured by its steps' status, as Mermaid or Graphviz DOT."""

from __future__ import annotations

from typing import Any

from saga.composition.graph_form import GraphPlan, MergeNodeConfig, Node

_COLOURS = {"completed": "#b7e4c7", "running": "#a9d6e5", "failed": "#f4a3a3",
            "skipped": "#dddddd", "compensated": "#e0c3fc", "pending": "#ffffff",
            "waiting": "#ffe8a3"}


def _label(plan: Any, step_id: str) -> str:
    if isinstance(plan, GraphPlan):
        return f"{step_id}: {_node_kind(plan, plan.nodes[step_id])}"
    step = plan.step(step_id)
    kind = step.tool or (f"use {step.use}" if step.use else "compute")
    extra = " (for each)" if step.loop is not None else ""
    return f"{step_id}: {kind}{extra}"


def _node_kind(plan: GraphPlan, node: Node) -> str:
    """A graph-form node by its type and what defines it (``merge all, union``)."""
    if node.task_config is not None:
        gates = node.task_config.gates
        return f"task {node.task_config.role}" + (f" + gates {', '.join(gates)}" if gates else "")
    if node.gate_config is not None:
        return f"gate {node.gate_config.gate_type}" + \
            (" (auto_approve)" if node.gate_config.auto_approve else "")
    if node.branch_config is not None:
        cond = node.branch_config.condition
        return f"branch {cond.field} {cond.operator} {cond.value!r}"
    if node.parallel_config is not None:
        return f"parallel (wait for {node.parallel_config.wait_for})"
    if node.subgraph_config is not None:
        return f"subgraph {node.subgraph_config.workflow_name}"
    if node.human_config is not None:
        return f"human {node.human_config.title!r}"
    merge = node.merge_config or MergeNodeConfig()
    return f"merge {plan.wait_rule(node.id)}, {merge.merge_strategy}"


def _statuses(plan: Any, run: Any | None) -> dict[str, str]:
    if run is None:
        return {}
    statuses = {}
    for step_id in plan.order:
        state = run.step(step_id)
        status = state["status"]
        if step_id in getattr(run, "pending_approvals", []):
            status = "waiting"
        statuses[step_id] = status
    return statuses


def mermaid(plan: Any, run: Any | None = None) -> str:
    """A Mermaid flowchart of the plan (steps coloured by status when a run is given)."""
    statuses = _statuses(plan, run)
    ids = {step_id: f"n{i}" for i, step_id in enumerate(plan.order)}
    lines = ["flowchart TD"]
    for step_id in plan.order:
        label = _label(plan, step_id).replace('"', "'")
        if step_id in statuses:
            label += f"<br/>{statuses[step_id]}"
        lines.append(f'    {ids[step_id]}["{label}"]')
    for source, target in plan.graph.edges:
        if source in ids and target in ids:
            lines.append(f"    {ids[source]} --> {ids[target]}")
    for status, colour in _COLOURS.items():
        members = [ids[s] for s, st in statuses.items() if st == status]
        if members:
            lines.append(f"    classDef {status} fill:{colour}")
            lines.append(f"    class {','.join(members)} {status}")
    return "\n".join(lines) + "\n"


def dot(plan: Any, run: Any | None = None) -> str:
    """A Graphviz DOT digraph of the plan (filled by status when a run is given)."""
    statuses = _statuses(plan, run)
    lines = ["digraph saga {", "    rankdir=TB;", '    node [shape=box, style="rounded,filled", '
             'fillcolor="#ffffff"];']
    for step_id in plan.order:
        label = _label(plan, step_id)
        attrs = [f'label="{label}' + (f"\\n{statuses[step_id]}" if step_id in statuses else "")
                 + '"']
        if step_id in statuses:
            attrs.append(f'fillcolor="{_COLOURS.get(statuses[step_id], "#ffffff")}"')
        lines.append(f'    "{step_id}" [{", ".join(attrs)}];')
    for source, target in plan.graph.edges:
        lines.append(f'    "{source}" -> "{target}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def layout(plan: Any, run: Any | None = None) -> dict[str, Any]:
    """The plan as data for a drawing: each node with its level (steps of one level can
    run together), kind, label and status (when a run is given), and the edges."""
    statuses = _statuses(plan, run)
    nodes = []
    for level, members in enumerate(plan.levels()):
        for row, step_id in enumerate(members):
            step = plan.step(step_id)
            kind = "tool" if step.tool else "use" if step.use else "compute"
            if isinstance(plan, GraphPlan):
                kind = plan.nodes[step_id].type
            nodes.append({"id": step_id, "level": level, "row": row, "kind": kind,
                          "label": _label(plan, step_id), "status": statuses.get(step_id),
                          "colour": _COLOURS.get(statuses.get(step_id, ""), "#ffffff")})
    edges = [[s, t] for s, t in plan.graph.edges if s in plan.order and t in plan.order]
    return {"nodes": nodes, "edges": edges}
