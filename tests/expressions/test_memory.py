"""The memory ceiling per evaluation (``[limits] max_memory``): many values, each under
the size caps, that together hold more than the ceiling stop the evaluation with
ExpressionLimit naming it; values made and dropped again do not count."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from saga import Saga
from saga.errors import ExpressionLimit
from saga.expressions import DEFAULT_SECONDS, configure, render, run_compute
from saga.expressions.limits import DEFAULT_MAX_MEMORY, held_bytes

ROOT = Path(__file__).resolve().parents[2]
#: Each holds far more than 64 MiB in values of 100 KB to 1 MB (under max_value_size).
COMPUTE = [
    "result = ['x' * 100000 + str(i) for i in range(10000)]",
    "result = len({i: 'y' * 100000 + str(i) for i in range(10000)})",
    "s = []\nfor i in range(10000):\n    s.append('z' * 100000 + str(i))\nresult = len(s)",
    "acc = []\nfor i in range(2000):\n    acc = acc + ['y' * 100000 + str(i)]\nresult = len(acc)",
    "keep = {}\nfor i in range(2000):\n    s = 'z' * 99999 + str(i)\n    keep[i] = s\nresult = 1",
    "result = len(list('q' * 100000 + str(i) for i in range(10000)))",
    "result = len(','.join('q' * 100000 + str(i) for i in range(10000)))",
    "result = [list(range(100000)) for i in range(1000)]",
    "keep = []\nfor i in range(1000):\n    a = ''\n    for j in range(10):\n"
    "        a += 'w' * 10000 + str(j)\n    keep.append(a)\nresult = 1",
]
TEMPLATES = [
    "{% macro f(x, n) %}{% if n %}{{ f(x + ['y' * 1000000 ~ n], n - 1) }}{% endif %}"
    "{% endmacro %}{{ f([], 150) }}",
    "{% macro f(n) %}{% set s = 'w' * 999999 ~ n %}{% if n %}{{ f(n - 1) }}{{ s | length }}"
    "{% endif %}{% endmacro %}{{ f(150) }}",
    "{% macro f(x, n) %}{% if n %}{{ f(x ~ 'a', n - 1) }}{% endif %}{% endmacro %}"
    "{{ f('x' * 900000 ~ 'x' * 900000, 200) }}",
]


@pytest.fixture(autouse=True)
def long_budget() -> Iterator[None]:
    """Enough time that the memory ceiling, not the clock, is what stops them."""
    configure(60)
    yield
    configure(DEFAULT_SECONDS, max_memory=DEFAULT_MAX_MEMORY)


@pytest.mark.parametrize("code", COMPUTE)
def test_compute_holding_more_than_the_ceiling_is_an_expression_limit(code: str) -> None:
    with pytest.raises(ExpressionLimit, match=r"memory: .*\[limits\] max_memory"):
        run_compute(code, {})


@pytest.mark.parametrize("template", TEMPLATES)
def test_a_template_holding_more_than_the_ceiling_is_an_expression_limit(template: str) -> None:
    with pytest.raises(ExpressionLimit, match=r"memory: .*\[limits\] max_memory"):
        render(template, {})


@pytest.mark.parametrize("code", [
    "for i in range(1000):\n    x = 'a' * 1000000\nresult = len(x)",
    "keep = ['k' * 1000000 + str(i) for i in range(40)]\nresult = len(keep)",
    "s = ''\nfor i in range(100):\n    s += 'a' * 100000\nresult = len(s)",
    "rows = [str(i) * 10 for i in range(100000)]\nn = 0\nfor i in range(300):\n"
    "    r = rows[i]\n    n += len(rows)\nresult = n",
])
def test_what_is_dropped_or_held_under_the_ceiling_does_not_count(code: str) -> None:
    assert isinstance(run_compute(code, {}), int)


def test_a_template_making_and_dropping_values_in_a_loop_renders() -> None:
    text = render("{% for i in range(300) %}{% set y = 'x' * 1000000 %}{{ y | length }}"
                  "{% endfor %}", {})
    assert text == "1000000" * 300


def test_the_namespace_a_template_reads_is_not_its_own() -> None:
    big = ["v" * 1000000 + str(i) for i in range(100)]  # 100 MiB given, not made
    assert render("{% for x in big %}{{ x | length }},{% endfor %}", {"big": big}) \
        == "1000001," * 10 + "1000002," * 90


def test_the_ceiling_is_configurable(tmp_path: Path) -> None:
    from saga.config import load_settings

    (tmp_path / "saga.toml").write_text('[limits]\nmax_memory = "8MiB"\n', encoding="utf-8")
    settings = load_settings(cwd=tmp_path)
    assert settings.expression_max_memory == 8 * 2**20
    configure(**settings.expression_limits())
    code = "keep = ['k' * 1000000 + str(i) for i in range(12)]\nresult = len(keep)"
    with pytest.raises(ExpressionLimit, match=r"ceiling of 8 MiB \(\[limits\] max_memory\)"):
        run_compute(code, {})
    configure(max_memory=DEFAULT_MAX_MEMORY)
    assert run_compute(code, {}) == 12


def test_a_ceiling_below_one_mib_is_refused() -> None:
    with pytest.raises(ValueError, match="max_memory"):
        configure(max_memory=1000)


def test_held_bytes_counts_shared_values_once() -> None:
    big = "b" * 1_000_000
    assert held_bytes([big] * 1000) < 1_100_000
    assert held_bytes([big + str(i) for i in range(10)]) > 10_000_000


def test_a_step_holding_too_much_fails_with_expression_limit(lite: Saga) -> None:
    run = lite.run(lite.load({"name": "hog", "steps": [
        {"id": "hog", "compute": COMPUTE[0]}, {"id": "after", "tool": "noop"}]}))
    assert run.status == "failed"
    assert run.steps["hog"]["error"]["type"] == "ExpressionLimit"
    assert "max_memory" in run.steps["hog"]["error"]["message"]


_PROBE = """
import json, resource, sys
from saga.errors import ExpressionLimit
from saga.expressions import configure, render, run_compute
configure(60)
resource.setrlimit(resource.RLIMIT_AS, (1536 * 2**20, 1536 * 2**20))
run_compute("result = [str(i) for i in range(1000)]", {})  # warm up
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
outcomes = []
for kind, source in json.loads(sys.argv[1]):
    try:
        run_compute(source, {}) if kind == "compute" else render(source, {})
        outcomes.append("completed")
    except ExpressionLimit as exc:
        outcomes.append("max_memory" if "max_memory" in str(exc) else str(exc))
grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"outcomes": outcomes, "grown_kib": grown}))
"""


def test_the_process_does_not_grow_past_the_ceiling() -> None:
    """In a process of its own (capped at 1.5 GiB, which any of these would pass without
    the ceiling), every hostile case stops at max_memory and the peak resident size grows
    by about the ceiling, not by what they would hold."""
    cases: list[Any] = [["compute", c] for c in COMPUTE] + [["template", t] for t in TEMPLATES]
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(cases)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True)
    report = json.loads(out.stdout)
    assert report["outcomes"] == ["max_memory"] * len(cases)
    assert report["grown_kib"] < 4 * DEFAULT_MAX_MEMORY // 1024


def test_the_documented_limits_table_loads_as_shown(tmp_path: Path) -> None:
    from saga.config import load_settings

    page = (ROOT / "docs" / "guide" / "compositions.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```toml\n(.*?)```", page, re.S) if "max_memory" in b)
    (tmp_path / "saga.toml").write_text(block, encoding="utf-8")
    settings = load_settings(cwd=tmp_path)
    assert settings.expression_limits() == {"seconds": 2.0, "max_value_size": 10_000_000,
                                            "max_items": None, "max_memory": 64 * 2**20}
    configure(**settings.expression_limits())
    with pytest.raises(ExpressionLimit) as caught:
        run_compute(COMPUTE[0], {})
    assert re.search(r"memory: holds [\d.]+ MiB, past its ceiling of 64 MiB "
                     r"\(\[limits\] max_memory\)", str(caught.value))


def test_the_inputs_a_compute_block_reads_are_not_its_own() -> None:
    """100 MiB given, bound to a name of its own, while the block makes and drops 80 MiB:
    the measurement that charge sets off finds it holds little of its own."""
    big = ["v" * 1000000 + str(i) for i in range(100)]
    code = ("data = big\nfor i in range(80):\n    tmp = 'k' * 1000000 + str(i)\n"
            "result = len(data)")
    assert run_compute(code, {"big": big}) == 100
