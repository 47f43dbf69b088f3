"""The ``git`` tool: status, branches and commits in a local repository.

Runs the ``git`` program directly (it is not subject to the shell allowlist) with an argv
list, never through a shell.

Parameters:
    repo: the repository's path (required).
    action: ``status``, ``create_branch``, ``delete_branch`` or ``commit`` (required).
    branch: the branch to create or delete.
    from: where a new branch starts (default: the current HEAD).
    checkout: switch to the new branch after creating it (default false).
    message: the commit message (``commit``).
    paths: what to stage before committing (default: everything, ``git add -A``).
    allow_empty: commit even when nothing is staged (default false).
    timeout: seconds per git command (default 60).

Output: ``status`` gives ``{"branch", "sha", "status": [porcelain lines], "clean"}``;
``create_branch`` ``{"branch", "sha", "from", "checked_out", "previous_branch"}``;
``delete_branch`` ``{"branch", "sha"}``; ``commit`` ``{"sha", "parent", "branch",
"message", "files"}``.

Compensation (``compensate: true``): ``create_branch`` deletes the branch (switching back
first if the step checked it out), only while it still points where it was created;
``commit`` runs ``git reset --soft`` to the parent, only while HEAD is still that commit
(the changes stay staged); ``delete_branch`` recreates the branch at its old sha;
``status`` does nothing. Each is idempotent. A created branch remembers the step's
idempotency key (``git config branch.NAME.sagaKey``), so re-running the same step after a
crash finds its own branch instead of failing.

Errors: ``GitError`` with git's message (not retryable).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from typing import Any

from saga.errors import ToolError
from saga.tools.base import Tool, ToolContext

ACTIONS = ("status", "create_branch", "delete_branch", "commit")

PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "repo": {"type": "string", "minLength": 1},
        "action": {"type": "string", "enum": list(ACTIONS)},
        "branch": {"type": "string", "minLength": 1},
        "from": {"type": "string", "minLength": 1},
        "checkout": {"type": "boolean"},
        "message": {"type": "string", "minLength": 1},
        "paths": {"type": "array", "items": {"type": "string"}},
        "allow_empty": {"type": "boolean"},
        "timeout": {"type": "number", "minimum": 0},
    },
    "required": ["repo", "action"],
    "additionalProperties": False,
}


def _check(params: dict[str, Any]) -> list[str]:
    action = params.get("action")
    problems = []
    if action in ("create_branch", "delete_branch") and "branch" not in params:
        problems.append(f"action {action!r} needs branch")
    if action == "commit" and "message" not in params:
        problems.append("action 'commit' needs message")
    return problems


class Git:
    """``git -C repo ...`` with errors as ToolError."""

    def __init__(self, repo: str, timeout: float = 60) -> None:
        self.repo = repo
        self.timeout = timeout

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = ["git", "-C", self.repo, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout,
                                  env=_env(), stdin=subprocess.DEVNULL)
        except FileNotFoundError as e:
            raise ToolError("the git program is not installed", error_type="GitError",
                            retryable=False) from e
        except subprocess.TimeoutExpired as e:
            raise ToolError(f"git {args[0]} timed out after {self.timeout:g}s",
                            error_type="GitError", retryable=True) from e
        if check and done.returncode != 0:
            message = (done.stderr.strip() or done.stdout.strip())[-500:]
            raise ToolError(f"git {' '.join(args[:2])} failed: {message}", error_type="GitError",
                            retryable=False)
        return done

    def out(self, *args: str) -> str:
        return self.run(*args).stdout.strip()

    def sha(self, rev: str) -> str | None:
        done = self.run("rev-parse", "-q", "--verify", f"{rev}^{{commit}}", check=False)
        return (done.stdout.strip() or None) if done.returncode == 0 else None

    def branch_sha(self, branch: str) -> str | None:
        return self.sha(f"refs/heads/{branch}")

    def current_branch(self) -> str | None:
        done = self.run("symbolic-ref", "--short", "-q", "HEAD", check=False)
        return done.stdout.strip() or None

    def check_branch_name(self, branch: str) -> None:
        if self.run("check-ref-format", "--branch", branch, check=False).returncode != 0 \
                or branch.startswith("-"):
            raise ToolError(f"{branch!r} is not a valid branch name", error_type="GitError",
                            retryable=False)


def _env() -> dict[str, str]:
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


def _git(params: dict[str, Any]) -> Git:
    return Git(str(params["repo"]), float(params.get("timeout") or 60))


def status(g: Git) -> dict[str, Any]:
    lines = [line for line in g.run("status", "--porcelain=v1").stdout.splitlines() if line]
    return {"branch": g.current_branch(), "sha": g.sha("HEAD"), "status": lines,
            "clean": not lines}


def create_branch(g: Git, params: dict[str, Any], key: str) -> dict[str, Any]:
    branch = str(params["branch"])
    g.check_branch_name(branch)
    start = str(params.get("from") or "HEAD")
    sha = g.sha(start)
    if sha is None:
        raise ToolError(f"cannot start branch {branch!r} from {start!r}: no such commit",
                        error_type="GitError", retryable=False)
    previous = g.current_branch()
    existing = g.branch_sha(branch)
    if existing is not None:
        owner = g.run("config", "--get", f"branch.{branch}.sagaKey", check=False).stdout.strip()
        if owner != key:
            raise ToolError(f"branch {branch!r} already exists (at {existing[:12]})",
                            error_type="GitError", retryable=False)
        sha = existing  # this very step created it before a crash: finish the job
    else:
        g.run("branch", "--no-track", branch, sha)
        g.run("config", f"branch.{branch}.sagaKey", key)
    if params.get("checkout") and g.current_branch() != branch:
        g.run("checkout", "-q", branch)
    return {"branch": branch, "sha": sha, "from": start,
            "checked_out": bool(params.get("checkout")), "previous_branch": previous}


def delete_branch(g: Git, params: dict[str, Any]) -> dict[str, Any]:
    branch = str(params["branch"])
    sha = g.branch_sha(branch)
    if sha is None:
        raise ToolError(f"no branch {branch!r} to delete", error_type="GitError",
                        retryable=False)
    g.run("branch", "-D", branch)
    return {"branch": branch, "sha": sha}


def commit(g: Git, params: dict[str, Any]) -> dict[str, Any]:
    paths = params.get("paths")
    if paths:
        g.run("add", "-A", "--", *[str(p) for p in paths])
    else:
        g.run("add", "-A")
    parent = g.sha("HEAD")
    staged = g.run("diff", "--cached", "--quiet", check=False).returncode != 0 \
        if parent else bool(g.out("ls-files"))
    if not staged and not params.get("allow_empty"):
        raise ToolError("nothing to commit", error_type="GitError", retryable=False)
    args = ["commit", "-q", "-m", str(params["message"])]
    if params.get("allow_empty"):
        args.append("--allow-empty")
    g.run(*args)
    sha = g.sha("HEAD")
    assert sha is not None
    files = g.out("diff-tree", "--no-commit-id", "--name-only", "-r", "--root", sha)
    return {"sha": sha, "parent": parent, "branch": g.current_branch(),
            "message": str(params["message"]), "files": files.splitlines()}


def git(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Shows status, creates or deletes a branch, or commits, in a local repository."""
    g = _git(params)
    action = params.get("action")
    if action == "status":
        return status(g)
    if action == "create_branch":
        return create_branch(g, params, ctx.idempotency_key)
    if action == "delete_branch":
        return delete_branch(g, params)
    if action == "commit":
        return commit(g, params)
    raise ToolError(f"action must be one of {', '.join(ACTIONS)}", error_type="BadParameters",
                    retryable=False)


