"""Templates, conditions and compute blocks: results, errors, references and the sandbox."""

from __future__ import annotations

import copy
import os
import subprocess
from typing import Any

import pytest

from saga.errors import ExpressionError
from saga.expressions import (
    check_compute,
    check_expression,
    check_template,
    compute_references,
    evaluate,
    expression_references,
    is_template,
    references,
    render,
    run_compute,
)

PODS = [
    {"name": "api-1", "status": "Running"},
    {"name": "api-2", "status": "CrashLoopBackOff"},
    {"name": "db-1", "status": "Running"},
    {"name": "worker-1", "status": "Pending"},
]


def namespace() -> dict[str, Any]:
    """A fresh namespace shaped like the executor's."""
    return {
        "inputs": {"issue_key": "PROJ-42", "branch_prefix": "feature", "count": 3},
        "input": {"query": "x"},
        "context": {"user": "ana"},
        "steps": {"search": {"content": "found it", "hits": 2}},
        "search_results": {"content": {"items": [1, 2]}, "total": 2},
        "issue_data": {
            "type": "Bug",
            "summary": "Fix Login/Logout flow for SSO users on the mobile app",
            "fields": {"customfield_123": 7},
        },
        "summary": "Add Retry Button",
        "branch_name": "feature/x",
        "pods": copy.deepcopy(PODS),
        "pod_analysis": {"unhealthy_count": 2, "healthy_count": 2},
        "check_existing_branch": None,
        "create_branch": "❌ failed: network timeout talking to git",
        "failure_info": {"needs_vpn": True},
        "status": "running",
        "health": {"ready": True},
        "error": "fatal: not a repository",
        "nothing": None,
        "flag": False,
        "n": 5,
        "names": ["a", "b"],
    }


# -- render ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("template", "expected"), [
    ("{{input.query}}", "x"),
    ("{{search_results.content}}", {"items": [1, 2]}),
    ("{{ inputs.issue_key }}", "PROJ-42"),
    ("{{ issue_data.fields.customfield_123 }}", 7),
    ("{{ namespace | default('default') }}", "default"),
    ("{{ summary | lower | replace(' ', '-') }}", "add-retry-button"),
    ("Create branch {{ branch_name }}?", "Create branch feature/x?"),
    ("{{ steps.search }}", {"content": "found it", "hits": 2}),
])
def test_render_seed_examples(template: str, expected: Any) -> None:
    assert render(template, namespace()) == expected


@pytest.mark.parametrize(("template", "expected"), [
    ("{{ steps.search }}", {"content": "found it", "hits": 2}),
    ("{{ inputs.count }}", 3),
    ("  {{ inputs.count + 1 }}\n", 4),
    ("{{ names }}", ["a", "b"]),
    ("{{ nothing }}", None),
    ("{{ flag }}", False),
    ("{{ health.ready }}", True),
    ("{{- inputs.count -}}", 3),
    ("{{ {'a': {'b': 1}} }}", {"a": {"b": 1}}),
])
def test_whole_value_templates_keep_their_type(template: str, expected: Any) -> None:
    result = render(template, namespace())
    assert result == expected
    assert type(result) is type(expected)


def test_whole_value_template_returns_the_dict_itself() -> None:
    ns = namespace()
    assert render("{{ steps.search }}", ns) is ns["steps"]["search"]


@pytest.mark.parametrize(("template", "expected"), [
    ("{{ inputs.count }} pods", "3 pods"),
    ("{{ names[0] }}{{ names[1] }}", "ab"),
    ("{{ inputs.count }} {{ flag }}", "3 False"),
    ("{% if flag %}yes{% else %}no{% endif %}", "no"),
    ("{% for p in pods %}{{ p.name }},{% endfor %}", "api-1,api-2,db-1,worker-1,"),
    ("line {{ n }}\n", "line 5\n"),
])
def test_mixed_templates_render_to_strings(template: str, expected: str) -> None:
    assert render(template, namespace()) == expected


