"""Drawing a plan, or a run coloured by its steps' status, as Mermaid or Graphviz DOT, or
as data the viewer draws.

Every drawing shows the same things: each step (with its status when a run is given),
the edges (a conditional one labelled with its condition, a loop edge dotted), and the
compensation path: each step that is undone on rollback has an ``undo`` box, and the undo
boxes are chained in the order a rollback runs them (the reverse of the flow).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from saga.composition.graph_form import GraphPlan, MergeNodeConfig, Node

_COLOURS = {"completed": "#b7e4c7", "running": "#a9d6e5", "failed": "#f4a3a3",
            "skipped": "#dddddd", "compensated": "#e0c3fc", "compensating": "#e0c3fc",
            "pending": "#ffffff", "waiting": "#ffe8a3", "paused": "#ffe8a3",
            "cancelled": "#b8c4d6", "not undone": "#ff8c42"}
#: The status a step shows when its effect is still in place after a rollback.
NOT_UNDONE = "not undone"


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


def statuses(plan: Any, run: Any | None, not_undone: Iterable[str] = ()) -> dict[str, str]:
    """Each step's status word as every view shows it: ``waiting`` for one that waits for
    a person, a signal or a timer; ``not undone`` for one whose effect a rollback left in
    place (in ``not_undone``, from :func:`saga.scheduler.policy.not_undone`, once a
    rollback began or its own undo failed); ``pending`` for one not yet started."""
    if run is None:
        return {}
    left = set(not_undone)
    rolled_back = run.compensation is not None
    waiting = set(getattr(run, "pending_approvals", [])) | set(getattr(run, "waits", {}))
    found = {}
    for step_id in plan.order:
        state = run.step(step_id)
        status = state["status"] or "pending"
        if step_id in left and (rolled_back or state.get("compensation_error")):
            status = NOT_UNDONE
        elif step_id in waiting and not run.is_finished:
            status = "waiting"
        found[step_id] = status
    return found


def _undo(plan: Any, step_id: str) -> str | None:
    """How a step is undone on rollback, in a few words (None: it is not)."""
    step = plan.step(step_id)
    call = step.compensation
    if call is None:
        return None
    if step.use is not None and call.tool is None:
        return "the child run's undo"
    return call.tool or f"{step.tool} (own undo)"


def _condition(plan: Any, source: str, target: str) -> str | None:
    """The condition under which the edge is taken (graph form) or its target runs."""
    if isinstance(plan, GraphPlan):
        for edge in plan.model.edges:
            if edge.source == source and edge.target == target and edge.condition:
                c = edge.condition
                return f"{c.field} {c.operator} {c.value!r}"
        return None
    condition = plan.step(target).condition
    return f"when {condition}" if condition else None


def links(plan: Any) -> list[dict[str, Any]]:
    """Every edge to draw: ``flow`` (with its condition as ``label``), ``loop`` (a graph's
    loop edge), and ``undo``: from a step's undo to the undo that follows it on rollback
    (the nearest undoable steps before it)."""
    ids = set(plan.order)
    out = [{"from": s, "to": t, "kind": "flow", "label": _condition(plan, s, t)}
           for s, t in plan.graph.edges if s in ids and t in ids]
    if isinstance(plan, GraphPlan):
        out += [{"from": e.source, "to": e.target, "kind": "loop",
                 "label": "loop" + (f" if {e.condition.field} {e.condition.operator} "
                                    f"{e.condition.value!r}" if e.condition else "")}
                for e in plan.model.edges if e.is_loop_edge and {e.source, e.target} <= ids]
    undoable = {s for s in plan.order if _undo(plan, s)}
    for step_id in plan.order:
        if step_id not in undoable:
            continue
        seen, todo, before = set(), list(plan.graph.predecessors(step_id)), []
        while todo:  # the nearest undoable steps upstream: undone right after this one
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            if s in undoable:
                before.append(s)
            else:
                todo.extend(plan.graph.predecessors(s))
        out += [{"from": step_id, "to": s, "kind": "undo", "label": None}
                for s in sorted(before, key=plan.order.index)]
    return out


def _when(plan: Any, step_id: str) -> str | None:
    """A step's own condition (step-list form): ``when <expression>``."""
    if isinstance(plan, GraphPlan):
        return None
    condition = plan.step(step_id).condition
    return f"when {condition}" if condition else None


def _free_conditions(plan: Any) -> dict[str, str]:
    """Conditions of steps with no edge into them: shown in the step's box."""
    if isinstance(plan, GraphPlan):
        return {}
    return {s: f"when {plan.step(s).condition}" for s in plan.order
            if plan.step(s).condition and not list(plan.graph.predecessors(s))}


