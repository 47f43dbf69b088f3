"""The shell tool against real programs: allowlist, exit codes, timeouts, undo_argv."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from saga.config import Settings
from saga.errors import ToolError
from saga.tools.shell import allowlist, make_tool
from tests.tools.test_common import FAIL, call, chain, engine, undo

ALLOW = {"shell": {"allow": ["echo", "true", "false", "sleep", "sh", "touch", "rm"]}}


@pytest.fixture(autouse=True)
def _no_env_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SAGA_SHELL_ALLOW", raising=False)


def test_allowlisted_programs_run_and_report_output() -> None:
    t = make_tool(ALLOW)
    assert call(t, {"argv": ["echo", "hello", "world"]}) == {
        "exit_code": 0, "stdout": "hello world\n", "stderr": ""}
    assert call(t, {"argv": ["true"]})["exit_code"] == 0
    assert call(t, {"argv": [shutil.which("echo"), "by path"]})["stdout"] == "by path\n"
    out = call(t, {"argv": ["sh", "-c", 'printf "$GREETING"; printf oops >&2; pwd'],
                   "env": {"GREETING": "hi "}, "cwd": "/"})
    assert out == {"exit_code": 0, "stdout": "hi /\n", "stderr": "oops"}


def test_a_program_outside_the_allowlist_is_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    t = make_tool({"shell": {"allow": ["echo"]}})
    for argv in (["touch", str(marker)], [shutil.which("touch") or "touch", str(marker)]):
        with pytest.raises(ToolError) as refused:
            call(t, {"argv": argv})
        assert refused.value.error_type == "NotAllowed"
        assert refused.value.retryable is False
        assert "not in the shell allowlist (allowed: echo)" in str(refused.value)
    assert not marker.exists()
    # an allowed name in another directory is another program
    fake = tmp_path / "echo"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    with pytest.raises(ToolError, match="not in the shell allowlist"):
        call(t, {"argv": [str(fake)]})
    # nor can a step's PATH swap the program behind an allowed bare name: it is refused
    with pytest.raises(ToolError, match="PATH"):
        call(t, {"argv": ["echo", "real"], "env": {"PATH": str(tmp_path)}})
    assert not marker.exists()
    with pytest.raises(ToolError) as nothing:
        call(make_tool({}), {"argv": ["echo", "x"]})
    assert nothing.value.error_type == "NotAllowed"
    assert "set [shell] allow or SAGA_SHELL_ALLOW" in str(nothing.value)


def test_full_paths_in_the_allowlist_and_the_environment_override(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho from script\n")
    script.chmod(0o755)
    t = make_tool({"shell": {"allow": [str(script)]}})
    assert call(t, {"argv": [str(script)]})["stdout"] == "from script\n"
    with pytest.raises(ToolError, match="not in the shell allowlist"):
        call(t, {"argv": ["echo"]})
    monkeypatch.setenv("SAGA_SHELL_ALLOW", " echo , true")
    assert allowlist({"shell": {"allow": ["git"]}}) == ["echo", "true"]
    assert call(t, {"argv": ["echo", "env wins"]})["stdout"] == "env wins\n"
    with pytest.raises(ToolError, match="not in the shell allowlist"):
        call(t, {"argv": [str(script)]})


def test_a_nonzero_exit_fails_with_the_stderr_tail_unless_allowed() -> None:
    t = make_tool(ALLOW)
    with pytest.raises(ToolError) as failed:
        call(t, {"argv": ["false"]})
    assert failed.value.error_type == "ExitCode" and failed.value.retryable is False
    assert str(failed.value) == "false exited with code 1"
    with pytest.raises(ToolError) as explained:
        call(t, {"argv": ["sh", "-c", "echo bad thing happened >&2; exit 3"]})
    assert str(explained.value) == "sh exited with code 3: bad thing happened"
    assert explained.value.details["exit_code"] == 3
    assert call(t, {"argv": ["false"], "allow_exit_codes": [0, 1]})["exit_code"] == 1


def test_a_timeout_kills_the_process_group() -> None:
    t = make_tool(ALLOW)
    started = time.monotonic()
    with pytest.raises(ToolError) as timed_out:
        call(t, {"argv": ["sh", "-c", "sleep 5; echo late"], "timeout": 0.3})
    assert time.monotonic() - started < 3
    assert timed_out.value.error_type == "timeout"
    assert "killed" in str(timed_out.value)


def test_a_step_timeout_in_the_engine_kills_the_program(sqlite_settings: Settings,
                                                        tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    with engine(sqlite_settings, **ALLOW) as s:
        run = s.run(s.load(chain({"id": "wait", "tool": "shell", "timeout": 0.3, "args": {
            "argv": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 5"]}})))
    assert run.status == "failed"
    assert run.steps["wait"]["error"]["type"] == "timeout"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


def test_argv_must_be_a_list_of_strings_and_the_program_must_exist() -> None:
    t = make_tool(ALLOW)
    assert t.check_parameters({"argv": "echo hi"}) == ["argv: expected array, got string"]
    assert t.check_parameters({"argv": ["echo", 1]}) == ["argv[1]: expected string, got integer"]
    assert t.check_parameters({"argv": ["echo"], "shell": True}) == [
        "unknown parameter 'shell' (expected: allow_exit_codes, argv, cwd, env, input, "
        "progress, timeout, undo_argv)"]
    [bad] = t.check_parameters({"argv": ["echo"], "progress": "^PROGRESS (.*"})
    assert bad.startswith("progress: not a regular expression: missing ), unterminated")
    for bad in ("echo hi", ["echo", 1], []):
        with pytest.raises(ToolError) as rejected:
            call(t, {"argv": bad})
        assert rejected.value.error_type == "BadParameters"
    missing = make_tool({"shell": {"allow": ["no-such-program-4711"]}})
    with pytest.raises(ToolError) as not_found:
        call(missing, {"argv": ["no-such-program-4711"]})
    assert not_found.value.error_type == "NotFound"


def test_input_is_piped_to_stdin() -> None:
    t = make_tool({"shell": {"allow": [sys.executable]}})
    out = call(t, {"argv": [sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"],
                   "input": "abc"})
    assert out["stdout"] == "cba\n"


def test_undo_argv_is_the_compensation_under_the_same_rules(tmp_path: Path) -> None:
    t = make_tool(ALLOW)
    params = {"argv": ["touch", "made"], "cwd": str(tmp_path), "undo_argv": ["rm", "made"]}
    output = call(t, params)
    assert (tmp_path / "made").exists()
    assert undo(t, params, output)["exit_code"] == 0
    assert not (tmp_path / "made").exists()
    with pytest.raises(ToolError) as refused:
        undo(t, {"argv": ["true"], "undo_argv": ["shutdown"]}, {})
    assert refused.value.error_type == "NotAllowed"
    with pytest.raises(ToolError) as nothing:
        undo(t, {"argv": ["true"]}, {})
    assert nothing.value.error_type == "NoCompensation"


def test_engine_compensates_with_undo_argv_when_a_later_step_fails(
        sqlite_settings: Settings, tmp_path: Path) -> None:
    target = tmp_path / "created.txt"
    with engine(sqlite_settings, **ALLOW) as s:
        run = s.run(s.load(chain(
            {"id": "make", "tool": "shell", "compensate": True,
             "args": {"argv": ["touch", str(target)], "undo_argv": ["rm", str(target)]}},
            {"id": "say", "tool": "shell", "args": {"argv": ["echo", "{{ inputs.word }}"]}},
            FAIL, inputs=[{"name": "word"}])), {"word": "hi"})
        assert run.status == "compensated"
        assert run.steps["say"]["output"]["stdout"] == "hi\n"
        assert run.steps["make"]["status"] == "compensated"
    assert not target.exists()


def test_engine_records_a_refused_program_as_not_allowed(sqlite_settings: Settings,
                                                         tmp_path: Path) -> None:
    marker = tmp_path / "never"
    with engine(sqlite_settings, **ALLOW) as s:
        run = s.run(s.load(chain({"id": "x", "tool": "shell", "retry": {"max_attempts": 3},
                                  "args": {"argv": ["mkdir", str(marker)]}})))
    assert run.status == "failed"
    assert run.steps["x"]["error"]["type"] == "NotAllowed"
    assert run.steps["x"]["attempt"] == 1
    assert not marker.exists()


@pytest.mark.parametrize("env", [{"LD_PRELOAD": "/tmp/evil.so"}, {"GIT_CONFIG_COUNT": "1"},
                                 {"PYTHONSTARTUP": "x.py"}, {"PATH": "/tmp"},
                                 {"BASH_ENV": "x"}, {"node_options": "--require x"}])
def test_environment_keys_that_run_other_code_are_refused(env: dict[str, str]) -> None:
    t = make_tool({"shell": {"allow": ["echo"]}})
    with pytest.raises(ToolError) as refused:
        call(t, {"argv": ["echo", "hi"], "env": env})
    assert refused.value.error_type == "NotAllowed"
    assert call(t, {"argv": ["echo", "hi"], "env": {"GREETING": "ok"}})["exit_code"] == 0


@pytest.mark.parametrize("argv", [
    ["find", ".", "-exec", "rm", "{}", ";"], ["find", ".", "-delete"],
    ["git", "-c", "alias.x=!sh", "x"], ["git", "-calias.x=!sh", "x"],
    ["git", "--exec-path=/tmp", "status"], ["git", "--config-env=a=b", "status"]])
def test_arguments_that_run_other_programs_are_refused(argv: list[str]) -> None:
    t = make_tool({"shell": {"allow": ["find", "git"]}})
    with pytest.raises(ToolError) as refused:
        call(t, {"argv": argv})
    assert refused.value.error_type == "NotAllowed"


def test_deny_args_from_saga_toml(tmp_path: Path) -> None:
    t = make_tool({"shell": {"allow": ["ls"], "deny_args": {"ls": ["-R"]}}})
    with pytest.raises(ToolError):
        call(t, {"argv": ["ls", "-R", str(tmp_path)]})
    assert call(t, {"argv": ["ls", str(tmp_path)]})["exit_code"] == 0
