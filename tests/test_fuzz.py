"""Fuzzing the front door: generated compositions (valid-ish and broken), inputs and
command lines against ``saga validate``, ``saga run --dry-run`` and ``saga run``.

Whatever comes in, saga answers with a documented exit code (0-6) and at most one error
line, never a traceback or the catch-all "run with --debug" (an error nobody handled);
an invalid definition or input exits 2 and writes no event. In process through click's
CliRunner (each property on a SQLite store of its own), a few through real processes.

The budget per property is ``SAGA_FUZZ_EXAMPLES`` (default 100); ``ops/fuzz.sh`` runs
the long profile.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from saga.api import Saga
from saga.cli import main
from saga.cli.runs import _parse_inputs
from saga.composition import load
from saga.composition.definition import resolve_inputs
from saga.config import Settings
from saga.errors import DefinitionError, InputError
from saga.tools import load_registry

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = int(os.environ.get("SAGA_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture,
                                       HealthCheck.filter_too_much])
DOCUMENTED = {0, 1, 2, 3, 4, 5, 6}
#: Tools a generated run may call: no files, processes or network.
SAFE_TOOLS = ["echo", "noop", "fail"]
TOOLS = [*SAFE_TOOLS, "sleep", "shell", "http", "sql", "file", "git", "nope", "mcp.x.y", ""]
TOOLS_KNOWN = load_registry([]).tools()  # what the CLI validates against (no saga.toml)

# -- text, values and templates ------------------------------------------------------------

ODD = ["", " ", "\u202e", "🚀", "a\nb", "\t", "\ud800", "x\udfff",
       "é" * 3, "\ufeff", "$", "{{", "}}", "{%", "%}", "{#", "null", "~", "- a", "&a", "*a",
       "!!python/object:os.system", "\u0085", "\u2028", "ﬀ", "ß", "İ", "x" * 300,
       "../" * 40, "/dev/null", "."]
# NUL is refused everywhere (tests/composition/test_hostile_text.py): the mutations
# below put it in now and then, so that it does not hide everything else.
text = st.one_of(st.text(st.characters(exclude_characters="\x00"), max_size=12),
                 st.sampled_from(ODD),
                 st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8))
ident = st.one_of(st.sampled_from(["a", "b", "c", "step-1", "x_y"]), text)
TEMPLATES = [
    "{{ inputs.x }}", "{{ inputs.missing }}", "{{ a }}", "{{ a.x }}", "{{ steps.a }}",
    "{{ x | upper }}", "{{", "}}", "{{ }}", "{{ 1/0 }}", "{{ ''.__class__ }}",
    "{% for i in range(3) %}{{ i }}{% endfor %}", "{{ inputs.x * 3 }}", "{{ inputs }}",
    "{{ secret.SAGA_AUDIT_KEY }}", "{{ secret.nope }}", "{{ lipsum() }}", "{{ cycler }}",
    "{{ range(10**9) | list }}", "{{ 'a' * 10**8 }}", "{{ context.actor }}",
    "{{ inputs.x | tojson }}", "{{ inputs.x | fromjson }}", "{{ self }}", "{{ config }}",
    "{# c #}", "{% raw %}{{{% endraw %}", "{{ x | center(10**9) }}", "{{ output }}",
    "{{ item }}", "{{ loop_index }}", "{{ a | default('d') }}", "{{ [1] * 10**7 }}",
]
template = st.one_of(st.sampled_from(TEMPLATES),
                     st.builds(lambda a, t, b: a + t + b, text, st.sampled_from(TEMPLATES), text))
EXPRESSIONS = ["true", "false", "inputs.x > 1", "1/0", "x.__class__", "a and a.x == 1",
               "len(inputs) > 0", "(", "import os", "lambda: 1", "[i for i in range(10**9)]",
               "'a' * 10**9", "output.value >= 3", "inputs.get('x')", "None", "2 ** 10000"]
expression = st.one_of(st.sampled_from(EXPRESSIONS), text)
COMPUTE = ["result = 1", "result = inputs.get('x')", "x = 1", "result = [i for i in range(5)]",
           "while True: pass", "import os\nresult = 1", "result = 'a' * 10**9",
           "result = a", "result = ().__class__", "result = {k: 1 for k in 'abc'}",
           "def f(): pass\nresult = 1"]
compute = st.one_of(st.sampled_from(COMPUTE), text)
number = st.one_of(st.integers(-10, 10), st.integers(), st.floats(allow_nan=True),
                   st.sampled_from([0, -1, 1e308, 2**63, "1", "1s", "10m", "", "x"]))
scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text, template)
value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(text, inner, max_size=3), max_leaves=12)


def nested(depth: int, as_dict: bool) -> Any:
    v: Any = "{{ inputs.x }}"
    for _ in range(depth):
        v = {"k": v} if as_dict else [v]
    return v


deep = st.builds(nested, st.integers(1, 120), st.booleans())

# -- compositions --------------------------------------------------------------------------

step_id = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
INPUT_VALUES = {"string": text, "integer": st.integers(), "number": st.floats(),
                "boolean": st.booleans(), "array": st.lists(scalar, max_size=3),
                "object": st.dictionaries(text, scalar, max_size=3), "any": value}


@st.composite
def input_spec(draw: st.DrawFn, name: str) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(INPUT_VALUES)))
    spec: dict[str, Any] = {"name": name, "type": kind}
    if draw(st.booleans()):
        spec["required"] = True
    elif draw(st.booleans()):
        spec["default"] = draw(INPUT_VALUES[kind])
    if kind == "string" and draw(st.integers(0, 3)) == 0:
        spec["pattern"] = draw(st.sampled_from(["^a+$", ".*", "^[a-z]*$", "é"]))
    if kind in ("integer", "number") and draw(st.integers(0, 3)) == 0:
        spec["minimum"] = draw(st.integers(-5, 5))
    if draw(st.integers(0, 5)) == 0:
        spec["secret"] = True
    return spec


@st.composite
def valid_step(draw: st.DrawFn, sid: str, earlier: list[str],
               tools: list[str]) -> dict[str, Any]:
    """A step the language accepts, with hostile values where values go."""
    step: dict[str, Any] = {"id": sid}
    refs = [*TEMPLATES, *(f"{{{{ {e} }}}}" for e in earlier),
            *(f"{{{{ steps.{e}.x }}}}" for e in earlier)]
    if draw(st.integers(0, 4)) == 0:
        step["compute"] = draw(compute)
    else:
        step["tool"] = tool = draw(st.sampled_from(tools))
        args = draw(st.dictionaries(st.one_of(st.sampled_from(["x", "value", "note"]), text),
                                    st.one_of(value, deep, st.sampled_from(refs)),
                                    max_size=3))
        if tool == "fail":
            args["message"] = draw(st.one_of(text, st.sampled_from(refs)))
            if draw(st.booleans()):
                args["times"] = draw(st.sampled_from([1, 2, "x", -1]))
        if args or draw(st.booleans()):
            step[draw(st.sampled_from(["args", "parameters"]))] = args
        if draw(st.integers(0, 4)) == 0:
            step["loop"] = draw(st.one_of(st.lists(scalar, max_size=3),
                                          st.sampled_from(["{{ inputs.items }}", "{{ [1, 2] }}",
                                                           "{{ inputs.x }}"])))
        elif draw(st.integers(0, 5)) == 0:
            step["until"] = draw(expression)
            step["max_iterations"] = draw(st.integers(1, 3))
        if draw(st.integers(0, 3)) == 0:
            step["compensate"] = {"tool": draw(st.sampled_from(tools)),
                                  "args": draw(st.dictionaries(text, template, max_size=2))}
        if draw(st.integers(0, 4)) == 0:
            step["retry"] = {"max_attempts": draw(st.integers(1, 3)), "delay": 0.001}
        if draw(st.integers(0, 4)) == 0:
            step["expect"] = draw(expression)
        if draw(st.integers(0, 4)) == 0:
            step["timeout"] = draw(st.sampled_from([0.5, 2, 30]))
    if earlier and draw(st.booleans()):
        step["depends_on"] = draw(st.lists(st.sampled_from(earlier), unique=True))
    if draw(st.integers(0, 3)) == 0:
        step["when"] = draw(st.one_of(expression, st.sampled_from(
            [f"{e} and {e}.x == 1" for e in earlier] or ["true"])))
    if draw(st.integers(0, 4)) == 0:
        step["output"] = draw(step_id)
    if draw(st.integers(0, 4)) == 0:
        step["on_error"] = draw(st.sampled_from(["fail", "continue", "compensate", "retry:1"]))
    if draw(st.integers(0, 5)) == 0:
        step["layer"] = draw(st.sampled_from(["guarantee", "enhancement", "execution"]))
    if draw(st.integers(0, 5)) == 0:
        step["description"] = draw(text)
    return step


@st.composite
def valid_composition(draw: st.DrawFn, tools: list[str] = SAFE_TOOLS) -> dict[str, Any]:
    """A composition the language accepts in shape: odd text, templates, deep values,
    inputs of every type (references may still be wrong, which validation reports)."""
    ids = draw(st.lists(step_id, min_size=1, max_size=5, unique=True))
    steps = [draw(valid_step(sid, ids[:i], tools)) for i, sid in enumerate(ids)]
    data: dict[str, Any] = {"name": draw(st.one_of(st.just("fuzz"), text.filter(bool))),
                            "steps": steps}
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(["x", "y", "items"]), unique=True, max_size=3))
        data["inputs"] = [draw(input_spec(n)) for n in names]
    if draw(st.integers(0, 3)) == 0:
        data["outputs"] = draw(st.dictionaries(step_id, template, max_size=2))
    if draw(st.integers(0, 3)) == 0:
        data["error_handling"] = {
            "failure_strategy": draw(st.sampled_from(["fail_fast", "partial_success",
                                                      "rollback"])),
            "rollback_on_failure": draw(st.booleans())}
    if draw(st.integers(0, 4)) == 0:
        data["max_concurrency"] = draw(st.integers(1, 4))
    return data


def _some_step(data: dict[str, Any], draw: st.DrawFn) -> dict[str, Any]:
    steps = data.get("steps")
    steps = [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
    if not steps:
        raise KeyError("steps")  # an earlier mutation took them away: nothing to change
    return draw(st.sampled_from(steps))


MUTATIONS = [
    lambda d, draw: d.pop(draw(st.sampled_from(["name", "steps"]))),
    lambda d, draw: d.__setitem__(draw(text), draw(value)),
    lambda d, draw: d.__setitem__(draw(st.sampled_from(["steps", "inputs", "outputs", "name",
                                                        "max_concurrency", "error_handling",
                                                        "timeout"])), draw(value)),
    lambda d, draw: _some_step(d, draw).pop("id"),
    lambda d, draw: _some_step(d, draw).__setitem__("id", draw(text)),
    lambda d, draw: d["steps"].append(dict(_some_step(d, draw))),  # a duplicate id
    lambda d, draw: _some_step(d, draw).__setitem__("depends_on", [draw(
        st.one_of(text, st.sampled_from([s["id"] for s in d["steps"]])))]),  # unknown, cycle
    lambda d, draw: _some_step(d, draw).__setitem__("tool", draw(text)),
    lambda d, draw: _some_step(d, draw).__setitem__("compute", draw(compute)),
    lambda d, draw: _some_step(d, draw).__setitem__(draw(st.sampled_from(
        ["retry_count", "timeout", "on_error", "layer", "loop", "max_iterations", "retry",
         "cache", "confirm", "use", "on_interrupt", "heal", "sleep", "signal", "loop_var",
         "parameters", "when", "output", "compensate"])), draw(st.one_of(number, value))),
    lambda d, draw: _some_step(d, draw).__setitem__(draw(text), draw(value)),
    lambda d, draw: d.__setitem__("name", draw(st.sampled_from(["", "a\x00b", "\ud800"]))),
    lambda d, draw: _some_step(d, draw).__setitem__("args", {"x": draw(text) + "\x00"}),
]


@st.composite
def composition(draw: st.DrawFn, *, tools: list[str] = SAFE_TOOLS) -> Any:
    """Mostly well-formed, often broken by one or two mutations, sometimes junk."""
    roll = draw(st.integers(0, 9))
    if roll == 0:
        return draw(st.one_of(value, st.lists(value), text))  # not a mapping at all
    data = draw(valid_composition(tools))
    if roll == 1:
        return {"name": data["name"], "nodes": draw(st.lists(st.dictionaries(
            st.sampled_from(["id", "type", "role", "task_template", "config"]), value),
            max_size=3)), "edges": draw(st.lists(value, max_size=3))}
    if roll >= 6:
        for index in draw(st.lists(st.integers(0, len(MUTATIONS) - 1), min_size=1,
                                   max_size=2)):
            # What a mutation meant to change may be gone already.
            with contextlib.suppress(KeyError, IndexError, TypeError, AttributeError):
                MUTATIONS[index](data, draw)
    return data


# -- the graph form (seed 004) ---------------------------------------------------------------

TASK_TEMPLATES = ["Do {input}", "{input}", "x {x}", "{}", "{0}", "{x.attr}", "{", "}",
                  "{{literal}}", "{n:>5}", "{input:>99999999}", "{x[key]}", "", "{input!r}",
                  "{input:{input}}", "{{ inputs.x }}"]
OPERATORS = ["==", "!=", ">", "<", ">=", "<=", "in", "not_in", "contains", "starts_with",
             "ends_with", "=~", ""]
NODE_TYPES = ["task", "task", "gate", "branch", "merge", "parallel", "human", "subgraph",
              "nope"]


def odd(draw: st.DrawFn, usual: Any, unusual: Any) -> Any:
    """Mostly ``usual``, one time in twelve ``unusual`` (so that many graphs get past
    validation and run, and every check is still tried)."""
    return draw(unusual if draw(st.integers(0, 11)) == 0 else usual)


@st.composite
def condition(draw: st.DrawFn, loop: bool = False) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "field": odd(draw, st.sampled_from(["branch_outcome", "passed", "approved",
                                            "test_status", "input", "x"]), text),
        "operator": odd(draw, st.sampled_from(OPERATORS[:-2]), st.sampled_from(OPERATORS)),
        "value": odd(draw, st.sampled_from(["on_true", "on_false", True, "passed", 1]),
                     scalar)}
    if loop:
        cond["max_iterations"] = odd(draw, st.integers(1, 3), number)
    return cond


@st.composite
def graph_node(draw: st.DrawFn, nid: str, ids: list[str]) -> dict[str, Any]:
    kind = odd(draw, st.sampled_from(NODE_TYPES[:-1]), st.sampled_from(NODE_TYPES))
    node: dict[str, Any] = {"id": nid, "type": kind}
    if kind == "task":
        config: dict[str, Any] = {
            "role": odd(draw, st.sampled_from(SAFE_TOOLS), st.just("nope")),
            "task_template": odd(draw, st.sampled_from(TASK_TEMPLATES[:2]),
                                 st.one_of(st.sampled_from(TASK_TEMPLATES), text))}
        if draw(st.integers(0, 5)) == 0:
            config["worktree_id"] = draw(text)
        if draw(st.integers(0, 3)) == 0:
            config["gates"] = draw(st.lists(st.sampled_from([*SAFE_TOOLS, "nope"]), max_size=2))
        if draw(st.integers(0, 4)) == 0:
            config["retry"] = {"max_attempts": draw(st.integers(1, 3)), "delay": 0.001}
        if draw(st.integers(0, 4)) == 0:
            config["compensate"] = {"tool": draw(st.sampled_from(SAFE_TOOLS))}
        node["task_config"] = config
    elif kind == "gate":
        node["gate_config"] = {"gate_type": odd(draw, st.sampled_from(SAFE_TOOLS),
                                                st.just("nope"))}
        if draw(st.integers(0, 5)) == 0:
            node["gate_config"]["auto_approve"] = draw(st.booleans())
    elif kind == "branch":
        node["branch_config"] = {"condition": draw(condition(loop=True)),
                                 "on_true": draw(st.sampled_from([*ids, "gone"])),
                                 "on_false": draw(st.sampled_from([*ids, "gone"]))}
    elif kind == "merge":
        node["merge_config"] = {
            "wait_for": odd(draw, st.sampled_from(["all", "any"]), st.sampled_from(["first", 1])),
            "merge_strategy": odd(draw, st.sampled_from(["union", "intersection", "first"]),
                                  st.just("x"))}
    elif kind == "parallel":
        node["parallel_config"] = {
            "branches": draw(st.lists(st.sampled_from([*ids, "gone"]), max_size=3)),
            "wait_for": odd(draw, st.just("all"), st.sampled_from(["any", "first", "x"]))}
    elif kind == "human":
        node["human_config"] = {"title": draw(text), "description": draw(text)}
    elif kind == "subgraph":
        node["subgraph_config"] = {"workflow_name": draw(st.one_of(st.just("nope"), text)),
                                   "input_mapping": draw(st.dictionaries(text, text,
                                                                         max_size=2))}
    if draw(st.integers(0, 5)) == 0:
        node["label"] = odd(draw, text, value)
    if draw(st.integers(0, 5)) == 0:
        node["ui_metadata"] = odd(draw, st.dictionaries(text, scalar, max_size=2), value)
    return node


@st.composite
def graph_composition(draw: st.DrawFn) -> Any:
    """A seed 004 graph: mostly forward edges (some conditional), now and then a loop
    edge back to an earlier node, odd node settings; sometimes mutated."""
    ids = draw(st.lists(step_id, min_size=1, max_size=6, unique=True))
    nodes = [draw(graph_node(nid, ids)) for nid in ids]
    edges: list[dict[str, Any]] = []
    for i, source in enumerate(ids):
        later = ids[i + 1:]
        targets = draw(st.lists(st.sampled_from(later), max_size=2, unique=True)) \
            if later else []
        if later and not any(e["target"] == later[0] for e in edges) \
                and later[0] not in targets:
            targets.append(later[0])  # every node reachable, mostly
        if nodes[i]["type"] == "parallel":  # mostly branches that are its own edges
            nodes[i]["parallel_config"]["branches"] = odd(
                draw, st.just(targets), st.just(nodes[i]["parallel_config"]["branches"]))
        if nodes[i]["type"] == "branch" and later:  # mostly: both outcomes have an edge
            targets = list(dict.fromkeys([*targets, *later[:2]]))
            config = nodes[i]["branch_config"]
            config["on_true"] = odd(draw, st.just(targets[0]), st.just(config["on_true"]))
            config["on_false"] = odd(draw, st.just(targets[-1]), st.just(config["on_false"]))
        for target in targets:
            edge: dict[str, Any] = {"id": f"e{len(edges)}", "source": source,
                                    "target": target}
            if draw(st.integers(0, 3)) == 0:
                edge["condition"] = draw(condition())
            edges.append(edge)
        if i and draw(st.integers(0, 5)) == 0:  # a loop back
            back = odd(draw, st.just(ids[0]), st.sampled_from(ids[:i]))
            edges.append({"id": f"e{len(edges)}", "source": source, "target": back,
                          "is_loop_edge": True, "condition": draw(condition())})
            if nodes[i]["type"] == "branch":
                nodes[i]["branch_config"]["on_false"] = back
    for i, node in enumerate(nodes):  # a merge mostly has two ways in
        sources = [e["source"] for e in edges if e["target"] == ids[i]]
        for source in ids[:i]:
            if node["type"] == "merge" and len(sources) < 2 and source not in sources:
                sources.append(source)
                edges.append({"id": f"e{len(edges)}", "source": source, "target": ids[i]})
    data: dict[str, Any] = {"id": odd(draw, st.just("g"), text),
                            "name": odd(draw, st.just("graph"), text),
                            "entry_point": odd(draw, st.just(ids[0]),
                                               st.sampled_from([*ids, "gone"])),
                            "nodes": nodes, "edges": edges}
    if draw(st.booleans()):
        data["exit_points"] = odd(draw, st.just([ids[-1]]),
                                  st.lists(st.sampled_from([*ids, "gone"]), max_size=2))
    if draw(st.booleans()):
        data["config"] = {"max_parallel_nodes": odd(draw, st.integers(1, 4), number),
                          "fail_fast": odd(draw, st.booleans(), value)}
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 2)) == 0 else 0):
        with contextlib.suppress(KeyError, IndexError, TypeError, AttributeError):
            draw(st.sampled_from(GRAPH_MUTATIONS))(data, draw)
    return data


GRAPH_MUTATIONS = [
    lambda d, draw: d.pop(draw(st.sampled_from(["nodes", "edges", "entry_point", "name"]))),
    lambda d, draw: d.__setitem__(draw(st.sampled_from(["nodes", "edges", "entry_point",
                                                        "exit_points", "config"])), draw(value)),
    lambda d, draw: d["nodes"].append(dict(draw(st.sampled_from(d["nodes"])))),  # duplicate
    lambda d, draw: d["edges"].append(dict(draw(st.sampled_from(d["edges"])))),  # duplicate
    lambda d, draw: draw(st.sampled_from(d["nodes"])).__setitem__(
        draw(st.sampled_from(["type", "id", "task_config", "gate_config", "branch_config",
                              "merge_config", "parallel_config", "human_config"])),
        draw(st.one_of(value, number))),
    lambda d, draw: draw(st.sampled_from(d["edges"])).__setitem__(
        draw(st.sampled_from(["source", "target", "condition", "is_loop_edge"])),
        draw(st.one_of(value, st.sampled_from([n["id"] for n in d["nodes"]])))),
    lambda d, draw: d.__setitem__("steps", [{"id": "a", "tool": "noop"}]),  # both forms
]


def as_file(data: Any, folder: Path, style: str) -> Path:
    """Write generated data the way a user would: JSON, YAML, or the raw text."""
    path = folder / f"c-{uuid.uuid4().hex[:10]}.{'json' if style != 'yaml' else 'yaml'}"
    if style == "yaml":
        try:
            path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8",
                            errors="surrogatepass")
        except (yaml.YAMLError, UnicodeEncodeError, ValueError):
            path.write_text(json.dumps(data), encoding="utf-8")
    elif style == "raw" and isinstance(data, str):
        path.write_bytes(data.encode("utf-8", "surrogatepass"))
    else:
        path.write_text(json.dumps(data), encoding="utf-8")  # NaN and \\ud800 escapes too
    return path


# -- what every answer must be -------------------------------------------------------------

def events(home: Path) -> int:
    """How many events the SQLite store holds (0 when it was never created)."""
    db = home / "saga.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM stored_events").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def clean(result: Result) -> None:
    """A documented exit code, no traceback, no unhandled error, one error line at most."""
    assert result.exit_code in DOCUMENTED, (result.exit_code, result.output[-800:])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"unhandled {result.exception!r}") from result.exception
    out = result.output
    assert "Traceback" not in out, out[-800:]
    assert "run with --debug" not in out, out[-800:]  # the catch-all: nobody handled it
    assert sum(line.startswith("error:") for line in out.splitlines()) <= 1, out[-800:]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def invoke(home: Path, argv: list[str]) -> Result:
    # Short waits and expression budgets: a hostile template costs its limit, not 2 s.
    env = {"SAGA_HOME": str(home / ".saga"), "SAGA_HOLD_SECONDS": "0.05", "SAGA_ACTOR": "fuzz",
           "SAGA_EXPRESSION_SECONDS": "0.2",
           "SAGA_CONFIG": None, "SAGA_DATABASE_URL": None, "SAGA_TOOLS": None}
    return CliRunner().invoke(main, argv, env=env, catch_exceptions=True)


def api_says(path: Path, pairs: list[str] | None = None) -> int:
    """What the Python API says of a file and inputs: 2 invalid, 0 acceptable."""
    try:
        plan = load(path, TOOLS_KNOWN)
        if pairs is not None:
            specs = {s.name: s for s in plan.definition.inputs}
            resolve_inputs(plan.definition, _parse_inputs(tuple(pairs), None, specs))
    except (DefinitionError, InputError):
        return 2
    return 0


input_pairs = st.lists(st.one_of(
    st.builds(lambda k, v: f"{k}={v}", st.sampled_from(["x", "y", "items", "zz", "",
                                                        "input"]),
              st.one_of(text, st.sampled_from(['[1, 2]', '{"a": 1}', "3", "1e999", "NaN",
                                               "true", "[[[[]]]]", '"q"']))),
    text), max_size=3)

# -- the properties ------------------------------------------------------------------------


@FUZZ
@given(data=composition(tools=TOOLS) | graph_composition(),
       style=st.sampled_from(["json", "yaml", "raw"]), as_json=st.booleans())
@example(data={"name": "n", "steps": [{"id": "a", "tool": "echo",
                                        "args": {"x": "\ud800"}}]}, style="json", as_json=False)
@example(data={"name": "n", "steps": [{"id": "a", "tool": "echo", "args": {"x": math.nan}}]},
         style="json", as_json=True)
@example(data={"name": "n", "steps": [{"id": "a", "use": "b" * 300}]},  # was: OSError, exit 1
         style="yaml", as_json=False)
def test_validate_answers_0_or_2_like_the_api(home: Path, data: Any, style: str,
                                              as_json: bool) -> None:
    path = as_file(data, home, style)
    result = invoke(home, ["validate", str(path), *(["--json"] if as_json else [])])
    clean(result)
    assert result.exit_code == api_says(path), result.output[-800:]


@FUZZ
@given(data=composition(tools=TOOLS) | graph_composition(), pairs=input_pairs,
       as_json=st.booleans())
# A graph whose edges were a number: TypeError from the reachability check, exit 1.
@example(data={"id": "g", "name": "graph", "entry_point": "R", "nodes": [
    {"id": "R", "type": "task", "task_config": {"role": "echo", "task_template": "{input}"}}],
    "edges": 12}, pairs=[], as_json=False)
# Edges written as null passed the checks (read as none) and then failed the graph's
# model: a pydantic error from the catch-all, exit 1. Now null is no edges; "" is refused.
@example(data={"id": "g", "name": "graph", "entry_point": "A", "nodes": [
    {"id": "A", "type": "human", "human_config": {"title": "", "description": ""},
     "label": None}], "edges": None}, pairs=[], as_json=False)
@example(data={"id": "g", "name": "graph", "entry_point": "A", "nodes": [
    {"id": "A", "type": "human", "human_config": {"title": "", "description": ""}}],
    "edges": ""}, pairs=[], as_json=False)
def test_a_dry_run_records_nothing(home: Path, data: Any, pairs: list[str],
                                   as_json: bool) -> None:
    path = as_file(data, home, "json")
    before = events(home / ".saga")
    argv = ["run", str(path), "--dry-run", *[a for p in pairs for a in ("-i", p)]]
    result = invoke(home, argv + (["--json"] if as_json else []))
    clean(result)
    assert result.exit_code in (0, 2)
    assert result.exit_code == api_says(path, pairs), result.output[-800:]
    assert events(home / ".saga") == before


@FUZZ
@given(data=valid_composition() | composition() | graph_composition(), pairs=input_pairs)
# A lone surrogate (JSON writes "\ud800") passed validation, then the run's first event
# could not be encoded: exit 1 from the catch-all. Now refused up front, like a NUL.
@example(data={"name": "s", "steps": [{"id": "A", "tool": "echo",
                                       "args": {"x": {"\ud800": None}}}]}, pairs=[])
@example(data={"name": "s", "steps": [{"id": "A", "tool": "echo", "args": {"x": "\ud800"}}]},
         pairs=[])
@example(data={"name": "s", "steps": [{"id": "A", "tool": "noop"}]}, pairs=["q=\ud800"])
# A broken loop failed its step and, in the same decision, started an independent step
# under fail_fast: replay found the divergence (and crashed comparing it, exit 1).
@example(data={"name": "loop", "max_concurrency": 1, "steps": [
    {"id": "D", "compute": "result = 1", "depends_on": []},
    {"id": "A", "tool": "fail", "args": {}, "loop": [None], "timeout": 0.5},
    {"id": "B", "compute": "result = 1"}]}, pairs=[])
# Iterations that cannot render and another step's completion, decided together.
@example(data={"name": "loop2", "steps": [
    {"id": "C", "tool": "fail", "args": {"x": ["{{ inputs.x }}"]}, "loop": "{{ [1, 2] }}",
     "depends_on": []},
    {"id": "D", "tool": "echo", "loop": []}]}, pairs=[])
def test_a_run_is_recorded_whole_or_not_at_all(home: Path, data: Any,
                                               pairs: list[str]) -> None:
    steps = data.get("steps") if isinstance(data, dict) else None
    assume(not (isinstance(steps, list) and any(
        isinstance(s, dict) and isinstance(s.get("tool"), str) and s["tool"] not in SAFE_TOOLS
        for s in steps)))
    path = as_file(data, home, "json")
    before = events(home / ".saga")
    argv = ["run", str(path), "--json", *[a for p in pairs for a in ("-i", p)]]
    result = invoke(home, argv)
    clean(result)
    event(f"exit {result.exit_code}")
    expected = api_says(path, pairs)
    if expected == 2 or result.exit_code == 2:
        assert result.exit_code == expected == 2, result.output[-800:]
        assert events(home / ".saga") == before  # rejected: nothing written
        return
    assert result.exit_code in (0, 1), result.output[-800:]
    summary = json.loads(result.output)
    assert events(home / ".saga") > before
    with Saga(Settings(home=home / ".saga", actor="fuzz")) as saga:
        assert saga.verify(summary["run_id"]) is None


ARGS = ["--json", "--help", "-h", "--dry-run", "--validate-only", "--verify", "--all",
        "--input", "-i", "--inputs-file", "--id", "--label", "--actor", "--mode", "eco",
        "normal", "--limit", "-1", "0", "--status", "--since", "--at", "--format", "dot",
        "mermaid", "md", "csv", "--data", "--reason", "--definition", "--file", "--head",
        "--comment", "--tools", "x=1", "=", "a", "quickstart", "🚀", "\x00", "",
        "3f1e2d4c-0000-4000-8000-000000000000", "--", "-", "--debug"]
COMMANDS = ["validate", "run", "submit", "status", "history", "list", "graph", "tools",
            "templates", "replay", "approve", "reject", "signal", "pause", "unpause", "cancel",
            "retry", "compensate", "export", "audit", "report", "nope", ""]


@FUZZ
@given(argv=st.lists(st.one_of(st.sampled_from(ARGS), text), max_size=6),
       command=st.sampled_from(COMMANDS), sub=st.sampled_from(["", "list", "show", "verify"]))
@example(argv=["\x00"], command="validate", sub="")  # was: ValueError from os.stat, exit 1
@example(argv=["\ud800"], command="run", sub="")  # was: UnicodeEncodeError, exit 1
@example(argv=["a" * 300], command="validate", sub="")  # was: OSError (name too long), exit 1
@example(argv=["a" * 300], command="graph", sub="")  # the same, exit 1
@example(argv=["--since", "--json"], command="list", sub="")  # was: ValueError, exit 1
@example(argv=["\ud800"], command="export", sub="")  # was: UnicodeEncodeError, exit 1
@example(argv=["\ud800\ud800\ud800\ud800"], command="status", sub="")  # UnicodeEncodeError
def test_any_command_line_gets_a_documented_answer(home: Path, argv: list[str], command: str,
                                                   sub: str) -> None:
    line = [command, *([sub] if sub and command in ("templates", "audit") else []), *argv]
    if "--debug" in line:
        return  # tracebacks on purpose
    if command in ("run", "templates") and "--dry-run" not in line:
        line.append("--validate-only")  # a run of a template may touch files or network
    before = events(home / ".saga")
    result = invoke(home, line)
    clean(result)
    event(f"exit {result.exit_code}")
    if result.exit_code in (2, 3, 4, 6):
        assert events(home / ".saga") == before, line


def _can_be_argv(arg: str) -> bool:
    """Whether a process can be given ``arg`` at all: a lone surrogate other than the
    ones that stand for undecodable bytes has no bytes to pass (in-process tests still
    try it)."""
    try:
        os.fsencode(arg)
    except UnicodeEncodeError:
        return False
    return True


@settings(max_examples=4, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=composition(),
       pairs=input_pairs.filter(lambda pairs: all(_can_be_argv(p) for p in pairs)),
       command=st.sampled_from(["validate", "run"]))
@example(data={"name": "fuzz", "nodes": [], "edges": []}, pairs=[], command="validate")
def test_real_processes_exit_with_one_line(tmp_path: Path, data: Any, pairs: list[str],
                                           command: str) -> None:
    path = as_file(data, tmp_path, "json")
    argv = [sys.executable, "-m", "saga", command, str(path),
            *([a for p in pairs for a in ("-i", p)] if command == "run" else []),
            *(["--dry-run"] if command == "run" else [])]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env |= {"SAGA_HOME": str(tmp_path / ".saga"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60, errors="replace")
    assert proc.returncode in (0, 2), proc.stderr
    assert "Traceback" not in proc.stderr and "run with --debug" not in proc.stderr
    lines = proc.stderr.splitlines()
    listed = re.match(r"error: .* is invalid for (\d+) reasons:$", lines[0]) if lines else None
    if listed:  # a validation error lists every problem, one indented line each
        assert len(lines) == 1 + int(listed[1]), proc.stderr
        assert all(line.startswith("  ") for line in lines[1:]), proc.stderr
    else:
        assert len(lines) <= 1, proc.stderr
    assert events(tmp_path / ".saga") == 0