@pytest.mark.parametrize(("template", "expected"), [
    ("{{ names | json }}", '["a", "b"]'),
    ("{{ '{\"a\": [1]}' | fromjson }}", {"a": [1]}),
    ("{{ names | tojson }}", '["a", "b"]'),
    ("{{ summary | upper }}", "ADD RETRY BUTTON"),
    ("{{ '  pad  ' | trim }}", "pad"),
    ("{{ '12' | int + 1 }}", 13),
    ("{{ n | string }}", "5"),
    ("{{ names | join('+') }}", "a+b"),
    ("{{ pods | length }}", 4),
    ("{{ inputs.missing | default('fallback') }}", "fallback"),
    ("{{ range(3) | list }}", [0, 1, 2]),
    ("{{ dict(a=1) }}", {"a": 1}),
    ("{{ search_results.items }}", None),
])
def test_filters_and_globals(template: str, expected: Any) -> None:
    ns = namespace()
    ns["search_results"]["items"] = None  # a key named like a dict method wins over it
    result = render(template, ns)
    assert result == expected
    assert type(result) is type(expected)


def test_render_recurses_into_dicts_lists_and_keys() -> None:
    value = {
        "query": "{{ input.query }}",
        "{{ inputs.issue_key }}": ["{{ inputs.count }}", "literal", 4, None, {"x": "{{ flag }}"}],
        "plain": "no templates here }}",
        7: True,
    }
    assert render(value, namespace()) == {
        "query": "x",
        "PROJ-42": [3, "literal", 4, None, {"x": False}],
        "plain": "no templates here }}",
        7: True,
    }


def test_render_leaves_non_templates_alone() -> None:
    for value in ("plain", "", 3, 2.5, None, True):
        assert render(value, {}) == value
    assert is_template("a {{ b }}") and is_template("{% if x %}{% endif %}")
    assert not is_template("a { b }") and not is_template("{#}")


@pytest.mark.parametrize(("template", "fragment"), [
    ("{{ nope }}", "'nope' is undefined in template '{{ nope }}'"),
    ("{{ inputs.missing }}", "'missing'"),
    ("{{ inputs.missing.deeper }}", "'missing'"),
    ("Hello {{ nope }}", "'nope' is undefined in template 'Hello {{ nope }}'"),
    ("{{ [nope] }}", "'nope' is undefined"),
])
def test_strict_undefined_names_the_reference(template: str, fragment: str) -> None:
    with pytest.raises(ExpressionError) as info:
        render(template, namespace())
    assert fragment in str(info.value)
    assert info.value.expression == template


@pytest.mark.parametrize("template", ["{{ x. }}", "{{ 1 + }}", "{% if %}", "a {{ b", "{% for x %}"])
def test_template_syntax_errors(template: str) -> None:
    with pytest.raises(ExpressionError, match="invalid template"):
        render(template, namespace())
    assert check_template({"k": [template]})


def test_template_runtime_errors_become_expression_errors() -> None:
    with pytest.raises(ExpressionError, match="ZeroDivisionError"):
        render("{{ 1 / 0 }}", {})
    with pytest.raises(ExpressionError, match="JSONDecodeError"):
        render("{{ 'not json' | fromjson }}", {})


# -- evaluate -------------------------------------------------------------------------------


@pytest.mark.parametrize(("condition", "expected"), [
    ("not check_existing_branch or '✅' not in str(check_existing_branch)", True),
    ("create_branch and '❌' in str(create_branch)", True),
    ("failure_info and failure_info.get('needs_vpn')", True),
    ("pod_analysis.unhealthy_count > 0", True),
    ("pods and len(pods) > 0", True),
    ("status == 'running' and health.ready", True),
    ("not (error and 'fatal' in error)", False),
    ("nothing is None and flag is not True", True),
    ("1 < n <= 5 < 6", True),
    ("1 < n < 3", False),
    ("flag or nothing", None),
    ("names or 'x'", ["a", "b"]),
    ("'yes' if n % 2 else 'no'", "yes"),
    ("inputs['issue_key'].split('-')[1]", "42"),
    ("names[::-1]", ["b", "a"]),
    ("{'a': 1, **failure_info}", {"a": 1, "needs_vpn": True}),
    ("[*names, 'c']", ["a", "b", "c"]),
    ("-n ** 2 // 3 + (7 % 4) - ~1", -4),
    ("max(*[1, 5, 2]) + min([3, 4]) + sum(range(4)) + abs(-1)", 15),
    ("sorted(['b', 'c', 'a'], reverse=True)", ["c", "b", "a"]),
    ("list(zip(names, range(2)))", [("a", 0), ("b", 1)]),
    ("dict(enumerate(names))", {0: "a", 1: "b"}),
    ("list(reversed(names))", ["b", "a"]),
    ("round(2.567, 1)", 2.6),
    ("any(p.get('status') == 'Pending' for p in pods)", True),
    ("all(p['name'] for p in pods)", True),
    ("search_results.content.get('missing', 'dflt')", "dflt"),
    ("list(steps.search.keys())", ["content", "hits"]),
    ("'abc'.upper().center(7, '*')", "**ABC**"),
    ("{1, 2} | {3}", {1, 2, 3}),
    ("len(str) if False else 1", 1),
])
def test_conditions(condition: str, expected: Any) -> None:
    assert evaluate(condition, namespace()) == expected


