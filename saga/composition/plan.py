"""The compiled plan: a checked graph of steps, its levels and critical path.

Compilation is pure. It takes raw definition data (as loaded from YAML/JSON) and either
returns a :class:`Plan` or raises :class:`DefinitionError` with every problem found:
model problems from pydantic and graph problems (duplicate ids, unknown dependencies,
cycles, references to steps that are not upstream, unknown tools) together.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import textwrap
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ValidationError

from saga import expressions, secrets
from saga.chain import definition_hash
from saga.composition.dag import StepGraph
from saga.composition.definition import Definition, Step, ToolCall, build, unknown_tool
from saga.errors import DefinitionError, ExpressionError, Problem
from saga.lazy import lazy

if TYPE_CHECKING:
    import networkx as nx
else:
    nx = lazy("networkx")

#: Names every expression may use besides step outputs.
BASE_NAMES = frozenset({"inputs", "input", "context", "steps", "secret"})
#: Extra names visible in a compensation's parameters.
COMPENSATION_NAMES = frozenset({"output", "parameters", "error"})
_STEPS_REF = re.compile(r"steps\s*(?:\.\s*([A-Za-z_][\w\-]*)|\[\s*['\"]([^'\"]+)['\"]\s*\])")
_SAFE_BUILTINS = frozenset({
    "len", "str", "int", "float", "bool", "list", "dict", "tuple", "set", "min", "max",
    "sum", "any", "all", "sorted", "reversed", "enumerate", "zip", "range", "abs", "round",
    "True", "False", "None", "true", "false", "none", "loop", "result",
})


@dataclass(frozen=True)
class Plan:
    """A definition compiled into a dependency graph, ready for the scheduler. ``graph``
    is a :class:`~saga.composition.dag.StepGraph` for the step-list form (no networkx on
    the way to a run), a ``networkx.DiGraph`` for the graph form; both read alike."""

    #: Which composition form this plan was compiled from: ``"steps"`` or ``"graph"``
    #: (:class:`~saga.composition.graph_form.GraphPlan`). Readers branch on it rather than
    #: on the class, so a step-list run never imports the graph form's modules.
    form: ClassVar[str] = "steps"

    definition: Definition
    graph: StepGraph | nx.DiGraph
    order: tuple[str, ...]

    @functools.cached_property
    def steps(self) -> dict[str, Step]:
        """Steps by id, in execution (topological, then definition) order."""
        return {step_id: self.graph.nodes[step_id]["step"] for step_id in self.order}

    def step(self, step_id: str) -> Step:
        """The step with this id."""
        step: Step = self.graph.nodes[step_id]["step"]
        return step

    def record(self) -> dict[str, Any]:
        """The normalised definition as recorded in ``RunStarted`` (a new copy each time:
        every run owns its own)."""
        record: dict[str, Any] = json.loads(self._recorded[0])
        return record

    def digest(self) -> str:
        """sha256 of :meth:`record`'s canonical JSON."""
        return self._recorded[1]

    @functools.cached_property
    def _recorded(self) -> tuple[str, str]:
        # The definition is immutable: dumped and hashed once, not on every run's start.
        record = self._dump()
        return json.dumps(record), definition_hash(record)

    def _dump(self) -> dict[str, Any]:
        return self.definition.to_json()

    @functools.cached_property
    def position(self) -> dict[str, int]:
        """Each step's place in the definition (plan order)."""
        return {step_id: i for i, step_id in enumerate(self.steps)}

    def dependencies(self, step_id: str) -> list[str]:
        """The steps this one waits for, in definition order."""
        return self._dependencies[step_id]

    @functools.cached_property
    def _dependencies(self) -> dict[str, list[str]]:
        return {s: sorted(self.graph.predecessors(s), key=self.position.__getitem__)
                for s in self.order}

    def dependents(self, step_id: str) -> list[str]:
        """The steps that wait for this one, in plan order."""
        return self._dependents[step_id]

    @functools.cached_property
    def _dependents(self) -> dict[str, list[str]]:
        return {s: sorted(self.graph.successors(s), key=self.position.__getitem__)
                for s in self.order}

    @functools.cached_property
    def roots(self) -> tuple[str, ...]:
        """The steps that wait for none, in plan order."""
        return tuple(s for s in self.order if not self._dependencies[s])

    def upstream(self, step_id: str) -> set[str]:
        """Every step this one transitively depends on."""
        if isinstance(self.graph, StepGraph):
            return self.graph.ancestors(step_id)
        return set(nx.ancestors(self.graph, step_id))

    def tools_named(self) -> set[str]:
        """Every tool a run of this plan may call: its steps', their compensations' and
        their auto-heal remedies' (a nested composition names its own)."""
        names: set[str] = set()
        for step in self.steps.values():
            calls = [step.compensation, *(call for h in step.heal for call in h.do)]
            names.update(c.tool for c in calls if c is not None and c.tool is not None)
            if step.tool is not None:
                names.add(step.tool)
        return names

    def rollback_plan(self) -> dict[str, str | None]:
        """How each step is undone on rollback, by step id (None: it is not)."""
        plan: dict[str, str | None] = {}
        for step in self.definition.steps:
            call = step.compensation
            if call is None:
                plan[step.id] = None
            elif step.use is not None and call.tool is None:
                plan[step.id] = "the child run's own compensations"
            elif call.tool is None and isinstance(step.parameters, str):
                # What the undo is called with is known once rendered, not here.
                plan[step.id] = (f"tool {step.tool}'s own compensation, with the parameters "
                                 "the step renders")
            elif call.tool is None:
                plan[step.id] = f"tool {step.tool}'s own compensation"
            else:
                plan[step.id] = f"tool {call.tool}"
        return plan

    def levels(self) -> list[list[str]]:
        """Groups of steps that can run at the same time, in order."""
        generations = self.graph.generations() if isinstance(self.graph, StepGraph) \
            else nx.topological_generations(self.graph)
        return [sorted(gen, key=self.order.index) for gen in generations]

    def critical_path(self) -> list[str]:
        """The longest chain of dependent steps, weighted by each step's expected duration."""
        start = ""  # a source before every step (never a step id), so roots count too
        weighted = nx.DiGraph()
        for node in self.graph:
            weighted.add_edge(start, node, weight=_expected_ms(self.step(node)))
        for u, v in self.graph.edges:
            weighted.add_edge(u, v, weight=_expected_ms(self.step(v)))
        return list(nx.dag_longest_path(weighted, weight="weight"))[1:]


