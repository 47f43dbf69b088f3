"""The README's and the documentation's examples, pasted as a user would: files written,
commands run.

Conventions of the pages (README.md and docs/**/*.md), which this file relies on:

- A fenced ``yaml``, ``python`` or ``toml`` block whose first line is a comment naming a
  file (``# deploy.yaml``) is that file: each name is used once across all pages, and the
  tests write it before running what the page shows.
- Every ``bash`` block of a page in docs/ is run, as written: a page's blocks in order, in
  one fresh directory holding that page's named files, on a SQLite store of its own
  (``SAGA_HOME``). A line whose comment says ``# exit N`` must exit N; every other command
  must succeed. So a ``bash`` block must be self-contained.
- ``console`` and ``text`` blocks are shown, never run: they need what a test does not
  have (a clone to install from, a server that runs until stopped, PostgreSQL, root) or
  hold placeholders such as ``RUN``. Some of them are run with those things by tests of
  their own: the approval and graph-form examples and the tutorial's curl commands
  (against a real ``saga serve``) below, the service page's in tests/server/test_api.py.
- README.md's blocks are not run blindly (its quick start installs the package); the tests
  below run its commands.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
PAGES = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
         for p in sorted((ROOT / "docs").rglob("*.md"))}
EVERYTHING = "\n".join([README, *PAGES.values()])
_NAMED = re.compile(r"```(?:yaml|python|toml)\n(.*?)```", re.S)


def page(name: str) -> str:
    """One documentation page's text, by its path under docs/."""
    return PAGES[f"docs/{name}"]


def named_blocks(text: str = EVERYTHING) -> dict[str, str]:
    """Fenced blocks whose first line is a comment naming a file (``# deploy.yaml``)."""
    blocks: dict[str, str] = {}
    for body in _NAMED.findall(text):
        first = body.splitlines()[0]
        match = re.match(r"#\s*(\S+\.(?:yaml|py|toml))$", first)
        if match:
            assert match.group(1) not in blocks, f"{match.group(1)} is named twice"
            blocks[match.group(1)] = body
    return blocks


def saga_cmd() -> list[str]:
    exe = shutil.which("saga", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "saga.cli"]


def sh(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "SAGA_HOME": str(cwd / ".saga"), **env}
    full_env.pop("SAGA_DATABASE_URL", None)
    return subprocess.run(saga_cmd() + args, cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    for name, body in named_blocks().items():
        (tmp_path / name).write_text(body, encoding="utf-8")
    return tmp_path


def test_the_pages_name_their_example_files() -> None:
    assert {"deploy.yaml", "mytools.py", "saga.toml", "batch.yaml", "gate.yaml",
            "order.yaml", "report.yaml", "trip.yaml"} <= set(named_blocks())


def test_the_readme_is_one_screen_with_the_quick_start_first() -> None:
    lines = README.splitlines()
    assert len(lines) <= 250
    head = "\n".join(lines[:60])
    for command in ("pip install -e . && saga run quickstart",
                    "saga run quickstart --input fail_at=ship", "saga list",
                    "saga history <RUN_ID>", "pip install -e '.[dev]' && bash ops/test.sh"):
        assert command in head, command


def test_the_readme_speaks_to_a_reader() -> None:
    """No project-internal names for formats, and no benchmark diary (that is
    ops/bench/HISTORY.md)."""
    assert not re.search(r"\b[Ss]eeds? \d{3}\b", README)
    assert not re.search(r"\b\w+(th|st|nd|rd) pass\b|first machine|second machine", README)


def test_the_readme_links_to_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README)
    assert links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert missing == []


def test_quick_start_runs_and_compensates(workdir: Path) -> None:
    template = str(ROOT / "saga" / "templates" / "quickstart.yaml")
    ok = sh(["run", template], workdir)
    assert ok.returncode == 0, ok.stderr
    assert "completed" in ok.stdout
    bad = sh(["run", template, "--input", "fail_at=ship"], workdir)
    assert bad.returncode == 1
    assert "compensated" in bad.stdout
    listed = json.loads(sh(["list", "--json"], workdir).stdout)
    assert [r["status"] for r in listed] == ["compensated", "completed"]
    history = sh(["history", listed[0]["run_id"]], workdir)
    assert "CompensationStarted" in history.stdout and "RunCompensated" in history.stdout