def test_conditions_drive_truthiness() -> None:
    ns = namespace()
    assert bool(evaluate("pods and len(pods) > 0", {**ns, "pods": []})) is False
    assert bool(evaluate("failure_info and failure_info.get('needs_vpn')",
                         {**ns, "failure_info": {}})) is False
    assert evaluate("not check_existing_branch or '✅' not in str(check_existing_branch)",
                    {**ns, "check_existing_branch": "✅ exists"}) is False


def test_evaluate_whole_template_and_non_strings() -> None:
    assert evaluate("{{ inputs.count > 2 }}", namespace()) is True
    assert evaluate("  {{ steps.search }} ", namespace()) == {"content": "found it", "hits": 2}
    assert evaluate(True, {}) is True


def test_user_names_shadow_builtins() -> None:
    assert evaluate("len + 1", {"len": 41}) == 42


@pytest.mark.parametrize(("condition", "message"), [
    ("x > 1", "name 'x' is not defined in 'x > 1'"),
    ("inputs.nope", "no key or attribute 'nope'"),
    ("inputs.nope.deeper", "no key or attribute 'nope'"),
    ("1 / 0", "ZeroDivisionError: division by zero in '1 / 0'"),
    ("n + 1 / 0", "ZeroDivisionError: division by zero at '1 / 0'"),
    ("inputs['nope']", "KeyError"),
    ("names[9]", "IndexError"),
    ("int('x')", "ValueError"),
    ("names + 1", "TypeError"),
    ("n.real", "attribute 'real' of a int is not allowed"),
    ("names.nope", "attribute 'nope' of a list is not allowed"),
    ("1 @ 2", "the @ operator is not allowed"),
    ("x := 1", "syntax error"),
    ("(y := 1)", "assignment expression"),
    ("a b", "syntax error"),
    ("n()", "calling a int is not allowed"),
    ("sum([[1], [2]], [])", "sum() only adds numbers"),
    ("'%s' % n", "%-formatting"),
    ("1j", "constant 1j is not allowed"),
])
def test_condition_errors(condition: str, message: str) -> None:
    with pytest.raises(ExpressionError) as info:
        evaluate(condition, namespace())
    assert message in str(info.value)


def test_dict_attribute_prefers_keys_and_get_works_for_missing() -> None:
    ns = {"d": {"get": "key wins", "x": 1}, "e": {"x": 1}}
    assert evaluate("d.get", ns) == "key wins"
    assert evaluate("e.get('y', 2) + e.x", ns) == 3
    assert evaluate("e.get('y') is None", ns) is True


# -- run_compute ----------------------------------------------------------------------------

BRANCH_NAME = """
issue_type = issue_data.get("type", "task").lower()
summary = issue_data.get("summary", "work")[:40]
slug = summary.lower().replace(" ", "-").replace("/", "-")
result = f"{inputs.branch_prefix}/{inputs.issue_key}-{slug}"
"""

POD_HEALTH = """\
  healthy = [p for p in pods if p.get("status") == "Running"]
  unhealthy = [p for p in pods if p.get("status") != "Running"]
  result = {
    "healthy_count": len(healthy),
    "unhealthy_count": len(unhealthy),
    "unhealthy_pods": [p["name"] for p in unhealthy]
  }
"""

FAILURE_INFO = """
error_text = str(create_branch)[:300].lower()
result = {
  "needs_vpn": any(x in error_text for x in ['no route', 'timeout', 'network']),
  "needs_auth": any(x in error_text for x in ['unauthorized', '401', 'forbidden']),
}
"""


def test_compute_seed_examples() -> None:
    ns = namespace()
    expected_branch = "feature/PROJ-42-fix-login-logout-flow-for-sso-users-on-t"
    assert run_compute(BRANCH_NAME, ns) == expected_branch
    assert run_compute(POD_HEALTH, ns) == {
        "healthy_count": 2, "unhealthy_count": 2, "unhealthy_pods": ["api-2", "worker-1"]}
    assert run_compute(FAILURE_INFO, ns) == {"needs_vpn": True, "needs_auth": False}
    assert ns == namespace()