def _expected_ms(step: Step) -> float:
    return float(step.timeout_seconds * 1000) if step.timeout_seconds else 1.0


def compile_plan(data: dict[str, Any] | Definition, *,
                 tools: Collection[str] | Mapping[str, Any] | None = None,
                 source: str | None = None) -> Plan:
    """Compile raw definition data into a Plan, or raise DefinitionError with every problem.

    Args:
        data: the composition as loaded from YAML/JSON, or an already built Definition.
        tools: the available tools, by name; when given, unknown tools are problems. When
            a mapping, its values may offer ``compensate`` (the tool's own compensation)
            and ``check_parameters(params) -> list[str]`` (the tool's parameter schema),
            and both are checked here, before anything runs.
        source: a file name to mention in the error.
    """
    problems: list[Problem]
    definition: Definition | None
    if isinstance(data, Definition):
        definition, problems = data, []
    else:
        definition, problems = build(data, source)
    raw_steps = _raw_steps(data)
    graph, graph_problems = _graph(raw_steps)
    problems += [p for p in graph_problems if p not in problems]
    if definition is not None:
        problems += _semantic_problems(definition, graph, tools)
    else:
        valid = _valid_steps(raw_steps)
        problems += _step_problems(valid, graph, tools, _input_names(data))
        problems += _malformed_step_tools(raw_steps, {i for i, _ in valid}, tools)
    if problems or definition is None:
        raise DefinitionError(problems, source)
    order = tuple(graph.topological_order(key=_index_key(raw_steps)))
    definition = _own_compensations(definition, tools)
    for step in definition.steps:
        graph.nodes[step.id]["step"] = step
    return Plan(definition, graph, order)


def _own_compensations(definition: Definition, tools: Any) -> Definition:
    """A tool step that says nothing about compensation is undone by its tool's own
    compensation, when the tool has one (seed 001: "rollback actions are tool-specific");
    ``compensate: false`` opts out. Written into the definition, so the recorded run says
    how each step is undone and replay never needs the tools to know it."""
    steps = [step.model_copy(update={"compensate": ToolCall()})
             if own_undo(step, tools) else step for step in definition.steps]
    if all(a is b for a, b in zip(steps, definition.steps, strict=True)):
        return definition
    return definition.model_copy(update={"steps": steps})