def test_the_deploy_example(workdir: Path) -> None:
    validated = sh(["validate", "deploy.yaml"], workdir)
    assert validated.returncode == 0, validated.stderr
    assert "critical path: backup -> migrate -> scale" in validated.stdout
    ran = sh(["run", "deploy.yaml", "--input", "service=api", "--input", "replicas=3",
              "--json"], workdir)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["status"] == "completed"
    assert result["outputs"] == {"snapshot": "snap-api", "replicas": 3}


def test_the_approval_example(workdir: Path) -> None:
    ran = sh(["run", str(ROOT / "tests/seeds/002_start_work.yaml"), "--tools",
              "tests.standins.standins", "--input", "issue_key=AAP-12345", "--json"], workdir,
             PYTHONPATH=str(ROOT))
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    assert json.loads(ran.stdout)["status"] == "waiting"
    approved = sh(["approve", run_id, "create_branch", "--comment", "go ahead"], workdir)
    assert approved.returncode == 0, approved.stderr
    resumed = sh(["resume", run_id, "--tools", "tests.standins.standins", "--json"], workdir,
                 PYTHONPATH=str(ROOT))
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"


def test_own_tools_via_saga_toml_and_the_python_api(workdir: Path) -> None:
    (workdir / "users.yaml").write_text(
        "name: users\nsteps:\n  - id: make\n    tool: create_user\n    args: {name: ada}\n")
    listed = sh(["tools", "--json"], workdir)
    assert "create_user" in {t["name"] for t in json.loads(listed.stdout)}
    ran = sh(["run", "users.yaml", "--json"], workdir)
    assert ran.returncode == 0, ran.stderr
    output = json.loads(ran.stdout)["steps"]["make"]["output"]
    assert output["user"] == "ada" and output["attempt"] == 1
    api_block = re.search(r"```python\n(from saga import Saga\n.*?)```",
                          page("guide/python-api.md"), re.S)
    assert api_block is not None
    script = api_block.group(1).replace('"deploy.yaml"', '"deploy.yaml"')
    (workdir / "api_example.py").write_text(script)
    env = {**os.environ, "SAGA_HOME": str(workdir / ".saga")}
    env.pop("SAGA_DATABASE_URL", None)
    out = subprocess.run([sys.executable, "api_example.py"], cwd=workdir, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("completed {'snapshot': 'snap-api', 'replicas': 2}")
    assert "RunCompleted" in out.stdout


def test_the_loop_and_layer_examples(workdir: Path) -> None:
    ran = sh(["run", "batch.yaml", "--json"], workdir)
    assert ran.returncode == 0, ran.stderr
    result = json.loads(ran.stdout)
    assert result["steps"]["create"]["output"] == [
        {"created": "ada", "index": 0}, {"created": "grace", "index": 1},
        {"created": "linus", "index": 2}]
    assert result["steps"]["report"]["output"] == {"count": 3}
    gate = json.loads(sh(["run", "gate.yaml", "--json"], workdir).stdout)
    assert gate["status"] == "completed"
    assert gate["outputs"]["_layers"]["degraded"] is True
    eco = json.loads(sh(["run", "gate.yaml", "--mode", "eco", "--json"], workdir).stdout)
    assert eco["steps"]["docs"]["reason"] == "eco mode"
    assert sh(["graph", "gate.yaml"], workdir).stdout.startswith("flowchart TD")


def test_the_graph_form_example(tmp_path: Path) -> None:
    tools = ["--tools", "tests.standins.standins", "--tools", "tests.standins.graph_standins"]
    env = {"SAGA_HOME": str(tmp_path / ".saga")}
    validated = sh(["validate", "tests/seeds/004_parallel_review.yaml", *tools], ROOT, **env)
    assert validated.returncode == 0, validated.stderr
    assert "level 3: lint, test, security" in validated.stdout
    ran = sh(["run", "tests/seeds/004_debug_loop.yaml", *tools, "--input",
              "input=login fails", "--json"], ROOT, **env)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["status"] == "completed"


def test_production_controls_as_the_readme_shows(workdir: Path) -> None:
    """order.yaml: a 3 s sleep, then a signal; the commands of docs/howto/signals.md."""
    assert sh(["submit", "order.yaml", "--id", "ORDER-7"], workdir).returncode == 0
    assert sh(["worker", "--until-idle", "--poll", "0.05"], workdir).returncode == 0
    status = json.loads(sh(["status", "ORDER-7", "--json"], workdir).stdout)
    assert status["status"] == "waiting"
    time.sleep(3)
    sh(["worker", "--until-idle", "--poll", "0.05"], workdir)
    assert json.loads(sh(["status", "ORDER-7", "--json"], workdir).stdout)["steps"][
        "cool_off"]["status"] == "completed"
    sent = sh(["signal", "ORDER-7", "go", "--data", '{"amount": 42}'], workdir)
    assert sent.returncode == 0, sent.stderr
    sh(["worker", "--until-idle", "--poll", "0.05"], workdir)
    done = json.loads(sh(["status", "ORDER-7", "--json"], workdir).stdout)
    assert done["status"] == "completed"
    assert done["outputs"]["pay"] == {"amount": 42}
    again = sh(["run", "quickstart", "--id", "ORDER-42", "--json"], workdir)
    same = sh(["run", "quickstart", "--id", "ORDER-42", "--json"], workdir)
    assert json.loads(again.stdout)["run_id"] == json.loads(same.stdout)["run_id"] == "ORDER-42"
    assert sh(["run", "quickstart", "--id", "ORDER-42", "-i", "fail_at=ship"],
              workdir).returncode == 6


def test_queues_and_priorities_as_the_readme_shows(workdir: Path) -> None:
    """The saga.toml table and the commands of docs/howto/queues.md, pasted."""
    section = page("howto/queues.md")
    toml = re.search(r"```toml\n(.*?)```", section, re.S)
    commands = re.search(r"```bash\n(.*?)```", section, re.S)
    assert toml is not None and commands is not None
    (workdir / "saga.toml").write_text(toml.group(1), encoding="utf-8")
    outputs = []
    for line in commands.group(1).splitlines():
        args = shlex.split(line, comments=True)
        assert args[0] == "saga"
        done = sh(args[1:], workdir)
        assert done.returncode == 0, (line, done.stderr)
        outputs.append(done.stdout)
    shown = json.loads(outputs[-1])
    assert (shown["status"], shown["queue"], shown["priority"]) == ("completed", "reports", 10)
    first: dict[str, datetime] = {}
    for run_id in ("R-1", "R-2", "R-3"):
        history = json.loads(sh(["history", run_id, "--json"], workdir).stdout)
        assert history[-1]["type"] == "RunCompleted"
        first[run_id] = min(datetime.fromisoformat(e["timestamp"]) for e in history
                            if e["type"] == "StepStarted")
    assert sorted(first, key=first.__getitem__) == ["R-2", "R-1", "R-3"]


def test_the_observability_examples(workdir: Path) -> None:
    """Console spans on stderr beside the command's JSON; JSON log lines; an OTLP endpoint
    alone turns tracing on, and a worker with nothing to do exits as usual."""
    for line in ("OTEL_TRACES_EXPORTER=console saga run quickstart --json 2> spans.jsonl",
                 "saga --log-format json run quickstart 2> log.jsonl",
                 "saga worker --metrics-port 9464 &"):
        assert line in page("howto/observability.md"), line
    traced = sh(["run", "quickstart", "--json"], workdir, OTEL_TRACES_EXPORTER="console")
    assert traced.returncode == 0, traced.stderr
    run_id = json.loads(traced.stdout)["run_id"]
    spans = [json.loads(line) for line in traced.stderr.splitlines()]
    assert {s["name"] for s in spans} == {"saga.run", "saga.step"}
    assert all(s["attributes"]["saga.run_id"] == run_id for s in spans)
    logged = sh(["--log-format", "json", "run", "quickstart"], workdir)
    assert logged.returncode == 0, logged.stderr
    lines = [json.loads(line) for line in logged.stderr.splitlines()]
    assert lines and all({"time", "level", "logger", "message"} <= set(x) for x in lines)
    idle = sh(["worker", "--until-idle"], workdir,
              OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318", OTEL_SERVICE_NAME="orders")
    assert idle.returncode == 0, idle.stderr


def test_shell_completion_works_as_the_pages_say() -> None:
    assert "_SAGA_COMPLETE=bash_source saga" in page("reference/cli.md")
    code = "from saga.cli import main; main(prog_name='saga')"
    env = {**os.environ, "_SAGA_COMPLETE": "bash_complete", "COMP_WORDS": "saga projection r",
           "COMP_CWORD": "2"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["plain,rebuild", "plain,run"], done.stdout + done.stderr
    source = subprocess.run([sys.executable, "-c", code],
                            env={**os.environ, "_SAGA_COMPLETE": "bash_source"},
                            capture_output=True, text=True, timeout=60)
    assert "complete -o nosort -F _saga_completion saga" in source.stdout


# --- every bash block of the documentation, pasted -------------------------------------

def bash_blocks(text: str) -> list[str]:
    """A page's ``bash`` blocks, in order."""
    return re.findall(r"```bash\n(.*?)```", text, re.S)


def as_script(block: str) -> str:
    """A block as bash runs it: continued lines joined, and each line whose comment says
    ``# exit N`` (N other than 0) checked for that exit code instead of stopping there."""
    lines = []
    for line in block.replace("\\\n", " ").splitlines():
        expected = re.search(r"#\s*exit (\d+)", line)
        if expected is None or expected.group(1) == "0":
            lines.append(line)
            continue
        command, code = line[:expected.start()].rstrip(), expected.group(1)
        lines.append(f"set +e; {command}; rc=$?; set -e; [ $rc = {code} ] || "
                     f"{{ echo \"exit $rc, not {code}:\" {shlex.quote(command)} >&2; exit 97; }}")
    return "set -eo pipefail\n" + "\n".join(lines) + "\n"


RUNNABLE = [name for name, text in PAGES.items() if bash_blocks(text)]


def test_the_pages_that_must_run_do() -> None:
    """The tutorial and the how-to guides have examples to paste (a page with none
    would pass the test below without running anything)."""
    for name in ("docs/tutorial.md", "docs/howto/signals.md", "docs/howto/queues.md",
                 "docs/howto/schedules.md", "docs/howto/approvals.md",
                 "docs/howto/run-controls.md", "docs/howto/audit.md",
                 "docs/guide/compositions.md", "docs/concepts/replay.md"):
        assert name in RUNNABLE, name


@pytest.mark.parametrize("name", RUNNABLE)
def test_a_pages_bash_blocks_run_when_pasted(name: str, tmp_path: Path) -> None:
    text = PAGES[name]
    for file, body in named_blocks(text).items():
        (tmp_path / file).write_text(body, encoding="utf-8")
    env = {**os.environ, "SAGA_HOME": str(tmp_path / ".saga"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for variable in ("SAGA_DATABASE_URL", "SAGA_DATABASE_PARTITIONS", "SAGA_CONFIG"):
        env.pop(variable, None)
    for block in bash_blocks(text):
        done = subprocess.run(["bash", "-c", as_script(block)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, \
            f"{name}:\n{block}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def test_the_tutorials_service_step_works_when_pasted(tmp_path: Path) -> None:
    """The tutorial's curl commands against a real ``saga serve``: a run started over HTTP
    and its events followed live until the run ends, compensated."""
    from saga.config import Settings
    from tests.server.conftest import Server, store_env

    block = next(b for b in re.findall(r"```console\n(.*?)```", page("tutorial.md"), re.S)
                 if "curl -s -X POST" in b)
    settings = Settings(home=tmp_path / ".saga")
    server = Server(settings, store_env(settings)).start()
    try:
        done = subprocess.run(["bash", "-c", as_script(block.replace("http://127.0.0.1:8080",
                                                                     server.url))],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    started, _ = json.JSONDecoder().raw_decode(done.stdout)  # curl adds no newline
    assert started["run_id"] == "order-3"
    events = [line.split(":", 1)[1].strip() for line in done.stdout.splitlines()
              if line.startswith("event:")]
    assert events[0] == "RunStarted" and events[-1] == "RunCompensated"