def test_compute_statements() -> None:
    code = """
    total = 0
    seen = {}
    first, (second, third) = 1, [2, 3]
    for i, name in enumerate(["a", "b", "c", "d", "e"]):
        if i == 1:
            continue
        elif i == 4:
            break
        else:
            pass
        total += i
        seen[name] = i
    else:
        total = -1
    for x in []:
        pass
    else:
        seen["empty"] = True
    items: list = [3, 1, 2]
    items.sort(reverse=True)
    items.append(0)
    items[0] *= 10
    count: int
    result = (total, seen, first + second + third, items)
    """
    assert run_compute(code, {}) == (5, {"a": 0, "c": 2, "d": 3, "empty": True}, 6, [30, 2, 1, 0])


def test_comprehension_scoping() -> None:
    code = """
    x = "outer"
    pairs = [(x, y) for x in range(3) if x for y in "ab" if y != "b"]
    lookup = {k: v for k, v in [("a", 1), ("b", 2)]}
    unique = {c.lower() for c in "AaBb"}
    total = sum(v * 2 for v in lookup.values())
    result = (x, pairs, lookup, sorted(unique), total)
    """
    assert run_compute(code, {}) == ("outer", [(1, "a"), (2, "a")], {"a": 1, "b": 2},
                                     ["a", "b"], 6)
    with pytest.raises(ExpressionError, match="name 'k' is not defined"):
        run_compute("d = {k: 1 for k in 'ab'}\nresult = k", {})


def test_generator_short_circuits() -> None:
    # any() stops at the first match, so the item without a "name" key is never read
    items = [{"name": "a"}, {"other": 1}]
    assert evaluate("any(i['name'] == 'a' for i in items)", {"items": items}) is True


@pytest.mark.parametrize(("code", "expected"), [
    ("result = f'{n:03d}|{2.5:.2f}|{\"s\":>4}|{nothing}|{names!r}|{flag}'",
     "005|2.50|   s|None|['a', 'b']|False"),
    ("width = 6\nresult = f'{n:>{width}}'", "     5"),
    ("result = f'{inputs.issue_key.lower()}-{len(pods)}'", "proj-42-4"),
])
def test_f_strings(code: str, expected: str) -> None:
    assert run_compute(code, namespace()) == expected


@pytest.mark.parametrize(("code", "message"), [
    ("result = f'{names:>5}'", "only allowed on numbers"),
    ("result = f'{n:>99999999}'", "too wide"),
    ("result = f'{n:{inputs.__class__}}'", "'__class__' is not allowed"),
])
def test_f_string_refusals(code: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message):
        run_compute(code, namespace())


def test_compute_never_mutates_the_namespace() -> None:
    ns = namespace()
    code = """
    pods.append(1)
    pods[0]["status"] = "Dead"
    inputs["issue_key"] = "HACKED"
    inputs.get("issue_key")
    search_results.content["items"].extend([3, 4])
    alias = names
    alias.append("c")
    result = [len(pods), inputs.issue_key, names]
    """
    assert run_compute(code, ns) == [5, "HACKED", ["a", "b", "c"]]
    assert ns == namespace()
    assert evaluate("pods.append(1) or len(pods)", ns) == 5
    assert ns["pods"] == PODS


def test_compute_without_result_and_error_locations() -> None:
    with pytest.raises(ExpressionError, match="did not assign 'result'"):
        run_compute("x = 1\n", {})
    with pytest.raises(ExpressionError) as info:
        run_compute("a = 1\nb = missing + 1\nresult = b", {})
    assert "name 'missing' is not defined on line 2: 'b = missing + 1'" in str(info.value)
    with pytest.raises(ExpressionError, match="expected 2 values to unpack"):
        run_compute("a, b = [1, 2, 3]\nresult = a", {})
    with pytest.raises(ExpressionError, match="assigning to Attribute is not allowed"):
        run_compute("d = {}\nd.x = 1\nresult = d", {})
    with pytest.raises(ExpressionError, match="cannot assign items of a str"):
        run_compute("s = 'ab'\ns[0] = 'c'\nresult = s", {})


def test_results_must_be_plain_data() -> None:
    with pytest.raises(ExpressionError, match="the compute block's result evaluated to a "):
        run_compute("result = reversed([1])", {})
    with pytest.raises(ExpressionError, match=r"condition '.*' evaluated to a generator"):
        evaluate("(x for x in [1])", {})
    with pytest.raises(ExpressionError, match="not plain data"):
        run_compute("result = {'f': len}", {})
    assert run_compute("result = list(reversed([1, 2]))", {}) == [2, 1]