def own_undo(step: Step, tools: Any) -> bool:
    """Whether ``step`` says nothing about compensation and its tool (from ``tools``, a
    mapping of tools by name; anything else knows none) has an undo of its own for it.
    The step-list form and the graph form's task nodes (seed 004) both ask this."""
    tool = tools.get(step.tool) if isinstance(tools, Mapping) and step.tool else None
    can_undo = getattr(tool, "can_undo", None)
    if "compensate" in step.model_fields_set or not callable(can_undo):
        return False
    if isinstance(step.parameters, dict):
        return bool(can_undo(step.parameters))
    # One whole-value template: its parameters exist once rendered (in StepStarted, what
    # the undo is called with), so it is undone like its literal twin; an undo that needs
    # what they lack refuses then (NoCompensation), and the step is named as not undone.
    return getattr(tool, "compensate", None) is not None


RawSteps = list[tuple[int, dict[str, Any]]]


def _index_key(raw_steps: RawSteps) -> Any:
    index = {s["id"]: i for i, s in raw_steps}
    return lambda node: f"{index.get(node, 0):08d}"


def _raw_steps(data: dict[str, Any] | Definition) -> RawSteps:
    """Steps as plain dicts with at least an id, each with its index in ``steps``, read
    leniently so graph checks still run when some other part of the definition is malformed.
    A built Definition's unset fields are left out, as they are absent from raw data."""
    if isinstance(data, Definition):
        return list(enumerate(s.model_dump(exclude_none=True) for s in data.steps))
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list):
        return []
    return [(i, s) for i, s in enumerate(steps)
            if isinstance(s, dict) and isinstance(s.get("id"), str)]


def _valid_steps(raw_steps: RawSteps) -> list[tuple[int, Step]]:
    """The steps valid on their own, with their index, so tool and reference checks still
    run on them when another part of the definition is malformed."""
    valid = []
    for i, raw in raw_steps:
        try:
            valid.append((i, Step.model_validate(raw)))
        except ValidationError:
            continue
    return valid


def _graph(raw_steps: RawSteps) -> tuple[StepGraph, list[Problem]]:
    graph = StepGraph()
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    guarantees = [s["id"] for _, s in raw_steps if s.get("layer") == "guarantee"]
    for i, step in raw_steps:
        if step["id"] in seen:
            first = seen[step["id"]]
            problems.append(Problem(f"steps[{i}].id",
                                    f"duplicate id {step['id']!r} (first at steps[{first}])"))
        else:
            seen[step["id"]] = i
            graph.add_node(step["id"])
    for i, step_id, deps in _dependencies(raw_steps):
        for dep in deps:
            if dep not in seen:
                problems.append(Problem(f"steps[{i}].depends_on",
                                        f"unknown step {dep!r}"))
            elif dep == step_id:
                problems.append(Problem(f"steps[{i}].depends_on", "a step cannot depend on itself"))
            elif step_id in guarantees and dep not in guarantees:
                problems.append(Problem(f"steps[{i}].depends_on",
                                        f"a guarantee step cannot wait for {dep!r}, which is "
                                        "not a guarantee (guarantees run first)"))
            else:
                graph.add_edge(dep, step_id)
    # Guarantees run before everything else and block it (seed 003's layers).
    for node in list(graph.nodes):
        if node not in guarantees:
            graph.add_edges_from((g, node) for g in guarantees if g in graph)
    if graph.has_cycle():
        cycle = graph.find_cycle()
        path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
        problems.append(Problem("steps", f"dependency cycle: {path}"))
    return graph, problems


