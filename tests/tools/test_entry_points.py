"""Tools published in the ``saga.tools`` entry-point group, by a package installed for the
test (a dist-info folder on ``sys.path``): found when a step names them, read only then."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from saga.errors import ConfigError
from saga.tools import load_registry, loading

PLUGIN = '''
def plugged(params, ctx):
    return {"plugged": params}


def shadow(params, ctx):
    return "not the built-in"
'''


def install(root: Path, entry_points: str) -> None:
    (root / "sagaplug_mod.py").write_text(PLUGIN, encoding="utf-8")
    info = root / "sagaplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sagaplug\nVersion: 1.0\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(entry_points, encoding="utf-8")


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    install(tmp_path, "[saga.tools]\nplugged = sagaplug_mod:plugged\n"
                      "noop = sagaplug_mod:shadow\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_an_entry_point_tool_is_found_and_a_built_in_stays_built_in(plugin: Path) -> None:
    registry = load_registry()
    found = registry.get("plugged")
    assert found.source == "entry-point:sagaplug_mod:plugged"
    assert found.func({"a": 1}, None) == {"plugged": {"a": 1}}
    assert registry.get("noop").source == "builtin"
    assert {"plugged", "noop"} <= registry.names()


def test_built_in_tools_do_not_read_the_entry_points(plugin: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    original = importlib.metadata.entry_points

    def counted(**kwargs: str) -> object:
        read.append(kwargs.get("group", ""))
        return original(**kwargs)

    monkeypatch.setattr(loading, "entry_points", counted)
    registry = load_registry()
    assert registry.get("noop").source == "builtin" and "echo" in registry
    assert read == []
    assert "plugged" in registry
    assert read == ["saga.tools"]
    assert "missing" not in registry and read == ["saga.tools"]  # read once


def test_a_broken_entry_point_is_a_config_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(tmp_path, "[saga.tools]\nbroken = sagaplug_missing:nothing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = load_registry()
    assert registry.get("noop").source == "builtin"
    with pytest.raises(ConfigError, match="'broken'"):
        registry.get("broken")