def test_step_budget() -> None:
    code = "result = [a * b for a in range(100) for b in range(100)]"
    assert len(run_compute(code, {})) == 10_000
    with pytest.raises(ExpressionError, match="more than its step budget"):
        run_compute(code, {}, max_steps=5_000)
    with pytest.raises(ExpressionError, match="step budget"):
        evaluate("[x for x in range(1000)]", {}, max_steps=100)


@pytest.mark.parametrize("code", [
    "result = 2 ** 20000 ** 1",
    "result = 'ab' * 600000",
    "s = 'x' * 1000000\nfor i in range(10):\n    s = s + s\nresult = len(s)",
    "x = 2 ** 10000\nresult = x * x * x * x * x * x * x * x * x * x * x",
    "result = 1 << 10001",
    "result = 'a'.center(10 ** 9)",
    "s = 'x' * 1000000\nresult = s.replace('', s)",
    "s = ['x'] * 1000000\nresult = ('y' * 100).join(s)",
    "s = list(range(100000))\nfor i in range(10):\n    s.extend(s)\nresult = 1",
    "big = list(range(100000))\nresult = [big] * 100",
    "big = list(range(100000))\nx = [big for _ in range(20)]\nresult = len(str(x))",
    "big = list(range(100000))\nx = [big for _ in range(20)]\nresult = f'{x!r}'",
    "big = list(range(100000))\nresult = [big for _ in range(20)]",
])
def test_growth_is_bounded(code: str) -> None:
    with pytest.raises(ExpressionError, match=r"too large|not allowed|more than 1000000 nested"):
        run_compute(code, {})


def test_control_flow_and_nesting_errors() -> None:
    with pytest.raises(ExpressionError, match="outside a loop"):
        run_compute("break\nresult = 1", {})
    with pytest.raises(ExpressionError, match="outside a loop"):
        run_compute("if True:\n    continue\nresult = 1", {})
    with pytest.raises(ExpressionError, match="nested too deeply"):
        evaluate("1" + " + 1" * 50_000, {})
    with pytest.raises(ExpressionError, match="nested too deeply"):
        evaluate("not " * 2_000 + "x", {"x": 1})


# -- references and static checks -----------------------------------------------------------


def test_references() -> None:
    value = {
        "{{ key_name }}": ["{{ steps.search.content }}", "plain", 3],
        "q": "{% for p in pods %}{{ p.name }}{{ loop.index }}{% endfor %}{{ range(2) }}",
        "n": "{{ missing | default(inputs.x) }}",
    }
    assert references(value) == {"key_name", "steps", "pods", "missing", "inputs"}
    assert references("no templates") == set()
    with pytest.raises(ExpressionError):
        references("{{ x. }}")


def test_expression_references() -> None:
    assert expression_references("a.b > 0 and len(c) and [x for x in d if x] and e['f']") == {
        "a", "c", "d", "e"}
    assert expression_references("{{ steps.search.hits > inputs.n }}") == {"steps", "inputs"}
    with pytest.raises(ExpressionError, match="syntax error"):
        expression_references("a b")


def test_compute_references() -> None:
    code = """
    summary = summary.lower()
    words = [w for w in summary.split() if w not in stop]
    total = 0
    total += offset
    counter += 1
    for i in items:
        total += i
    result = {k: v for k, v in lookup.items()} if words else sorted(total_list)
    """
    assert compute_references(code) == {"summary", "stop", "offset", "counter", "items",
                                        "lookup", "total_list"}
    assert compute_references(BRANCH_NAME) == {"issue_data", "inputs"}
    with pytest.raises(ExpressionError, match="syntax error"):
        compute_references("x = = 1")