def _dependencies(raw_steps: RawSteps) -> Iterable[tuple[int, str, list[str]]]:
    """Each step's index, id and dependencies: explicit ``depends_on`` once any step
    declares one; otherwise list order, where consecutive steps sharing a ``parallel_group``
    run together."""
    if any("depends_on" in s or "dependencies" in s for _, s in raw_steps):
        for i, s in raw_steps:
            deps = s.get("depends_on", s.get("dependencies")) or []
            deps = [d for d in deps if isinstance(d, str)] if isinstance(deps, list) else []
            yield i, s["id"], deps
        return
    previous: list[str] = []
    current: list[str] = []
    group: object = object()
    for i, s in raw_steps:
        step_group = s.get("parallel_group")
        if step_group is None or step_group != group:
            previous, current = current or previous, []
        group = step_group if step_group is not None else object()
        current.append(s["id"])
        yield i, s["id"], list(previous)


def _keys(steps: Iterable[Step], graph: StepGraph) -> dict[str, str]:
    """Step ids by each name a step's output is visible under (its output key, its id)."""
    return {step.key: step.id for step in steps} | {node: node for node in graph.nodes}


def _input_names(data: Any) -> frozenset[str]:
    """The declared inputs' names of a composition (raw data or built)."""
    raw = data.get("inputs") if isinstance(data, dict) else None
    if isinstance(raw, dict):
        return frozenset(str(k) for k in raw)
    if isinstance(raw, list):
        return frozenset(str(i["name"]) for i in raw if isinstance(i, dict) and "name" in i)
    return frozenset()


def _step_problems(steps: list[tuple[int, Step]], graph: StepGraph,
                   tools: Collection[str] | Mapping[str, Any] | None,
                   inputs: frozenset[str] = frozenset()) -> list[Problem]:
    """Tool problems, references to steps that are not upstream, and output-name clashes of
    these (index, step) pairs (``inputs``: the declared inputs, readable by bare name)."""
    problems: list[Problem] = []
    keys = _keys((step for _, step in steps), graph)
    secret = {step.id for _, step in steps if step.secret_outputs}
    for i, step in steps:
        where = f"steps[{i}]"
        if tools is not None:
            problems += _tool_problems(step, where, tools)
        problems += _secret_output_problems(step, where)
        if step.id not in graph:
            continue
        upstream: set[str] | None = None  # computed when a reference needs it: O(steps)
        for path, names in _step_references(step, where, problems):
            if upstream is None and names:
                upstream = graph.ancestors(step.id)
            own = COMPENSATION_NAMES | {step.key, step.id}
            extra = own if path.startswith("compensate") else set()
            if step.loop is not None and path != "loop":
                extra = extra | {step.loop_var, "loop_index"}
            if step.until is not None:
                extra = extra | {"output", "iteration", "previous", step.key, step.id}
            problems += _reference_problems(f"{where}.{path}", names, keys, upstream or set(),
                                            extra, secret, inputs)
            own_output = {"output", step.key, step.id, f"steps.{step.key}", f"steps.{step.id}"}
            if step.secret_outputs and path.startswith("compensate") and names & own_output:
                problems.append(Problem(f"{where}.{path}", _SECRET_OUTPUT + ": a compensate "
                                        "block cannot read it (compensate: true can)"))
    seen_keys: dict[str, str] = {}
    for i, step in steps:
        if step.key in BASE_NAMES:
            problems.append(Problem(f"steps[{i}]", f"output name {step.key!r} is reserved"))
        other = seen_keys.get(step.key)
        if other is not None and other != step.id:
            problems.append(Problem(f"steps[{i}].output_key",
                                    f"output name {step.key!r} is already used by step {other!r}"))
        seen_keys[step.key] = step.id
    return problems


def _semantic_problems(definition: Definition, graph: StepGraph,
                       tools: Collection[str] | Mapping[str, Any] | None) -> list[Problem]:
    inputs = frozenset(spec.name for spec in definition.inputs)
    problems = _step_problems(list(enumerate(definition.steps)), graph, tools, inputs)
    keys = _keys(definition.steps, graph)
    if definition.outputs is not None:
        everything = set(graph.nodes)
        for name, value in definition.outputs.items():
            try:
                names = expressions.references(value)
            except ExpressionError as e:
                problems.append(Problem(f"outputs.{name}", str(e)))
                continue
            names |= _steps_refs(value)
            problems += _reference_problems(f"outputs.{name}", names, keys, everything, set(),
                                            {s.id for s in definition.steps if s.secret_outputs},
                                            inputs)
    for i, confirmation in enumerate(definition.confirmations):
        if confirmation.step not in graph:
            problems.append(Problem(f"confirmations[{i}].step",
                                    f"unknown step {confirmation.step!r}"))
    return problems


