"""The ``shell`` tool: run one allowlisted program with an argv list (never a shell string).

Parameters:
    argv: the program and its arguments, a list of strings (required).
    cwd: the working directory.
    env: variables merged over saga's own environment.
    input: text written to the program's standard input (default: none, stdin is empty).
    timeout: seconds; the program (and its process group) is killed when it is exceeded.
    allow_exit_codes: exit codes that count as success (default ``[0]``).
    undo_argv: the argv run, with the same cwd/env/timeout and allowlist, by the tool's
        own compensation (``compensate: true``). Without it the compensation fails.
    progress: a regular expression: each output line matching it is sent as the details
        of a heartbeat (``ctx.heartbeat``), and the tool beats every second while the
        program runs (see :mod:`saga.tools.progress`).

Output: ``{"exit_code", "stdout", "stderr"}`` (text, each capped at 1 MiB; a
``"truncated": true`` key says when something was cut).

Allowlist: ``[shell] allow = ["git", "echo", "/opt/bin/deploy"]`` in saga.toml, or
``SAGA_SHELL_ALLOW=git,echo`` (the environment wins). An entry without a slash allows that
program as found on saga's own ``PATH`` (whether named by its bare name or by that full
path); an entry with a slash allows exactly that file. Nothing is allowed by default. A
refused program fails with error type ``NotAllowed`` (not retryable) and is never started.
Errors: ``NotAllowed``, ``NotFound`` (not retryable), ``ExitCode`` (an exit code outside
``allow_exit_codes``; the message ends with the tail of stderr), ``timeout``.

What the allowlist cannot stop by itself, and what is refused for it: environment
variables that make a program load or run other code (``LD_*``, ``DYLD_*``, ``GIT_*``,
``PYTHON*``, ``PERL5*``, ``RUBY*``, ``NODE_OPTIONS``, ``BASH_ENV``, ``ENV``, ``IFS``,
``PATH``...) are refused in ``env`` (``NotAllowed``); and an allowlisted program that runs
others (``find -exec``, ``git -c alias...``, ``env``, ``xargs``, a shell) extends the
allowlist to whatever it runs. saga refuses the arguments that do so for ``find``
(``-exec``, ``-execdir``, ``-ok``, ``-okdir``, ``-delete``) and ``git`` (``-c``,
``--config-env``, ``--exec-path`` and ``--upload-pack``-style options), and
``[shell] deny_args = {prog = ["--flag", ...]}`` adds more; allowlisting ``env``,
``xargs`` or a shell allows everything, and saga.toml should not do it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping
from typing import Any

from saga.errors import ToolError
from saga.tools import progress
from saga.tools.base import Tool, ToolContext

MAX_OUTPUT = 1 << 20
_STRINGS = {"type": "array", "items": {"type": "string"}}

PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "argv": {**_STRINGS, "minItems": 1},
        "cwd": {"type": "string"},
        "env": {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
        "input": {"type": "string"},
        "timeout": {"type": "number", "minimum": 0},
        "allow_exit_codes": {"type": "array", "items": {"type": "integer"}},
        "undo_argv": {**_STRINGS, "minItems": 1},
        "progress": {"type": "string"},
    },
    "required": ["argv"],
    "additionalProperties": False,
}


def allowlist(config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> list[str]:
    """The allowed programs: ``SAGA_SHELL_ALLOW`` if set, else saga.toml ``[shell] allow``."""
    environ = os.environ if environ is None else environ
    if environ.get("SAGA_SHELL_ALLOW") is not None:
        return [p.strip() for p in environ["SAGA_SHELL_ALLOW"].split(",") if p.strip()]
    section = config.get("shell") or {}
    allow = section.get("allow", []) if isinstance(section, dict) else []
    return [str(p) for p in allow] if isinstance(allow, list) else []


def resolve_program(program: str, allow: list[str]) -> str:
    """The full path to run for ``program``, or ToolError NotAllowed / NotFound.

    Bare names are looked up on saga's own PATH, never on the step's ``env``, so a step
    cannot swap an allowed name for another program.
    """
    names = {a for a in allow if "/" not in a}
    paths = {os.path.realpath(a) for a in allow if "/" in a}
    if "/" in program:
        found = os.path.realpath(program) if os.path.isfile(program) else None
        base = os.path.basename(program)
        via_path = shutil.which(base) if base in names else None
        allowed = (found is not None and found in paths) or (
            via_path is not None and found == os.path.realpath(via_path))
        if not allowed and found is None and (program in allow or base in names):
            raise ToolError(f"program {program!r} not found", error_type="NotFound",
                            retryable=False)
    else:
        found = shutil.which(program)
        allowed = found is not None and (program in names or os.path.realpath(found) in paths)
        if found is None and program in names:
            raise ToolError(f"program {program!r} not found on PATH", error_type="NotFound",
                            retryable=False)
    if not allowed or found is None:
        shown = ", ".join(allow) if allow else "nothing (set [shell] allow or SAGA_SHELL_ALLOW)"
        raise ToolError(f"program {program!r} is not in the shell allowlist (allowed: {shown})",
                        error_type="NotAllowed", retryable=False)
    return found


#: Environment variables that make programs load or run code of the caller's choosing.
_DANGEROUS_ENV = ("LD_", "DYLD_", "GIT_", "PYTHON", "PERL5", "PERLLIB", "RUBY", "NODE_",
                  "BASH_ENV", "ENV", "IFS", "PATH", "SHELLOPTS", "PS4", "PROMPT_COMMAND",
                  "LUA_", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "CLASSPATH", "GCONV_PATH",
                  "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "SSL_CERT", "CURL_HOME")
#: Arguments by which an allowlisted program runs programs the allowlist does not name.
_DENY_ARGS: dict[str, tuple[str, ...]] = {
    "find": ("-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fls"),
    "git": ("-c", "--config-env", "--exec-path", "--upload-pack", "--receive-pack"),
}


def refused_env(env: Mapping[str, Any]) -> list[str]:
    """The variables of a step's ``env`` that let it run code the allowlist does not."""
    return sorted(k for k in map(str, env) if k == "ENV" or k == "IFS" or k == "PATH"
                  or any(k.upper().startswith(p) for p in _DANGEROUS_ENV if p not in
                         ("ENV", "IFS", "PATH")))


