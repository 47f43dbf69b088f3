"""The ``file`` tool: write, append, copy or delete one file, remembering what was there.

Parameters:
    action: ``write``, ``append``, ``copy`` or ``delete`` (required).
    path: the file acted on (for ``copy``, the destination). Required.
    content: the text to write or append (``write``/``append``); with
        ``encoding: base64`` it is base64 and written as the decoded bytes.
    encoding: ``utf-8`` (default) or ``base64``.
    source: the file to copy from (``copy``).
    make_parents: create missing parent directories (default true).

Output: ``{"action", "path", "existed", "bytes"}`` plus the previous state the
compensation needs: for ``write``/``copy``/``delete`` of an existing file its permission
bits (``previous_mode``) and, as undo state (``_undo``, kept in the undo store and never in
the log: a file may hold a password), its content (``previous``, text, or base64 with
``previous_encoding: "base64"`` when it is not UTF-8); for ``append`` its size
(``previous_size``). ``created_dirs`` lists the directories the tool created.

Compensation (``compensate: true``) restores the previous state exactly: a file that did
not exist is deleted again (and the directories the step created, when empty), an
overwritten or deleted file gets its old bytes and mode back, an appended file is cut
back to its old size. It is idempotent.

saga.toml ``[file] max_backup_bytes`` (default 10 MiB) bounds the previous content kept
to restore; replacing or deleting a larger file fails with ``FileTooLarge``.

Containment: every path (``path``, ``source``, and the recorded path a compensation
restores) must lie under ``[file] root`` once symlinks and ``..`` are resolved; anything
else fails with ``NotAllowed`` before the file system is touched. Without ``root`` the
root is the working directory of the process (``root = "/"`` opts out). The tool acts on
the resolved path. Relative paths are taken from the working directory.
Errors: ``FileError`` (not retryable) for anything the file system refuses.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from saga.errors import ToolError
from saga.tools.base import UNDO, Tool, ToolContext

MAX_BACKUP = 10 << 20
ACTIONS = ("write", "append", "copy", "delete")

PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": list(ACTIONS)},
        "path": {"type": "string", "minLength": 1},
        "content": {"type": "string"},
        "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
        "source": {"type": "string", "minLength": 1},
        "make_parents": {"type": "boolean"},
    },
    "required": ["action", "path"],
    "additionalProperties": False,
}


def _check(params: dict[str, Any]) -> list[str]:
    action = params.get("action")
    problems = []
    if action in ("write", "append") and "content" not in params:
        problems.append(f"action {action!r} needs content")
    if action == "copy" and "source" not in params:
        problems.append("action 'copy' needs source")
    if action in ("copy", "delete") and "content" in params:
        problems.append(f"action {action!r} takes no content")
    return problems


def _fail(message: str, e: OSError | None = None) -> ToolError:
    detail = f": {e.strerror or e}" if e is not None else ""
    return ToolError(message + detail, error_type="FileError", retryable=False)


def _encode(data: bytes) -> tuple[str, str]:
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _decode(text: str, encoding: str) -> bytes:
    if encoding == "base64":
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ToolError(f"content is not valid base64: {e}", error_type="BadParameters",
                            retryable=False) from e
    return text.encode("utf-8")


def _missing_dirs(path: Path) -> list[Path]:
    missing = []
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    return missing


def root_of(section: Mapping[str, Any]) -> Path:
    """The directory the tool may act under: ``[file] root``, else the working directory."""
    root = section.get("root")
    return Path(str(root)).resolve() if root else Path.cwd().resolve()


def contained(path: Path, root: Path) -> Path:
    """``path`` resolved (symlinks followed, ``..`` removed), or NotAllowed when that is not
    under ``root``."""
    resolved = path.resolve()
    if resolved != root and not resolved.is_relative_to(root):
        raise ToolError(f"{path} is outside the file root {root} (saga.toml [file] root)",
                        error_type="NotAllowed", retryable=False)
    return resolved


def make_tool(config: Mapping[str, Any]) -> Tool:
    """The ``file`` tool (``[file] max_backup_bytes`` and ``root`` from ``config``)."""
    section = config.get("file") or {}
    section = section if isinstance(section, dict) else {}
    limit = int(section.get("max_backup_bytes", MAX_BACKUP))

    def file(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Writes, appends, copies or deletes a file, remembering what was there."""
        action = params.get("action")
        if action not in ACTIONS:
            raise ToolError(f"action must be one of {', '.join(ACTIONS)}",
                            error_type="BadParameters", retryable=False)
        given = str(params["path"])
        root = root_of(section)
        path = contained(Path(given), root)
        if path.is_dir():
            raise _fail(f"{given} is a directory")
        existed = path.is_file()
        out: dict[str, Any] = {"action": action, "path": given, "existed": existed}
        try:
            if existed:
                out["previous_mode"] = stat.S_IMODE(path.stat().st_mode)
                if action == "append":
                    out["previous_size"] = path.stat().st_size
                else:
                    size = path.stat().st_size
                    if size > limit:
                        raise ToolError(
                            f"{path} has {size} bytes, more than [file] max_backup_bytes "
                            f"({limit}) keeps to restore it", error_type="FileTooLarge",
                            retryable=False)
                    previous, encoding = _encode(path.read_bytes())
                    out[UNDO] = {"previous": previous, "previous_encoding": encoding}
            elif action == "delete":
                out["bytes"] = 0
                return out
            created = _missing_dirs(path)
            if created and params.get("make_parents", True) is False:
                raise _fail(f"directory {path.parent} does not exist")
            if action in ("write", "append", "copy"):
                path.parent.mkdir(parents=True, exist_ok=True)
                out["created_dirs"] = [str(d) for d in created]
            if action == "write":
                data = _decode(str(params.get("content", "")), params.get("encoding", "utf-8"))
                path.write_bytes(data)
                out["bytes"] = len(data)
            elif action == "append":
                data = _decode(str(params.get("content", "")), params.get("encoding", "utf-8"))
                with path.open("ab") as f:
                    f.write(data)
                out["bytes"] = len(data)
            elif action == "copy":
                source = contained(Path(str(params.get("source", ""))), root)
                if not source.is_file():
                    raise _fail(f"source {source} is not a file")
                shutil.copyfile(source, path)
                out["source"] = str(params.get("source", ""))
                out["bytes"] = path.stat().st_size
            else:
                path.unlink()
                out["bytes"] = 0
        except OSError as e:
            raise _fail(f"cannot {action} {path}", e) from e
        return out

    def restore(params: dict[str, Any], output: Any, ctx: ToolContext) -> dict[str, Any]:
        if not isinstance(output, dict) or "existed" not in output:
            raise ToolError("no recorded file state to restore", error_type="NoCompensation",
                            retryable=False)
        given = str(output["path"])
        root = root_of(section)
        path = contained(Path(given), root)
        # Recorded by a version that kept the previous content in the output itself.
        kept = output.get(UNDO)
        state: dict[str, Any] = kept if isinstance(kept, dict) else output
        try:
            if not output["existed"]:
                removed = path.is_file()
                path.unlink(missing_ok=True)
                for d in output.get("created_dirs") or []:
                    with contextlib.suppress(OSError, ToolError):  # not empty: still used
                        os.rmdir(contained(Path(d), root))
                return {"path": given, "restored": "deleted" if removed else "absent"}
            if output["action"] == "append":
                with path.open("r+b") as f:
                    f.truncate(int(output["previous_size"]))
            else:
                if "previous" not in state:
                    raise ToolError(f"no previous content of {given} was recorded",
                                    error_type="NoCompensation", retryable=False)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(_decode(state["previous"],
                                         state.get("previous_encoding", "utf-8")))
            if output.get("previous_mode") is not None:
                path.chmod(int(output["previous_mode"]))
        except OSError as e:
            raise _fail(f"cannot restore {given}", e) from e
        return {"path": given, "restored": "previous content"}

    return Tool("file", file, restore, "Writes, appends, copies or deletes a file; its "
                "compensation restores the previous content.", "builtin", PARAMS, _check)
