"""Hostile templates, conditions and compute blocks end in bounded time and memory, each
refused (ExpressionError) or stopped at a limit (ExpressionLimit): never a hung worker."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from saga import Saga
from saga.errors import ExpressionError, ExpressionLimit
from saga.expressions import DEFAULT_SECONDS, configure, render, run_compute


@pytest.fixture(autouse=True)
def short_budget() -> Iterator[None]:
    configure(0.5)
    yield
    configure(DEFAULT_SECONDS)


COMPUTE = [
    "result = 'a' * 10**9",
    "result = f'{1:>{10**6}}'",
    "result = sum(range(10**9))",
    "result = 10**10**6",
    "l = [0]\nfor i in range(40):\n    l = l + l\nresult = len(l)",
    "result = ','.join(['x' * 9999] * 9999)",
    "c = 0\nfor i in range(3000):\n    for j in range(3000):\n        c += 1\nresult = c",
    "x = []\nfor i in range(100000):\n    x = sorted(range(20000), reverse=True)\nresult = 1",
    "result = [[0] * 100000 for i in range(100000)]",
    "result = 'ab'.replace('a', 'a' * 10**7)",
    "result = 'a'.ljust(10**9)",
    "result = 'a'.center(10**9)",
    "result = 'a'.zfill(10**9)",
    "result = str(10**100000)",
    "d = {}\nfor i in range(10**7):\n    d[i] = i\nresult = 1",
    "result = [i for i in range(10**6) for j in range(10**6)]",
    "result = list(range(10**8))",
    "result = '{:>999999999}'.format(1)",
    "while True:\n    pass",
    "import os\nresult = 1",
    "result = ().__class__.__bases__[0].__subclasses__()",
    "result = (lambda: 1)()",
]
TEMPLATES = [
    "{{ 'a' * 10**9 }}",
    "{{ 'a' | center(10**9) }}",
    "{{ 'a' | indent(10**8) }}",
    "{{ 'a' | truncate(10**9) }}{{ 'b' * 10**8 }}",
    "{% for i in range(3000) %}{% for j in range(3000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
    "{% for i in range(10**7) %}{{ i }}{% endfor %}",
    "{{ '%999999999d' % 1 }}",
    "{{ range(10**9) | list }}",
    "{{ 10 ** (10 ** 6) }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ [0] * 10**8 }}",
    "{% for i in range(100000) %}{{ range(20000) | sort | list | length }}{% endfor %}",
    "{{ ('a' * 999999) | replace('a', 'aaaaaaaaaaaa') }}",
    "{{ ('a' * 999999) | join(('b' * 99)) }}",
    "{{ 'x' | format() * 10**9 }}",
    "{{ cycler }}",
    "{{ namespace(a=1) }}",
]


@pytest.mark.parametrize("code", COMPUTE)
def test_hostile_compute_is_refused_or_limited(code: str) -> None:
    started = time.monotonic()
    with pytest.raises(ExpressionError):
        run_compute(code, {})
    assert time.monotonic() - started < 10  # a hang is the defect; the budget is 0.5 s


@pytest.mark.parametrize("template", TEMPLATES)
def test_hostile_templates_are_refused_or_limited(template: str) -> None:
    started = time.monotonic()
    with pytest.raises(ExpressionError):
        render(template, {})
    assert time.monotonic() - started < 10


def test_a_cpu_burner_stops_at_the_wall_clock_budget() -> None:
    code = "x = 0\nfor i in range(100000):\n    x = sorted(range(20000), reverse=True)\nresult = 1"
    with pytest.raises(ExpressionLimit, match="expression_seconds"):
        run_compute(code, {})


def test_a_step_fails_with_expression_limit_and_the_worker_goes_on(lite: Saga) -> None:
    flow = {"name": "burn", "steps": [
        {"id": "burn", "compute": "x = 0\nfor i in range(100000):\n"
                                  "    x = sorted(range(20000), reverse=True)\nresult = 1"},
        {"id": "after", "tool": "noop"}]}
    run = lite.run(lite.load(flow))
    assert run.status == "failed"
    assert run.steps["burn"]["error"]["type"] == "ExpressionLimit"
    assert lite.run(lite.load({"name": "fine", "steps": [{"id": "a", "tool": "noop"}]})
                    ).status == "completed"


@pytest.mark.parametrize("template", [
    "{{ 'a' * 10**9 }}", "{{ 'a' | center(10**9) }}", "{{ 10 ** (10 ** 6) }}",
    "{{ [0] * 10**8 }}"])
def test_a_template_past_a_size_limit_is_an_expression_limit(template: str) -> None:
    with pytest.raises(ExpressionLimit, match="expression limit: "):
        render(template, {})


@pytest.mark.timeout(60)
def test_a_loop_with_an_empty_body_stops_at_the_budget() -> None:
    with pytest.raises(ExpressionLimit, match="expression_seconds"):
        render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
               "{% endfor %}", {})


def test_compute_past_a_size_limit_is_an_expression_limit() -> None:
    with pytest.raises(ExpressionLimit, match=r"expression limit: repetition would be too large"):
        run_compute("result = 'a' * 10**9", {})


@pytest.mark.timeout(30)
def test_a_steps_timeout_covers_its_templates(lite: Saga) -> None:
    """With a long expression budget, a step's own timeout stops a template that burns
    CPU while its parameters are rendered (without it, this test times out)."""
    configure(600)
    burner = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}"
              "{% endfor %}")
    run = lite.run(lite.load({"name": "burn", "steps": [
        {"id": "burn", "tool": "echo", "timeout": 0.5, "args": {"x": burner}}]}))
    assert run.status == "failed"
    assert run.steps["burn"]["error"]["type"] == "ExpressionLimit"


def test_the_size_limits_come_from_saga_toml(tmp_path: Any) -> None:
    from saga.config import load_settings

    (tmp_path / "saga.toml").write_text("[limits]\nmax_value_size = 5000\nmax_items = 2000\n",
                                        encoding="utf-8")
    settings = load_settings(cwd=tmp_path)
    assert (settings.expression_max_value_size, settings.expression_max_items) == (5000, 2000)
    try:
        configure(**settings.expression_limits())
        with pytest.raises(ExpressionLimit, match="too large"):
            render("{{ 'a' * 3000 }}", {})  # a repetition past max_items
        with pytest.raises(ExpressionLimit, match="max_value_size 5000"):
            render("{{ 'a' | center(6000) }}", {})
        assert render("{{ 'a' * 1500 }}", {}) == "a" * 1500
    finally:
        configure(DEFAULT_SECONDS, max_value_size=10_000_000, max_items=1_000_000)


@pytest.mark.timeout(30)
def test_a_macro_calling_itself_twice_stops_at_the_budget() -> None:
    """f(40) makes 2**40 calls: every macro call looks at the clock (it used to run on for
    a minute, pinning its worker)."""
    exponential = ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}"
                   "{% endmacro %}{{ f(40) }}")
    with pytest.raises(ExpressionLimit, match="expression_seconds"):
        render(exponential, {})


@pytest.mark.parametrize(("source", "refusal"), [
    ("{{ 'a'.ljust(10**9) }}", "ljust"),
    ("{{ 'a'['center'](10**9) }}", "center"),
    ("{{ '{0:>1000000000}'.format(1) }}", "too wide"),
    ("{{ '{0:>{1}}'.format(1, 10**9) }}", "width past"),
    ("{{ '{x:>1000000000}'.format_map({'x': 1}) }}", "too wide"),
    ("{{ 5 | round(-5000000) }}", "round"),
])
def test_sizes_are_checked_before_they_allocate(source: str, refusal: str) -> None:
    """Refused by the size check itself (before allocating a gigabyte, or raising 10 to a
    huge power), not later by the clock or the memory ceiling."""
    with pytest.raises(ExpressionLimit, match=refusal):
        render(source, {})
    assert render("{{ 'ab'.ljust(4) }}|{{ '{0:>3}'.format(1) }}|{{ 3.14159 | round(2) }}",
                  {}) == "ab  |  1|3.14"


def test_round_to_a_huge_precision_is_refused_at_once() -> None:
    with pytest.raises(ExpressionLimit, match="round"):
        run_compute("result = round(5, -1000000000)", {})
    assert run_compute("result = round(1234, -2)", {}) == 1200


def test_memory_error_in_evaluation_fails_the_step(lite: Saga, monkeypatch: Any) -> None:
    """Whatever runs out of memory inside an evaluation, the step fails with
    ExpressionLimit; the process goes on."""
    from saga.expressions import interpreter, jinja

    def exhausted(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(interpreter, "_format", exhausted)
    monkeypatch.setitem(jinja._ENV.filters, "upper", exhausted)
    jinja._text_template.cache_clear()
    jinja._native_expression.cache_clear()
    with pytest.raises(ExpressionLimit, match="memory"):
        render("{{ 'a' | upper }}", {})
    run = lite.run(lite.load({"name": "oom", "steps": [
        {"id": "f", "compute": "result = f'{1:>5}'"}]}))
    assert run.status == "failed" and run.steps["f"]["error"]["type"] == "ExpressionLimit"
