"""The git tool against a real repository in a temp directory."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from saga.config import Settings
from saga.errors import ToolError
from saga.tools.git import make_tool
from tests.tools.test_common import FAIL, call, chain, ctx, engine, undo

TOOL = make_tool({})


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.name", "Saga Test")
    git(path, "config", "user.email", "saga@example.invalid")
    git(path, "config", "commit.gpgsign", "false")
    (path / "README").write_text("hello\n")
    git(path, "add", "README")
    git(path, "commit", "-q", "-m", "first")
    return path


def branches(repo: Path) -> list[str]:
    return git(repo, "branch", "--format=%(refname:short)").splitlines()


def test_status_reports_branch_sha_and_changes(repo: Path) -> None:
    out = call(TOOL, {"repo": str(repo), "action": "status"})
    assert out == {"branch": "main", "sha": git(repo, "rev-parse", "HEAD"), "status": [],
                   "clean": True}
    (repo / "README").write_text("changed\n")
    (repo / "new.txt").write_text("x")
    out = call(TOOL, {"repo": str(repo), "action": "status"})
    assert out["status"] == [" M README", "?? new.txt"] and out["clean"] is False
    assert undo(TOOL, {"repo": str(repo), "action": "status"}, out) == {"undone": None}


def test_create_branch_and_its_compensation(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    params = {"repo": str(repo), "action": "create_branch", "branch": "feature/x"}
    out = call(TOOL, params)
    assert out == {"branch": "feature/x", "sha": head, "from": "HEAD", "checked_out": False,
                   "previous_branch": "main"}
    assert branches(repo) == ["feature/x", "main"]
    assert call(TOOL, params) == out  # the same step again (after a crash) finds its branch
    with pytest.raises(ToolError, match="already exists"):
        call(TOOL, params, ctx("other"))
    undo(TOOL, params, out)
    assert branches(repo) == ["main"]
    assert undo(TOOL, params, out)["already"] is True


def test_a_checked_out_branch_is_left_before_it_is_deleted(repo: Path) -> None:
    params = {"repo": str(repo), "action": "create_branch", "branch": "work", "from": "main",
              "checkout": True}
    out = call(TOOL, params)
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "work"
    undo(TOOL, params, out)
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main"
    assert branches(repo) == ["main"]


def test_a_branch_that_moved_is_not_deleted(repo: Path) -> None:
    params = {"repo": str(repo), "action": "create_branch", "branch": "moving"}
    out = call(TOOL, params)
    git(repo, "checkout", "-q", "moving")
    git(repo, "commit", "-q", "--allow-empty", "-m", "someone else's work")
    git(repo, "checkout", "-q", "main")
    with pytest.raises(ToolError, match=r"moved to .* not deleting it") as refused:
        undo(TOOL, params, out)
    assert refused.value.error_type == "GitError"
    assert "moving" in branches(repo)


def test_delete_branch_and_its_compensation(repo: Path) -> None:
    git(repo, "branch", "old")
    sha = git(repo, "rev-parse", "old")
    params = {"repo": str(repo), "action": "delete_branch", "branch": "old"}
    out = call(TOOL, params)
    assert out == {"branch": "old", "sha": sha}
    assert branches(repo) == ["main"]
    undo(TOOL, params, out)
    undo(TOOL, params, out)
    assert git(repo, "rev-parse", "old") == sha
    with pytest.raises(ToolError, match="no branch 'ghost'"):
        call(TOOL, {"repo": str(repo), "action": "delete_branch", "branch": "ghost"})


def test_commit_and_its_compensation(repo: Path) -> None:
    parent = git(repo, "rev-parse", "HEAD")
    (repo / "a.txt").write_text("a")
    (repo / "b.txt").write_text("b")
    params = {"repo": str(repo), "action": "commit", "message": "add a", "paths": ["a.txt"]}
    out = call(TOOL, params)
    assert out["parent"] == parent and out["branch"] == "main" and out["files"] == ["a.txt"]
    assert git(repo, "rev-parse", "HEAD") == out["sha"]
    assert git(repo, "status", "--porcelain") == "?? b.txt"
    undo(TOOL, params, out)
    assert git(repo, "rev-parse", "HEAD") == parent
    assert git(repo, "status", "--porcelain").splitlines() == ["A  a.txt", "?? b.txt"]
    assert undo(TOOL, params, out)["already"] is True
    everything = call(TOOL, {"repo": str(repo), "action": "commit", "message": "all"})
    assert everything["files"] == ["a.txt", "b.txt"]
    with pytest.raises(ToolError, match="nothing to commit"):
        call(TOOL, {"repo": str(repo), "action": "commit", "message": "again"})
    git(repo, "commit", "-q", "--allow-empty", "-m", "later")
    with pytest.raises(ToolError, match="no longer the commit"):
        undo(TOOL, params, everything)


def test_errors_and_parameters(repo: Path, tmp_path: Path) -> None:
    with pytest.raises(ToolError) as not_a_repo:
        call(TOOL, {"repo": str(tmp_path / "nowhere"), "action": "status"})
    assert not_a_repo.value.error_type == "GitError" and not_a_repo.value.retryable is False
    with pytest.raises(ToolError, match="not a valid branch name"):
        call(TOOL, {"repo": str(repo), "action": "create_branch", "branch": "bad..name"})
    with pytest.raises(ToolError, match="no such commit"):
        call(TOOL, {"repo": str(repo), "action": "create_branch", "branch": "x",
                    "from": "nope"})
    assert TOOL.check_parameters({"repo": ".", "action": "create_branch"}) == [
        "action 'create_branch' needs branch"]
    assert TOOL.check_parameters({"repo": ".", "action": "commit"}) == [
        "action 'commit' needs message"]


def test_engine_removes_the_branch_and_the_commit_when_a_later_step_fails(
        repo: Path, sqlite_settings: Settings) -> None:
    start = git(repo, "rev-parse", "HEAD")
    (repo / "feature.txt").write_text("work\n")
    with engine(sqlite_settings) as s:
        run = s.run(s.load(chain(
            {"id": "branch", "tool": "git", "compensate": True,
             "args": {"repo": str(repo), "action": "create_branch",
                      "branch": "feature/{{ inputs.issue }}", "checkout": True}},
            {"id": "commit", "tool": "git", "compensate": True,
             "args": {"repo": str(repo), "action": "commit", "message": "{{ inputs.issue }}"}},
            {"id": "status", "tool": "git", "args": {"repo": str(repo), "action": "status"}},
            FAIL, inputs=[{"name": "issue"}])), {"issue": "AAP-1"})
    assert run.status == "compensated"
    assert run.steps["status"]["output"]["branch"] == "feature/AAP-1"
    assert run.steps["commit"]["status"] == "compensated"
    assert branches(repo) == ["main"]
    assert git(repo, "symbolic-ref", "--short", "HEAD") == "main"
    assert git(repo, "rev-parse", "HEAD") == start
    assert (repo / "feature.txt").read_text() == "work\n"
