"""Text that used to slip through or crash: duplicate keys, alias bombs, NUL characters,
bad encodings, deep nesting, and JSON as Python's ``json.dumps`` writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from saga.cli import main
from saga.composition import compile_any
from saga.composition.definition import load_file, parse_text
from saga.errors import DefinitionError

LAUGHS = "\n".join(
    [f"l0: &l0 {json.dumps(['lol'] * 9)}"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    + ["name: laughs", "steps: [{id: a, tool: echo, parameters: {x: *l8}}]"])


@pytest.mark.parametrize(("text", "says"), [
    ('{"name": "a", "name": "b", "steps": []}', "duplicate key 'name'"),
    ("name: a\nsteps: []\nname: b\n", "duplicate key 'name'"),
    (LAUGHS, "expands to more than"),
    ('{"name": "a\\u0000b", "steps": [{"id": "s", "tool": "noop"}]}',
     "name: contains a NUL character"),
    ('{"name": "a", "steps": [{"id": "s", "tool": "echo", "args": {"\\ud800": 1}}]}',
     "steps[0].args: a key is not UTF-8 text"),
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
])
def test_refused_with_a_clear_problem(text: str, says: str) -> None:
    with pytest.raises(DefinitionError) as caught:
        parse_text(text)
    assert says in str(caught.value)


def test_python_escaped_json_keeps_its_emoji() -> None:
    text = json.dumps({"name": "deploy 🚀", "steps": [{"id": "a", "tool": "noop"}]})
    assert "\\ud83d" in text  # what json.dumps writes by default
    assert parse_text(text)["name"] == "deploy 🚀"


def test_a_nul_in_data_given_directly_is_refused_before_anything_runs() -> None:
    with pytest.raises(DefinitionError, match=r"steps\[0\]\.id: contains a NUL"):
        compile_any({"name": "n", "steps": [{"id": "a\x00", "tool": "noop"}]})


def test_bad_encoding_is_a_definition_error(tmp_path: Path) -> None:
    path = tmp_path / "latin.yaml"
    path.write_bytes("name: caf\xe9\nsteps: []\n".encode("latin-1"))
    with pytest.raises(DefinitionError, match="not UTF-8"):
        load_file(path)


@pytest.mark.parametrize("content", [
    b"name: caf\xe9\n", ("[" * 50_000).encode(), LAUGHS.encode(),
    b'{"name": "x\\u0000", "steps": [{"id": "a", "tool": "noop"}]}'])
def test_the_cli_exits_2_with_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "Traceback" not in result.output


@pytest.mark.parametrize("pattern", ["(a+)+$", "(a|aa)*b", r"^(\w+\s?)*$"])
def test_a_catastrophic_input_pattern_is_refused(pattern: str) -> None:
    with pytest.raises(DefinitionError, match="exponential"):
        compile_any({"name": "p", "inputs": [{"name": "x", "type": "string",
                                              "pattern": pattern}],
                     "steps": [{"id": "a", "tool": "noop"}]})


def test_an_over_long_input_is_not_matched_against_a_pattern() -> None:
    from saga.composition.definition import resolve_inputs
    from saga.errors import InputError

    plan = compile_any({"name": "p", "inputs": [{"name": "x", "type": "string",
                                                 "pattern": "^a+$"}],
                        "steps": [{"id": "a", "tool": "noop"}]})
    with pytest.raises(InputError, match="too long"):
        resolve_inputs(plan.definition, {"x": "a" * 20_000})