def _malformed_step_tools(raw_steps: RawSteps, checked: set[int],
                          tools: Collection[str] | Mapping[str, Any] | None) -> list[Problem]:
    """The unknown tools of steps malformed elsewhere (a ``retry: 5``), which
    :func:`_step_problems` cannot check as steps: every problem is said at once, an
    unknown tool with the rest."""
    if tools is None:
        return []
    problems = []
    for i, raw in raw_steps:
        if i in checked:
            continue
        for prefix, call in (("", raw), ("compensate.", raw.get("compensate"))):
            name = call.get("tool") if isinstance(call, dict) else None
            if isinstance(name, str) and name not in tools:
                problems.append(Problem(f"steps[{i}].{prefix}tool", unknown_tool(name, tools)))
    return problems


def _tool_problems(step: Step, where: str,
                   tools: Collection[str] | Mapping[str, Any]) -> list[Problem]:
    """Unknown tools, missing own compensations, and parameters the tool's schema rejects."""
    problems = []
    calls = [("", step.tool, step.parameters)]
    if step.compensate is not None and step.compensate.tool is not None:
        calls.append(("compensate.", step.compensate.tool, step.compensate.parameters))
    for prefix, name, params in calls:
        if name is None:
            continue
        if name not in tools:
            problems.append(Problem(f"{where}.{prefix}tool", unknown_tool(name, tools)))
            continue
        check = getattr(tools[name], "check_parameters", None) if isinstance(tools, Mapping) \
            else None
        if check is not None and isinstance(params, dict):  # a template is checked when run
            problems += [Problem(f"{where}.{prefix}parameters", msg) for msg in check(params)]
    own = step.compensate is not None and step.compensate.uses_tool_compensation
    if own and step.tool is not None and isinstance(tools, Mapping) and step.tool in tools \
            and getattr(tools[step.tool], "compensate", None) is None:
        problems.append(Problem(f"{where}.compensate",
                                f"tool {step.tool!r} has no compensation of its own"))
    return problems


def _step_references(step: Step, where: str,
                     problems: list[Problem]) -> Iterable[tuple[str, set[str]]]:
    """Names each templated part of a step reads, with static syntax problems recorded."""
    parts: list[tuple[str, Any, Any]] = [("parameters", step.parameters, expressions.references)]
    if step.loop is not None:
        parts.append(("loop", step.loop, expressions.references))
    if step.until is not None:
        parts.append(("until", step.until, expressions.expression_references))
    if step.condition is not None:
        parts.append(("condition", step.condition, expressions.expression_references))
    if step.expect is not None:
        static = expressions.check_expression(step.expect)
        problems += [Problem(f"{where}.expect", msg) for msg in static]
    if step.compute is not None:
        parts.append(("compute", step.compute, expressions.compute_references))
    if step.compensate is not None:
        parts.append(("compensate.parameters", step.compensate.parameters, expressions.references))
    for path, value, find in parts:
        problems += [Problem(f"{where}.{path}", f"unknown context field {name!r} (context "
                                                f"has {', '.join(sorted(CONTEXT_FIELDS))})")
                     for name in sorted(_names_read(value, _CONTEXT_REF) - CONTEXT_FIELDS)]
        try:
            static = _static_problems(path, value)
            if static:
                problems += [Problem(f"{where}.{path}", msg) for msg in static]
                continue
            yield path, set(find(value)) | _part_steps_refs(path, value)
        except ExpressionError as e:
            problems.append(Problem(f"{where}.{path}", str(e)))


def _static_problems(path: str, value: Any) -> list[str]:
    refused = [f"secret {name!r} is one of saga's own settings and is never readable"
               for name in sorted(_names_read(value, _SECRET_REF)) if secrets.forbidden(name)]
    if path in ("condition", "until"):
        return refused + expressions.check_expression(value)
    if path == "compute":
        return refused + expressions.check_compute(value)
    return refused + expressions.check_template(value)


#: What ``context`` holds (see :func:`saga.scheduler.policy.run_context`).
CONTEXT_FIELDS = frozenset({"run_id", "execution_id", "actor", "user_id", "labels", "mode",
                            "scheduled_at", "parent", "trace_id", "traceparent"})