def test_static_checks() -> None:
    assert check_expression("a and b.get('c')") == []
    assert check_expression("{{ a.b }}") == []
    assert check_compute(POD_HEALTH) == []
    assert check_compute(BRANCH_NAME) == []
    assert check_template({"a": ["{{ x }}", "text"], "{{ y }}": 1}) == []
    assert check_expression("a b")[0].startswith("syntax error")
    assert check_expression("lambda: 1") == ["lambda is not allowed (line 1)"]
    assert check_expression("x._y") == [
        "attribute '_y' is not allowed (names starting with '_' are private) (line 1)"]
    only = "(a compute block may import datetime, json, math, re)"
    assert check_compute("import os\nfrom os import path\nwhile x:\n    pass\n") == [
        f"import of 'os' is not allowed {only} (line 1)",
        f"import of 'os' is not allowed {only} (line 2)",
        "a while loop (unbounded) is not allowed (line 3)"]
    assert check_compute("from json import dumps as d\nimport math\nresult = d(math.pi)") == []
    assert check_compute("from json import load") == [
        "json has no 'load' a compute block may use (line 1)"]
    assert check_compute("from . import x") == [
        "only 'from MODULE import NAME' imports are allowed (line 1)"]
    problems = check_compute("def f():\n    pass\nclass C: pass\ntry:\n    x = 1\nexcept E:\n"
                             "    raise\nwith a: pass\ndel x\nglobal g\n")
    assert [p.split(" is not allowed")[0] for p in problems] == [
        "a function definition", "a class definition", "try", "with", "del", "global"]
    assert check_template("{{ ''.__class__ }}") == [
        "attribute '__class__' is not allowed in template \"{{ ''.__class__ }}\""]
    assert check_template(["{{ x. }}"])[0].startswith("invalid template")


# -- the sandbox ----------------------------------------------------------------------------

ESCAPE_EXPRESSIONS = [
    "().__class__.__bases__[0].__subclasses__()",
    "__import__('os').system('true')",
    "getattr(inputs, '__class__')",
    "eval('1+1')",
    "exec('x=1')",
    "open('/etc/passwd').read()",
    "type(1)",
    "[].__class__",
    "'{0.__class__}'.format(1)",
    "'{x}'.format_map(inputs)",
    'f"{inputs.__class__}"',
    "(lambda: 1)()",
    "9 ** 9 ** 9",
    "'a' * 10 ** 9",
    "[1] * 10 ** 8",
    "list(range(10**9))",
    "inputs._private",
    "compile('1','f','eval')",
    "globals()",
    "vars()",
    "dir()",
    "str.lower",
    "len.__self__",
    "'x'.encode()",
    "'x'.lower.__self__",
    "sorted([], key=len)",
    "max([[1], [2]], key=names.extend)",
]
ESCAPE_COMPUTE = [
    "import os\nresult = 1",
    "from os import system\nresult = 1",
    "while True:\n    pass\nresult = 1",
    "def f():\n    return 1\nresult = f()",
    "class A:\n    pass\nresult = 1",
    "result = [x for x in range(10) for y in range(10) for z in range(10)]",  # budget: 100
    "__builtins__ = 1\nresult = 1",
    "result = pods.__class__",
]
ESCAPE_TEMPLATES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ self.__init__.__globals__ }}",
    "{{ ''.format.__globals__ }}",
    "{{ ''.format }}",
    "{{ config }}",
    "{{ names.append(1) }}",
    "{{ 'a' * 10 ** 9 }}",
    "{{ range(10 ** 9) | list }}",
    "{{ '%99999999s' % 1 }}",
    "{{ joiner() }}",
    "{{ namespace(a=1) }}",
]


@pytest.fixture
def no_side_effects(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any escape that reaches the OS fail the test loudly (not as ExpressionError)."""
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("sandbox escape executed code")
    monkeypatch.setattr(os, "system", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr("builtins.open", forbidden)


@pytest.mark.usefixtures("no_side_effects")
@pytest.mark.parametrize("expression", ESCAPE_EXPRESSIONS)
def test_expression_escapes_are_refused(expression: str) -> None:
    ns = namespace()
    with pytest.raises(ExpressionError):
        evaluate(expression, ns)
    with pytest.raises(ExpressionError):
        run_compute(f"result = {expression}", ns)
    assert ns == namespace()


@pytest.mark.usefixtures("no_side_effects")
@pytest.mark.parametrize("code", ESCAPE_COMPUTE)
def test_compute_escapes_are_refused(code: str) -> None:
    with pytest.raises(ExpressionError):
        run_compute(code, namespace(), max_steps=100)


@pytest.mark.usefixtures("no_side_effects")
@pytest.mark.parametrize("template", ESCAPE_TEMPLATES)
def test_template_escapes_are_refused(template: str) -> None:
    ns = namespace()
    with pytest.raises(ExpressionError):
        render(template, ns)
    with pytest.raises(ExpressionError):
        render(f"text {template} text", ns)
    assert ns == namespace()