def refused_args(argv: list[str], config: Mapping[str, Any] | None = None) -> list[str]:
    """The arguments of ``argv`` by which its program would run others."""
    program = os.path.basename(argv[0])
    section = (config or {}).get("shell") or {}
    extra = section.get("deny_args", {}) if isinstance(section, dict) else {}
    denied = set(_DENY_ARGS.get(program, ())) | set(map(str, (extra or {}).get(program, [])))
    return [a for a in argv[1:] if a in denied or a.split("=", 1)[0] in denied
            or (program == "git" and a.startswith("-c") and len(a) > 2)]


async def run_argv(argv: list[str], params: dict[str, Any], allow: list[str],
                   config: Mapping[str, Any] | None = None,
                   ctx: ToolContext | None = None) -> dict[str, Any]:
    """Run ``argv`` with the options in ``params``; the output dict or ToolError. With
    ``ctx``, beat while it runs, with its ``progress`` lines as details (saga.tools.progress)."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ToolError("argv must be a non-empty list of strings (no shell string)",
                        error_type="BadParameters", retryable=False)
    executable = resolve_program(argv[0], allow)
    bad_args = refused_args(argv, config)
    if bad_args:
        raise ToolError(f"{argv[0]}: {', '.join(bad_args)} would run programs the allowlist "
                        "does not name", error_type="NotAllowed", retryable=False)
    env = None
    if params.get("env"):
        bad_env = refused_env(dict(params["env"]))
        if bad_env:
            raise ToolError(f"env: {', '.join(bad_env)} would let the program run code the "
                            "allowlist does not name", error_type="NotAllowed",
                            retryable=False)
        env = {**os.environ, **{str(k): str(v) for k, v in dict(params["env"]).items()}}
    timeout = params.get("timeout")
    stdin_text = params.get("input")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, executable=executable, cwd=params.get("cwd"), env=env,
            stdin=asyncio.subprocess.PIPE if stdin_text is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
    except OSError as e:
        raise ToolError(f"cannot start {argv[0]!r}: {e}", error_type="NotFound",
                        retryable=False) from e
    try:
        data = stdin_text.encode() if stdin_text is not None else None
        out, err = await asyncio.wait_for(
            progress.communicate(proc, data, ctx, params.get("progress"), MAX_OUTPUT),
            float(timeout) if timeout else None)
    except TimeoutError:
        await _kill(proc)
        raise ToolError(f"{argv[0]} timed out after {float(timeout or 0):g}s and was killed",
                        error_type="timeout", retryable=True) from None
    except BaseException:  # cancelled by the executor's step timeout, or anything else
        await _kill(proc)
        raise
    result: dict[str, Any] = {"exit_code": proc.returncode, "stdout": _text(out),
                              "stderr": _text(err)}
    if len(out) > MAX_OUTPUT or len(err) > MAX_OUTPUT:
        result["truncated"] = True
    allowed_codes = params.get("allow_exit_codes") or [0]
    if proc.returncode not in allowed_codes:
        tail = result["stderr"].strip()[-500:] or result["stdout"].strip()[-500:]
        raise ToolError(f"{argv[0]} exited with code {proc.returncode}"
                        + (f": {tail}" if tail else ""),
                        error_type="ExitCode", retryable=False, details=result)
    return result


async def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(Exception):  # drain and close the pipes
        await asyncio.wait_for(proc.communicate(), 5)


def _text(data: bytes) -> str:
    return data[:MAX_OUTPUT].decode("utf-8", errors="replace")


def make_tool(config: Mapping[str, Any]) -> Tool:
    """The ``shell`` tool, reading its allowlist from ``config`` and the environment."""

    async def shell(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Runs an allowlisted program from an argv list."""
        argv: Any = params.get("argv")  # run_argv refuses anything but a list of strings
        return await run_argv(argv, params, allowlist(config), config, ctx)

    async def undo(params: dict[str, Any], output: Any, ctx: ToolContext) -> dict[str, Any]:
        undo_argv = params.get("undo_argv")
        if not undo_argv:
            raise ToolError("shell step has no undo_argv to compensate with",
                            error_type="NoCompensation", retryable=False)
        return await run_argv(undo_argv, params, allowlist(config), config)

    return Tool("shell", shell, undo,
                "Runs an allowlisted program from an argv list; undo_argv compensates.",
                "builtin", PARAMS, check=progress.check)