def mermaid(plan: Any, run: Any | None = None, not_undone: Iterable[str] = ()) -> str:
    """A Mermaid flowchart of the plan (steps coloured by status when a run is given):
    conditions on their edges, undo boxes dashed and chained in rollback order."""
    status = statuses(plan, run, not_undone)
    ids = {step_id: f"n{i}" for i, step_id in enumerate(plan.order)}
    free = _free_conditions(plan)
    lines = ["flowchart TD"]
    for step_id in plan.order:
        label = _label(plan, step_id).replace('"', "'")
        if step_id in free:
            label += "<br/>" + free[step_id].replace('"', "'")
        if step_id in status:
            label += f"<br/>{status[step_id]}"
        lines.append(f'    {ids[step_id]}["{label}"]')
    undo_ids = {}
    for step_id in plan.order:
        undo = _undo(plan, step_id)
        if undo:
            undo_ids[step_id] = "u" + ids[step_id][1:]
            lines.append(f'    {undo_ids[step_id]}(["undo {step_id}: '
                         f'{undo.replace(chr(34), chr(39))}"])')
            lines.append(f"    {ids[step_id]} -.- {undo_ids[step_id]}")
    for link in links(plan):
        a, b = link["from"], link["to"]
        if link["kind"] == "undo":
            lines.append(f"    {undo_ids[a]} -.->|then| {undo_ids[b]}")
        elif link["kind"] == "loop":
            text = link["label"].replace('"', "'").replace("|", "/")
            lines.append(f'    {ids[a]} -.->|"{text}"| {ids[b]}')
        elif link["label"]:
            text = link["label"].replace('"', "'").replace("|", "/")
            lines.append(f'    {ids[a]} -->|"{text}"| {ids[b]}')
        else:
            lines.append(f"    {ids[a]} --> {ids[b]}")
    for name, colour in _COLOURS.items():
        members = [ids[s] for s, st in status.items() if st == name]
        if members:
            css = name.replace(" ", "_")
            lines.append(f"    classDef {css} fill:{colour}")
            lines.append(f"    class {','.join(members)} {css}")
    if undo_ids:
        lines.append("    classDef undo stroke-dasharray: 4 3,fill:#f7f0ff")
        lines.append(f"    class {','.join(undo_ids.values())} undo")
    return "\n".join(lines) + "\n"


def _dot_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def dot(plan: Any, run: Any | None = None, not_undone: Iterable[str] = ()) -> str:
    """A Graphviz DOT digraph of the plan (filled by status when a run is given):
    conditions on their edges, undo boxes dashed and chained in rollback order."""
    status = statuses(plan, run, not_undone)
    free = _free_conditions(plan)
    lines = ["digraph saga {", "    rankdir=TB;", '    node [shape=box, style="rounded,filled", '
             'fillcolor="#ffffff"];']
    for step_id in plan.order:
        label = _label(plan, step_id)
        if step_id in free:
            label += "\\n" + _dot_text(free[step_id])
        attrs = [f'label="{label}' + (f"\\n{status[step_id]}" if step_id in status else "")
                 + '"']
        if step_id in status:
            attrs.append(f'fillcolor="{_COLOURS.get(status[step_id], "#ffffff")}"')
        lines.append(f'    "{step_id}" [{", ".join(attrs)}];')
    for step_id in plan.order:
        undo = _undo(plan, step_id)
        if undo:
            lines.append(f'    "{step_id}~undo" [label="undo {step_id}: {_dot_text(undo)}", '
                         'style="rounded,dashed", color="#7b2cbf"];')
            lines.append(f'    "{step_id}" -> "{step_id}~undo" [style=dashed, arrowhead=none, '
                         'color="#7b2cbf"];')
    for link in links(plan):
        a, b = link["from"], link["to"]
        if link["kind"] == "undo":
            lines.append(f'    "{a}~undo" -> "{b}~undo" [style=dashed, color="#7b2cbf", '
                         'label="then"];')
        elif link["kind"] == "loop":
            lines.append(f'    "{a}" -> "{b}" [style=dotted, label="{_dot_text(link["label"])}"];')
        elif link["label"]:
            lines.append(f'    "{a}" -> "{b}" [label="{_dot_text(link["label"])}"];')
        else:
            lines.append(f'    "{a}" -> "{b}";')
    lines.append("}")
    return "\n".join(lines) + "\n"


def layout(plan: Any, run: Any | None = None, not_undone: Iterable[str] = ()) -> dict[str, Any]:
    """The plan as data for a drawing: each node with its level (steps of one level can
    run together), kind, label, condition (one no edge shows), ``when`` (its own condition),
    undo and status (when a run is given); the
    ``edges`` as pairs, and every ``link`` to draw (flow, loop and undo, see :func:`links`)."""
    status = statuses(plan, run, not_undone)
    free = _free_conditions(plan)
    nodes = []
    for level, members in enumerate(plan.levels()):
        for row, step_id in enumerate(members):
            step = plan.step(step_id)
            kind = "tool" if step.tool else "use" if step.use else "compute"
            if isinstance(plan, GraphPlan):
                kind = plan.nodes[step_id].type
            nodes.append({"id": step_id, "level": level, "row": row, "kind": kind,
                          "label": _label(plan, step_id), "status": status.get(step_id),
                          "condition": free.get(step_id), "when": _when(plan, step_id),
                          "undo": _undo(plan, step_id),
                          "colour": _COLOURS.get(status.get(step_id, ""), "#ffffff")})
    edges = [[s, t] for s, t in plan.graph.edges if s in plan.order and t in plan.order]
    return {"nodes": nodes, "edges": edges, "links": links(plan)}
