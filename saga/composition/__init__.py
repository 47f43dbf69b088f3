"""What users write, compiled: text -> definition -> plan.

Both forms compile to one :class:`Plan`: the step-list form (:mod:`.definition`,
:mod:`.plan`) and the graph form (:mod:`.graph_form`). :func:`load` also resolves the
compositions that ``use`` steps name (files, or templates from :mod:`.library`), so a
nested composition is checked before anything runs. :func:`plan_of` is the one way to
get the plan a recorded run is driven by.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from saga.composition.definition import load_file, text_problems
from saga.composition.library import (
    SUFFIXES,
    find_template,
    source_name,
    template_document,
    template_problems,
)
from saga.composition.plan import Plan, compile_plan
from saga.domain import Run
from saga.errors import CompositionNotFoundError, DefinitionError, Problem, SagaError
from saga.lazy import lazy

if TYPE_CHECKING:
    from saga.composition import graph_form
    from saga.composition.graph_form import GraphPlan
else:
    graph_form = lazy("saga.composition.graph_form")  # loaded by a graph-form document

__all__ = ["GraphPlan", "Plan", "compile_any", "load", "load_child", "plan_of", "resolve",
           "tree_tools"]

Tools = Collection[str] | Mapping[str, Any] | None


def compile_any(data: dict[str, Any], *, tools: Tools = None, source: str | None = None) -> Plan:
    """Compile either form: the graph form (``nodes``/``edges``, seed 004) or the step-list
    form. Both give a plan the scheduler and executor drive the same way."""
    problems = text_problems(data)
    if problems:
        raise DefinitionError(problems, source)
    inner = template_document(data) if isinstance(data, dict) else None
    if inner is not None:  # seed 001: a template document around its composition
        problems = template_problems(data, tools)
        if problems:
            raise DefinitionError(problems, source)
        data = inner
    if isinstance(data, dict) and "name" not in data and source and Path(source).suffix:
        data = {"name": Path(source).stem, **data}  # seed 001: the file names it
    if isinstance(data, dict) and "nodes" in data and "steps" not in data:
        return graph_form.compile_graph(data, tools=tools, source=source)
    return compile_plan(data, tools=tools, source=source)


def load(source: str | Path | Mapping[str, Any], tools: Tools = None) -> Plan:
    """Load and validate a composition (a file path, a template's name, or raw data) into
    a plan, with the compositions its ``use`` steps name; every problem of all of them at
    once."""
    if isinstance(source, Mapping):
        plan = compile_any(dict(source), tools=tools)
    else:
        if not _on_disk(source, Path.exists) and Path(source).suffix in ("", *SUFFIXES):
            try:
                source = resolve(str(source))  # a template's name where a file is expected
            except DefinitionError as e:
                raise CompositionNotFoundError(e.problems[0]) from e
        plan = compile_any(load_file(source), tools=tools, source=source_name(source))
    problems = []
    for i, step in enumerate(plan.definition.steps):
        if step.use is None:
            continue
        try:
            child = load_child(step.use, tools)
        except DefinitionError as e:
            problems += [_nested_problem(plan, i, p) for p in e.problems]
        else:
            problems += mapping_problems(plan, i, child)
    if problems:
        raise DefinitionError(problems, None if isinstance(source, Mapping)
                              else source_name(source))
    return plan


def mapping_problems(plan: Plan, i: int, child: Plan) -> list[Problem]:
    """A subgraph node's (seed 004) ``input_mapping`` and ``output_mapping`` checked
    against the workflow it names, before anything runs: each mapped input is one the
    child declares, every input it requires is mapped, and each mapped output is one it
    declares (``outputs.x`` or the seed's bare ``x``)."""
    if plan.form != "graph":
        return []
    node = plan.nodes[plan.definition.steps[i].id]  # type: ignore[attr-defined]
    config = node.subgraph_config
    if config is None:
        return []
    where = f"nodes[{i}].subgraph_config"
    problems = []
    declared = {spec.name: spec for spec in child.definition.inputs}
    name = child.definition.name
    if declared and config.input_mapping:
        for key in config.input_mapping:
            if key not in declared:
                problems.append(Problem(f"{where}.input_mapping.{key}",
                                        f"{name} has no input {key!r} (its inputs: "
                                        f"{', '.join(declared)})"))
        missing = [n for n, spec in declared.items() if spec.required and spec.default is None
                   and n not in config.input_mapping]
        if missing:
            problems.append(Problem(f"{where}.input_mapping",
                                    f"{name} requires {', '.join(missing)}, not mapped"))
    outputs = child.definition.outputs
    if isinstance(outputs, dict):
        for key, path in config.output_mapping.items():
            root = path.removeprefix("outputs.").split(".")[0]
            if root not in outputs:
                problems.append(Problem(f"{where}.output_mapping.{key}",
                                        f"{name} has no output {root!r} (its outputs: "
                                        f"{', '.join(outputs) or 'none'})"))
    return problems


def _nested_problem(plan: Plan, i: int, problem: Problem) -> Problem:
    """A problem of the composition step i uses, at the path the user wrote: ``steps[i]``
    in the step-list form, the node's ``subgraph_config.workflow_name`` in the graph form
    (one step per node, in node order), with the child's own path in the message."""
    if plan.form != "graph":
        return Problem(f"steps[{i}].{problem.path}" if problem.path else f"steps[{i}].use",
                       problem.message)
    inner = "" if problem.path in ("", "use") else f"{problem.path}: "
    return Problem(f"nodes[{i}].subgraph_config.workflow_name", inner + problem.message)


def resolve(use: str) -> Path:
    """The composition a ``use`` names: a file (absolute or relative to the working
    directory), else a template by name."""
    path = Path(use)
    if _on_disk(path, Path.is_file):
        return path
    try:
        return find_template(use)
    except Exception as e:
        raise DefinitionError([Problem("use", f"no composition file or template {use!r}: "
                                              f"{e}")]) from e


def _on_disk(path: str | Path, check: Callable[[Path], bool]) -> bool:
    """``check(path)`` (``Path.exists``, ``Path.is_file``); a name no file system takes
    (too long, with a NUL) is simply not there, rather than an OSError."""
    try:
        return check(Path(path))
    except (OSError, ValueError):
        return False


def load_child(use: str, tools: Tools, seen: tuple[str, ...] = ()) -> Plan:
    """Load and validate a nested composition (and, recursively, the ones it uses)."""
    path = resolve(use)
    key = str(path.resolve())
    if key in seen:
        chain = " -> ".join([*seen, key])
        raise DefinitionError([Problem("use", f"compositions use each other in a cycle: {chain}")])
    plan = compile_any(load_file(path), tools=tools, source=str(path))
    for step in plan.definition.steps:
        if step.use is not None:
            load_child(step.use, tools, (*seen, key))
    # A child that waits (an approval, a signal, a timer) makes its parent's step wait.
    return plan


def tree_tools(plan: Plan, seen: frozenset[str] = frozenset()) -> set[str]:
    """Every tool a run of ``plan`` may call, with those of the compositions its ``use``
    steps name (loaded as a child run's start loads them). One that cannot be loaded here
    adds none: its step fails when it starts, whatever tools there are."""
    names = plan.tools_named()
    for step in plan.steps.values():
        if step.use is None or step.use in seen:
            continue
        try:
            child = load_child(step.use, None)
        except (SagaError, OSError):
            continue
        names |= tree_tools(child, seen | {step.use})
    return names


_PLANS: dict[str, Plan] = {}


def plan_of(run: Run) -> Plan:
    """The compiled plan of a run's recorded definition, cached by its hash (a plan is
    immutable and the same for every run of one definition)."""
    plan = _PLANS.get(run.definition_hash)
    if plan is None:
        if len(_PLANS) > 256:
            _PLANS.clear()
        plan = _PLANS[run.definition_hash] = compile_any(run.definition)
    return plan


def __getattr__(name: str) -> Any:
    if name == "GraphPlan":  # exported, but imported only when asked for
        return graph_form.GraphPlan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