def undo(params: dict[str, Any], output: Any, ctx: ToolContext) -> dict[str, Any]:
    """Undoes what the step did (see the module's documentation)."""
    g = _git(params)
    action = params.get("action")
    out = output if isinstance(output, dict) else {}
    if action == "status":
        return {"undone": None}
    if action == "create_branch":
        branch, sha = out["branch"], out["sha"]
        current = g.branch_sha(branch)
        if current is None:
            return {"undone": "create_branch", "branch": branch, "already": True}
        if current != sha:
            raise ToolError(f"branch {branch!r} moved to {current[:12]} since it was created at "
                            f"{sha[:12]}; not deleting it", error_type="GitError",
                            retryable=False)
        if g.current_branch() == branch:
            back = out.get("previous_branch")
            if back:
                g.run("checkout", "-q", back)
            else:
                g.run("checkout", "-q", "--detach", sha)
        g.run("branch", "-D", branch)
        return {"undone": "create_branch", "branch": branch}
    if action == "delete_branch":
        branch, sha = out["branch"], out["sha"]
        current = g.branch_sha(branch)
        if current is None:
            g.run("branch", "--no-track", branch, sha)
        elif current != sha:
            raise ToolError(f"branch {branch!r} exists again at {current[:12]}, not at "
                            f"{sha[:12]}", error_type="GitError", retryable=False)
        return {"undone": "delete_branch", "branch": branch, "sha": sha}
    if action == "commit":
        sha, parent = out["sha"], out.get("parent")
        head = g.sha("HEAD")
        if head == parent and head != sha:
            return {"undone": "commit", "sha": sha, "already": True}
        if head != sha:
            raise ToolError(f"HEAD is {str(head)[:12]}, no longer the commit {sha[:12]}; "
                            "not resetting", error_type="GitError", retryable=False)
        if parent:
            g.run("reset", "-q", "--soft", parent)
        else:  # the repository's first commit: back to an unborn branch, files staged
            g.run("update-ref", "-d", "HEAD")
        return {"undone": "commit", "sha": sha, "head": parent}
    raise ToolError(f"cannot undo action {action!r}", error_type="BadParameters",
                    retryable=False)


def make_tool(config: Mapping[str, Any]) -> Tool:
    """The ``git`` tool."""
    return Tool("git", git, undo, "Git status, create/delete branch, commit; compensation "
                "undoes each.", "builtin", PARAMS, _check)
