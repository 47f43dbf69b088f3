"""The graph form's language (seed 004): its pydantic models, one per seed 004 class, with
unknown keys refused, and the pure graph helpers both validation and scheduling use.
What the fields mean is told in :mod:`saga.composition.graph_form`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from saga.composition.definition import RetryPolicy, ToolCall
from saga.composition.notify import NotifyTarget
from saga.lazy import lazy

if TYPE_CHECKING:
    import networkx as nx
else:
    nx = lazy("networkx")

_TYPES = ("task", "gate", "branch", "merge", "parallel", "subgraph", "human")
_OPS = Literal["==", "!=", ">", "<", ">=", "<=", "in", "not_in", "contains", "starts_with",
               "ends_with"]


class _Model(BaseModel):
    # Built on first use: a step-list run never validates a graph (saves ~50 ms at start)
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


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


class GraphHead(_Model):
    """A graph document without its nodes and edges."""

    id: str
    name: str = Field(min_length=1)
    description: str | None = None
    version: str = "1.0.0"
    entry_point: str
    exit_points: list[str] = Field(default_factory=list)
    config: GraphConfig = Field(default_factory=GraphConfig)
    #: Webhooks told of this run's events, as a step-list composition's ``notify:``.
    notify: list[NotifyTarget] = Field(default_factory=list)

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int | float) else value


class WorkflowGraph(GraphHead):
    """A whole graph-form composition."""

    nodes: list[Node] = Field(min_length=1)
    edges: list[Edge] = Field(default_factory=list)


def body(flow: nx.DiGraph, e: Edge) -> set[str]:
    """The nodes a loop edge re-runs: on a path from its target back to its source."""
    return (set(nx.descendants(flow, e.target)) | {e.target}) & \
        (set(nx.ancestors(flow, e.source)) | {e.source})


def feeders(node_id: str, edges: list[Edge], types: Mapping[str, str]) -> set[str]:
    """The nodes whose work reaches a node: walking back along its incoming non-loop
    edges through merge and parallel nodes (which only join and fan out)."""
    found: set[str] = set()
    seen = {node_id}
    todo = [node_id]
    while todo:
        at = todo.pop()
        for e in edges:
            if e.target != at or e.is_loop_edge or e.source in seen or e.source not in types:
                continue
            seen.add(e.source)
            if types[e.source] in ("merge", "parallel"):
                todo.append(e.source)
            else:
                found.add(e.source)
    return found


def auto_approvers(nodes: list[Node], edges: list[Edge]) -> dict[str, tuple[str, ...]]:
    """The human nodes a gate's ``auto_approve`` approves, each with the gates that vouch
    for it: every node feeding it is a gate with ``auto_approve`` (and there is one)."""
    types = {n.id: n.type for n in nodes}
    auto = {n.id for n in nodes if n.gate_config is not None and n.gate_config.auto_approve}
    vouched = {}
    for n in nodes:
        if n.type == "human":
            feeding = feeders(n.id, edges, types)
            if feeding and feeding <= auto:
                vouched[n.id] = tuple(x.id for x in nodes if x.id in feeding)
    return vouched


def meeting_point(flow: nx.DiGraph, branches: list[str], order: Mapping[str, int]) -> str | None:
    """Where the branches of a parallel node meet first: the earliest node (in document
    order, of those no other meeting node leads to) every branch leads to; None if none."""
    reach = [set(nx.descendants(flow, b)) | {b} for b in branches if b in flow]
    if not reach or len(reach) < len(branches):
        return None
    common = set.intersection(*reach)
    first = [c for c in common if not set(nx.ancestors(flow, c)) & common]
    return min(first, key=lambda c: order.get(c, 0), default=None)