_CONTEXT_REF = re.compile(r"\bcontext\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*['\"]([^'\"]+)['\"]\s*\])")


def _names_read(value: Any, pattern: re.Pattern[str]) -> set[str]:
    """The names ``pattern`` finds (as ``x.NAME`` or ``x['NAME']``) in every string of a
    value: the fields a value's templates or code read from one namespace."""
    if isinstance(value, str):
        return {a or b for a, b in pattern.findall(value)}
    if isinstance(value, dict):
        return set().union(*(_names_read(v, pattern) for v in value.values()), set())
    if isinstance(value, list):
        return set().union(*(_names_read(v, pattern) for v in value), set())
    return set()


_SECRET_REF = re.compile(r"secret\s*(?:\.\s*([A-Za-z_]\w*)|\[\s*['\"]([^'\"]+)['\"]\s*\])")


def _steps_refs(value: Any) -> set[str]:
    """Step ids the templates in ``value`` read as ``steps.X`` or ``steps['X']``, reported as
    ``steps.X`` names. Plain text reads nothing: "docs/steps.md" is a path, not a step."""
    if isinstance(value, str):
        found = _STEPS_REF.findall(value) if expressions.is_template(value) else []
        return {f"steps.{a or b}" for a, b in found}
    if isinstance(value, dict):
        return set().union(*(_steps_refs(k) | _steps_refs(v) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return set().union(*(_steps_refs(item) for item in value))
    return set()


def _part_steps_refs(path: str, value: Any) -> set[str]:
    """``steps.X`` names one part of a step reads; code (a compute block, a condition that
    is not a template) is read from its syntax tree, so ``'steps.md'`` in a string is not."""
    if path == "compute":
        return _code_steps_refs(textwrap.dedent(value).strip(), "exec")
    text = value.strip() if path == "condition" else ""
    if text and not (text.startswith("{{") and text.endswith("}}")):
        return _code_steps_refs(text, "eval")
    return _steps_refs(value)


def _code_steps_refs(source: str, mode: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source, mode=mode)):
        if not (isinstance(node, ast.Attribute | ast.Subscript)
                and isinstance(node.value, ast.Name) and node.value.id == "steps"):
            continue
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
            names.add(node.slice.value)
    return {f"steps.{name}" for name in names}


_SECRET_OUTPUT = "its output is kept out of the log (secret_outputs: true)"


def _secret_output_problems(step: Step, where: str) -> list[Problem]:
    """``secret_outputs`` is for tool steps whose output nothing reads back from the log."""
    if not step.secret_outputs:
        return []
    why = ("needs a tool step" if step.tool is None else
           "cannot be combined with 'until', which reads the output" if step.until else
           "cannot be combined with 'cache', which would keep the output" if step.cache else
           None)
    return [Problem(f"{where}.secret_outputs", why)] if why else []


def _reference_problems(path: str, names: set[str], keys: dict[str, str], upstream: set[str],
                        extra: Collection[str], secret: Collection[str] = (),
                        inputs: frozenset[str] = frozenset()) -> list[Problem]:
    problems = []
    for name in sorted(names):
        if name.startswith("steps."):
            ref = name.removeprefix("steps.")
            step_id = keys.get(ref)
            if step_id is None:
                problems.append(Problem(path, f"references unknown step {ref!r}"))
            elif step_id not in upstream and ref not in extra:
                problems.append(Problem(path, f"references step {ref!r}, which is not upstream "
                                              "(add it to depends_on)"))
            elif step_id in secret and ref not in extra:
                problems.append(Problem(path, f"references step {ref!r}: {_SECRET_OUTPUT}"))
            continue
        if name in BASE_NAMES or name in _SAFE_BUILTINS or name in extra:
            continue
        step_id = keys.get(name)
        if step_id is None and name in inputs:
            continue  # a declared input, by its bare name (seed 002)
        if step_id is None:
            problems.append(Problem(path, f"unknown name {name!r}"))
        elif step_id not in upstream:
            problems.append(Problem(path, f"references step {name!r}, which is not upstream "
                                          "(add it to depends_on)"))
        elif step_id in secret:
            problems.append(Problem(path, f"references step {name!r}: {_SECRET_OUTPUT}"))
    return problems
