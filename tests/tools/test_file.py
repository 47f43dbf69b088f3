"""The file tool in a temp directory: each action, its exact restoration, and containment
under ``[file] root`` (by default the working directory, which is the temp directory here)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from saga.config import Settings
from saga.errors import ToolError
from saga.tools.file import make_tool
from tests.tools.test_common import FAIL, call, chain, engine, undo

TOOL = make_tool({})
BINARY = bytes(range(256)) + b"\xff\xfe not utf-8"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The working directory, and so the default root, is each test's temp directory."""
    monkeypatch.chdir(tmp_path)


def roundtrip(params: dict[str, Any]) -> dict[str, Any]:
    """Run the tool, then its compensation; return the output."""
    output = call(TOOL, params)
    undo(TOOL, params, output)
    return output


def test_write_then_restore_a_new_file_and_its_new_directories(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "new.txt"
    params = {"action": "write", "path": str(target), "content": "hello"}
    output = call(TOOL, params)
    assert output == {"action": "write", "path": str(target), "existed": False, "bytes": 5,
                      "created_dirs": [str(tmp_path / "a" / "b"), str(tmp_path / "a")]}
    assert target.read_text() == "hello"
    assert undo(TOOL, params, output) == {"path": str(target), "restored": "deleted"}
    assert not (tmp_path / "a").exists()
    assert undo(TOOL, params, output)["restored"] == "absent"  # idempotent


def test_overwrite_restores_text_binary_and_mode_exactly(tmp_path: Path) -> None:
    text = tmp_path / "text.txt"
    text.write_text("line 1\nline 2\n")
    text.chmod(0o640)
    output = call(TOOL, {"action": "write", "path": str(text), "content": "replaced"})
    assert output["existed"] is True
    assert output["_undo"] == {"previous": "line 1\nline 2\n", "previous_encoding": "utf-8"}
    assert "previous" not in output  # undo state: the executor keeps it out of the log
    assert output["previous_mode"] == 0o640
    text.chmod(0o600)
    undo(TOOL, {}, output)
    assert text.read_text() == "line 1\nline 2\n" and text.stat().st_mode & 0o777 == 0o640
    blob = tmp_path / "blob.bin"
    blob.write_bytes(BINARY)
    output = roundtrip({"action": "write", "path": str(blob),
                        "content": base64.b64encode(b"\x00new").decode(), "encoding": "base64"})
    assert output["_undo"]["previous_encoding"] == "base64"
    assert base64.b64decode(output["_undo"]["previous"]) == BINARY
    assert blob.read_bytes() == BINARY


def test_write_binary_content_from_base64(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    call(TOOL, {"action": "write", "path": str(target), "encoding": "base64",
                "content": base64.b64encode(BINARY).decode()})
    assert target.read_bytes() == BINARY
    with pytest.raises(ToolError, match="not valid base64"):
        call(TOOL, {"action": "write", "path": str(target), "encoding": "base64",
                    "content": "%%%"})


def test_append_restores_by_cutting_back(tmp_path: Path) -> None:
    log = tmp_path / "log.bin"
    log.write_bytes(BINARY)
    params = {"action": "append", "path": str(log), "content": "more\n"}
    output = call(TOOL, params)
    assert output["previous_size"] == len(BINARY) and "_undo" not in output
    assert log.read_bytes() == BINARY + b"more\n"
    undo(TOOL, params, output)
    undo(TOOL, params, output)
    assert log.read_bytes() == BINARY
    fresh = tmp_path / "fresh.log"
    roundtrip({"action": "append", "path": str(fresh), "content": "x"})
    assert not fresh.exists()


def test_copy_and_its_restoration(tmp_path: Path) -> None:
    source = tmp_path / "src.bin"
    source.write_bytes(BINARY)
    dest = tmp_path / "dest.txt"
    dest.write_text("old destination")
    params = {"action": "copy", "path": str(dest), "source": str(source)}
    output = call(TOOL, params)
    assert dest.read_bytes() == BINARY and output["bytes"] == len(BINARY)
    undo(TOOL, params, output)
    assert dest.read_text() == "old destination"
    new = tmp_path / "copy.bin"
    roundtrip({"action": "copy", "path": str(new), "source": str(source)})
    assert not new.exists() and source.read_bytes() == BINARY
    with pytest.raises(ToolError) as missing:
        call(TOOL, {"action": "copy", "path": str(new), "source": str(tmp_path / "ghost")})
    assert missing.value.error_type == "FileError" and missing.value.retryable is False


def test_delete_and_its_restoration(tmp_path: Path) -> None:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(BINARY)
    victim.chmod(0o755)
    params = {"action": "delete", "path": str(victim)}
    output = call(TOOL, params)
    assert not victim.exists() and output["existed"] is True
    undo(TOOL, params, output)
    assert victim.read_bytes() == BINARY and victim.stat().st_mode & 0o777 == 0o755
    ghost = tmp_path / "ghost"
    output = roundtrip({"action": "delete", "path": str(ghost)})
    assert output == {"action": "delete", "path": str(ghost), "existed": False, "bytes": 0}
    assert not ghost.exists()


def test_parameters_limits_and_errors(tmp_path: Path) -> None:
    assert TOOL.check_parameters({"action": "write", "path": "p"}) == [
        "action 'write' needs content"]
    assert TOOL.check_parameters({"action": "copy", "path": "p"}) == [
        "action 'copy' needs source"]
    assert TOOL.check_parameters({"action": "move", "path": "p"}) == [
        "action: 'move' is not one of 'write', 'append', 'copy', 'delete'"]
    big = tmp_path / "big"
    big.write_bytes(b"x" * 100)
    small = make_tool({"file": {"max_backup_bytes": 10}})
    with pytest.raises(ToolError) as too_large:
        call(small, {"action": "delete", "path": str(big)})
    assert too_large.value.error_type == "FileTooLarge" and big.exists()
    assert call(small, {"action": "append", "path": str(big), "content": "y"})["bytes"] == 1
    with pytest.raises(ToolError, match="is a directory"):
        call(TOOL, {"action": "write", "path": str(tmp_path), "content": "x"})
    with pytest.raises(ToolError, match="does not exist"):
        call(TOOL, {"action": "write", "path": str(tmp_path / "no" / "f"), "content": "x",
                    "make_parents": False})


def test_engine_restores_files_when_a_later_step_fails(tmp_path: Path,
                                                       sqlite_settings: Settings) -> None:
    config = tmp_path / "app.conf"
    config.write_bytes(b"version=1\n\x00binary tail")
    created = tmp_path / "new" / "marker"
    with engine(sqlite_settings) as s:
        run = s.run(s.load(chain(
            {"id": "edit", "tool": "file", "compensate": True,
             "args": {"action": "write", "path": str(config), "content": "version=2\n"}},
            {"id": "mark", "tool": "file", "compensate": True,
             "args": {"action": "write", "path": str(created),
                      "content": "{{ edit.bytes | string }}"}},
            FAIL)))
    assert run.status == "compensated"
    assert run.steps["mark"]["output"]["bytes"] == 2
    assert config.read_bytes() == b"version=1\n\x00binary tail"
    assert not created.exists() and not created.parent.exists()


def test_a_run_recorded_with_the_previous_content_in_its_output_is_still_restored(
        tmp_path: Path) -> None:
    old = tmp_path / "old.txt"
    old.write_text("v1")
    output = call(TOOL, {"action": "write", "path": str(old), "content": "v2"})
    legacy = {k: v for k, v in output.items() if k != "_undo"} | output["_undo"]
    undo(TOOL, {}, legacy)
    assert old.read_text() == "v1"


# -- containment -----------------------------------------------------------------------------

def test_paths_outside_the_root_are_refused_after_resolving_dot_dot_and_symlinks(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "target.txt").write_text("untouched")
    (root / "link").symlink_to(outside)                    # a directory symlink out
    (root / "file-link").symlink_to(outside / "target.txt")  # a file symlink out
    rooted = make_tool({"file": {"root": str(root)}})
    escapes = [str(root / ".." / "outside" / "new.txt"), str(root / "link" / "target.txt"),
               str(root / "file-link"), str(root / "link" / "new.txt"), "/etc/passwd",
               "../outside/target.txt"]
    for path in escapes:
        for params in ({"action": "write", "path": path, "content": "x"},
                       {"action": "delete", "path": path}):
            with pytest.raises(ToolError, match="outside the file root") as refused:
                call(rooted, params)
            assert refused.value.error_type == "NotAllowed" and not refused.value.retryable
    assert (outside / "target.txt").read_text() == "untouched"
    assert sorted(p.name for p in outside.iterdir()) == ["target.txt"]
    with pytest.raises(ToolError, match="outside the file root"):  # reading out is refused too
        call(rooted, {"action": "copy", "path": str(root / "copy.txt"),
                      "source": str(root / "link" / "target.txt")})
    assert not (root / "copy.txt").exists()
    inside = root / "sub" / ".." / "ok.txt"                # `..` that stays inside is fine
    call(rooted, {"action": "write", "path": str(inside), "content": "fine"})
    assert (root / "ok.txt").read_text() == "fine"
    (root / "inner-link").symlink_to(root / "ok.txt")      # a symlink that stays inside too
    call(rooted, {"action": "append", "path": str(root / "inner-link"), "content": "!"})
    assert (root / "ok.txt").read_text() == "fine!"


def test_the_default_root_is_the_working_directory_and_slash_opts_out(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    call(TOOL, {"action": "write", "path": "relative.txt", "content": "x"})
    assert (work / "relative.txt").read_text() == "x"
    with pytest.raises(ToolError, match=f"outside the file root {work}"):
        call(TOOL, {"action": "write", "path": str(tmp_path / "sibling.txt"), "content": "x"})
    anywhere = make_tool({"file": {"root": "/"}})
    call(anywhere, {"action": "write", "path": str(tmp_path / "sibling.txt"), "content": "x"})
    assert (tmp_path / "sibling.txt").read_text() == "x"


def test_a_compensation_checks_the_recorded_path_too(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    rooted = make_tool({"file": {"root": str(root)}})
    forged = {"action": "write", "path": str(victim), "existed": False, "bytes": 1}
    with pytest.raises(ToolError, match="outside the file root"):
        undo(rooted, {}, forged)
    assert victim.read_text() == "keep me"


def test_the_root_from_saga_toml_applies_to_runs(tmp_path: Path,
                                                  sqlite_settings: Settings) -> None:
    root = tmp_path / "data"
    root.mkdir()
    with engine(sqlite_settings, file={"root": str(root)}) as s:
        run = s.run(s.load(chain(
            {"id": "ok", "tool": "file", "args": {"action": "write",
                                                  "path": str(root / "a.txt"), "content": "a"}},
            {"id": "out", "tool": "file", "args": {"action": "write",
                                                   "path": str(root / ".." / "b.txt"),
                                                   "content": "b"}})))
    assert run.status == "compensated" and run.steps["out"]["error"]["type"] == "NotAllowed"
    assert not (tmp_path / "b.txt").exists() and not (root / "a.txt").exists()
