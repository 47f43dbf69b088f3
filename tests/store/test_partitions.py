"""Runs partitioned over two PostgreSQL clusters by run id, standing in for two hosts: each
cluster is started by this file on a free port of its own (never the shared 5432).

Without ``initdb`` these tests are skipped with the reason, except under CI, where
they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from saga.api import Saga
from saga.audit import verify_store
from saga.config import Settings, load_settings
from saga.domain import run_uuid
from saga.errors import ConfigError
from saga.store.partitions import PartitionedApp, partition_of
from saga.tools import Registry
from tests.standins.pg_cluster import Cluster, pg_bin

ROOT = Path(__file__).resolve().parents[2]
FLOW = {"name": "flow", "steps": [
    {"id": "a", "tool": "effect", "args": {"value": 1}},
    {"id": "b", "tool": "effect", "args": {"value": 2}, "depends_on": ["a"]}]}


@pytest.fixture(scope="module")
def clusters() -> Iterator[tuple[Cluster, Cluster]]:
    if pg_bin() is None:
        if os.environ.get("CI"):
            pytest.fail("initdb is required in CI (apt-get install postgresql)")
        pytest.skip("no initdb (Debian: apt-get install postgresql): cannot start two "
                    "clusters of our own")
    first, second = Cluster(), Cluster()
    try:
        first.start()
        second.start()
        yield first, second
    finally:
        first.destroy()
        second.destroy()


@pytest.fixture
def parts(clusters: tuple[Cluster, Cluster]) -> Settings:
    """Settings for a store partitioned over both clusters, in a fresh schema on each."""
    for c in clusters:
        c.wait_ready()
    urls = tuple(c.url for c in clusters)
    return Settings(database_url=urls[0], partitions=urls, schema=f"p_{uuid.uuid4().hex[:10]}",
                    actor="tester", lease_seconds=5, pool_size=1, max_overflow=2)


def env_for(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGA_")}
    env.update(SAGA_DATABASE_PARTITIONS=",".join(settings.partitions),
               SAGA_DATABASE_SCHEMA=settings.schema or "", PYTHONPATH=str(ROOT), **extra)
    return env


def cli(settings: Settings, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saga", *args], cwd=ROOT,
                          env=env_for(settings, **extra), capture_output=True, text=True,
                          timeout=120)


def events_by_run(cluster: Cluster, schema: str) -> Counter[str]:
    """How many events each run has in one cluster (read with SQL, not through saga)."""
    import psycopg

    with psycopg.connect(cluster.url) as conn:
        rows = conn.execute(f'SELECT originator_id, COUNT(*) FROM "{schema}".saga_events '
                            "GROUP BY originator_id").fetchall()
    return Counter({str(r[0]): int(r[1]) for r in rows})


def test_a_run_id_maps_to_the_same_partition_in_every_process() -> None:
    ids = [str(uuid.uuid4()) for _ in range(200)] + [f"ORDER-{i}" for i in range(50)]
    here = [partition_of(i, 3) for i in ids]
    code = ("import json, sys; from saga.store.partitions import partition_of; "
            "print(json.dumps([partition_of(i, 3) for i in json.load(sys.stdin)]))")
    for seed in ("0", "1"):  # a different str hash salt in each process
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(ids), text=True,
                             capture_output=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed,
                                  "PYTHONPATH": str(ROOT)})
        assert json.loads(out.stdout) == here
    assert set(here) == {0, 1, 2}
    # a chosen name and the store key it stands for are one run: one partition
    assert all(partition_of(f"ORDER-{i}", 2) == partition_of(str(run_uuid(f"ORDER-{i}")), 2)
               for i in range(50))


def test_partitions_are_read_from_the_environment_and_saga_toml(tmp_path: Path) -> None:
    a, b = "postgresql://u@h1:5432/saga", "postgresql://u@h2:5433/saga"
    s = load_settings({"SAGA_DATABASE_PARTITIONS": f"{a}, {b}"}, cwd=tmp_path)
    assert s.partitions == (a, b) and s.database_url == a
    (tmp_path / "saga.toml").write_text(f'[database]\npartitions = ["{b}", "{a}"]\n')
    s = load_settings({}, cwd=tmp_path)
    assert s.partitions == (b, a) and s.database_url == b
    assert load_settings({"SAGA_DATABASE_PARTITIONS": a}, cwd=tmp_path).partitions == ()
    with pytest.raises(ConfigError, match="leave SAGA_DATABASE_URL"):
        load_settings({"SAGA_DATABASE_URL": b, "SAGA_DATABASE_PARTITIONS": f"{a},{b}"},
                      cwd=tmp_path)
    with pytest.raises(ConfigError, match="named twice"):
        load_settings({"SAGA_DATABASE_PARTITIONS": f"{a},{a}"}, cwd=tmp_path)
    with pytest.raises(ConfigError, match="postgresql://"):
        load_settings({"SAGA_DATABASE_PARTITIONS": f"{a},sqlite:///x"}, cwd=tmp_path)


def submit(saga: Saga, n: int, **kwargs: Any) -> list[str]:
    plan = saga.load(FLOW)
    return [saga.submit(plan, **kwargs).run_id for _ in range(n)]


def submit_to_both(saga: Saga, n: int) -> list[str]:
    """At least ``n`` runs, and more until both partitions hold one: random ids all land
    in one partition once in 2 ** (n - 1) tries (with 8, a test failed that way)."""
    ids = submit(saga, n)
    while {partition_of(i, 2) for i in ids} != {0, 1}:
        ids += submit(saga, 1)
    return ids


def test_runs_land_whole_on_both_partitions_and_a_worker_drains_them(
        clusters: tuple[Cluster, Cluster], parts: Settings, registry: Registry,
        tmp_path: Path) -> None:
    with Saga(parts, registry=registry) as saga:
        assert isinstance(saga.app, PartitionedApp)
        ids = [*submit_to_both(saga, 24), saga.submit(saga.load(FLOW), run_id="ORDER-42").run_id]
    where = {i: partition_of(i, 2) for i in ids}
    assert set(where.values()) == {0, 1}

    calls = tmp_path / "calls.log"
    worker = subprocess.run(
        [sys.executable, "-m", "saga", "worker", "--until-idle", "--tools",
         "tests.standins.standins", "--poll", "0.05", "--concurrency", "4"],
        cwd=ROOT, env=env_for(parts, SAGA_TEST_CALL_LOG=str(calls)), capture_output=True,
        text=True, timeout=180)
    assert worker.returncode == 0, worker.stderr[-2000:]
    assert "Traceback" not in worker.stderr, worker.stderr[-2000:]
    effects = Counter(c["key"] for c in map(json.loads, calls.read_text().splitlines()))
    assert len(effects) == 2 * len(ids) and set(effects.values()) == {1}

    # every event of each run is in the partition its id names, none in the other
    stored = [events_by_run(c, parts.schema or "") for c in clusters]
    with Saga(parts, registry=registry) as saga:
        for run_id in ids:
            uid = str(saga.app.get_run(run_id).id)
            home, other = stored[where[run_id]], stored[1 - where[run_id]]
            assert home[uid] == len(saga.history(run_id)) and uid not in other
            assert saga.get(run_id).status == "completed"
            assert saga.verify(run_id) is None
        # the read model of each partition has its own runs; together, every run
        assert sorted(r["run_id"] for r in saga.list_runs(limit=None)) == sorted(
            str(saga.get(i).id) if i != "ORDER-42" else "ORDER-42" for i in ids)
        counts = [len(p.runs(limit=None)) for p in saga.projection.parts]  # type: ignore
        # read together (as a worker's look reads what it claimed): one read per partition
        together = saga.app.get_runs([*ids, "NOBODY"])
        assert sorted(together) == sorted(ids)
        assert all(together[i].version == saga.app.get_run(i).version for i in ids)
        assert counts == [sum(1 for v in where.values() if v == k) for k in (0, 1)]
        assert saga.lag() == 0
    assert sum(len(s) for s in stored) == len(ids)

    listed = cli(parts, "list", "--json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    assert Counter(r["status"] for r in json.loads(listed.stdout)) == {"completed": len(ids)}
    audit = cli(parts, "audit", "verify", "--all", "--json")
    assert audit.returncode == 0, audit.stderr
    assert len(json.loads(audit.stdout)["runs"]) == len(ids)
    assert all(r.ok for r in verify_store(parts))
    for run_id in (next(i for i in ids if where[i] == 0), next(i for i in ids if where[i] == 1)):
        shown = cli(parts, "status", run_id, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["status"] == "completed"


def test_saga_run_from_the_cli_records_in_the_run_s_partition(
        clusters: tuple[Cluster, Cluster], parts: Settings, tmp_path: Path) -> None:
    flow = tmp_path / "flow.json"
    flow.write_text(json.dumps(FLOW))
    done = {}
    names = ("A-1", "A-2", "A-4", "A-5")
    assert sorted(partition_of(n, 2) for n in names) == [0, 0, 1, 1]
    for name in names:
        ran = cli(parts, "run", str(flow), "--id", name, "--json", "--tools",
                  "tests.standins.standins")
        assert ran.returncode == 0, ran.stderr
        done[name] = json.loads(ran.stdout)
    assert {d["status"] for d in done.values()} == {"completed"}
    stored = [events_by_run(c, parts.schema or "") for c in clusters]
    for name in done:
        uid = str(run_uuid(name))
        assert uid in stored[partition_of(name, 2)] and uid not in stored[1 - partition_of(
            name, 2)]
    projected = cli(parts, "projection", "run", "--json")
    assert projected.returncode == 0, projected.stderr
    listed = json.loads(cli(parts, "list", "--json").stdout)
    assert sorted(r["run_id"] for r in listed) == sorted(done)


def test_changing_the_partitions_of_a_store_is_refused(
        clusters: tuple[Cluster, Cluster], parts: Settings, registry: Registry) -> None:
    with Saga(parts, registry=registry) as saga:
        submit(saga, 2)
    swapped = replace(parts, database_url=parts.partitions[1],
                      partitions=parts.partitions[::-1])
    with pytest.raises(ConfigError, match="partition 2 of 2, but the configuration makes "
                                          "it partition 1 of 2: changing"):
        Saga(swapped, registry=registry).app  # noqa: B018
    alone = replace(parts, partitions=())  # the first partition's runs only: refused
    with pytest.raises(ConfigError, match="is partition 1 of 2: configure every partition"):
        Saga(alone, registry=registry).app  # noqa: B018
    import psycopg

    with psycopg.connect(clusters[1].url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE third")
    try:
        third = parts.partitions[1].rsplit("/", 1)[0] + "/third"
        more = replace(parts, partitions=(*parts.partitions, third))
        with pytest.raises(ConfigError, match="partition 1 of 2, but the configuration "
                                              "makes it partition 1 of 3"):
            Saga(more, registry=registry).app  # noqa: B018
    finally:
        with psycopg.connect(clusters[1].url, autocommit=True) as conn:
            conn.execute("DROP DATABASE third")


def test_a_store_with_runs_cannot_become_a_partition(
        clusters: tuple[Cluster, Cluster], parts: Settings, registry: Registry) -> None:
    single = replace(parts, partitions=())
    with Saga(single, registry=registry) as saga:
        submit(saga, 1)
    with pytest.raises(ConfigError, match="holds runs recorded without partitions"):
        Saga(parts, registry=registry).app  # noqa: B018


def test_commands_that_read_one_database_refuse_a_partitioned_store(
        parts: Settings, registry: Registry) -> None:
    from saga.audit import apply_retention

    with pytest.raises(ConfigError, match="not supported yet"):
        apply_retention(parts, 30)
    with Saga(parts, registry=registry) as saga, \
            pytest.raises(ConfigError, match="one event log per partition"):
        saga.app.notifications(1, 10)


def test_a_group_commit_over_both_partitions_fails_only_the_stale_run(
        clusters: tuple[Cluster, Cluster], parts: Settings, registry: Registry) -> None:
    from saga.errors import ConcurrentWriteError

    with Saga(parts, registry=registry) as saga:
        ids = submit_to_both(saga, 8)
        first = next(i for i in ids if partition_of(i, 2) == 0)
        second = next(i for i in ids if partition_of(i, 2) == 1)
        winner, stale, other = (saga.get(first), saga.get(first), saga.get(second))
        winner.pause("tester", "first")
        saga.app.save_run(winner)
        stale.pause("tester", "late")
        other.pause("tester", "meanwhile")
        errors = saga.app.save_runs([stale, other])
        assert isinstance(errors[0], ConcurrentWriteError) and errors[1] is None
        assert [e["payload"].get("reason") for e in saga.history(first)
                if e["type"] == "RunPaused"] == ["first"]
        assert [e["payload"].get("reason") for e in saga.history(second)
                if e["type"] == "RunPaused"] == ["meanwhile"]


def test_the_read_model_catches_every_partition_up_in_turn(parts: Settings,
                                                           registry: Registry) -> None:
    from saga.projection import Projections

    with Saga(parts, registry=registry) as saga:
        ids = submit_to_both(saga, 8)
        assert {partition_of(i, 2) for i in ids} == {0, 1}
        projection = saga.projection
        assert isinstance(projection, Projections)
        assert projection.catch_up(limit=2) == 2
        assert projection.positions()[0] > 0 and projection.positions()[1] > 0
        applied = 2 + projection.catch_up()
        assert projection.lag() == 0 and len(projection.runs(limit=None)) == len(ids)
        assert projection.position() == sum(projection.positions()) == projection.head()
        # ids need not be contiguous (the default recorder's follow transaction ids)
        assert projection.rebuild() == applied
        assert projection.position() == projection.head()
        assert sorted(r["run_id"] for r in projection.runs(limit=3)) == sorted(
            r["run_id"] for r in saga.list_runs(limit=3))


def test_a_child_run_lives_in_its_own_partition_not_its_parent_s(
        clusters: tuple[Cluster, Cluster], parts: Settings, registry: Registry) -> None:
    from saga.domain import child_run_id

    child_yaml = str(ROOT / "tests" / "compositions" / "child.yaml")
    parent = {"name": "parent", "steps": [
        {"id": "nested", "use": child_yaml, "args": {"who": "ada"}},
        {"id": "last", "tool": "effect", "args": {"value": "{{ nested.outputs.made }}"}}]}
    name = next(f"P-{i}" for i in range(100)
                if partition_of(f"P-{i}", 2) != partition_of(child_run_id(f"P-{i}",
                                                                         "nested", 0), 2))
    with Saga(parts, registry=registry) as saga:
        run = saga.run(saga.load(parent), run_id=name)
        assert run.status == "completed"
        assert run.steps["last"]["output"]["value"] == "ada"
        child = run.steps["nested"]["output"]["run_id"]
        assert saga.get(child).status == "completed"
        assert saga.status(name)["children"][0]["status"] == "completed"
        stored = [events_by_run(c, parts.schema or "") for c in clusters]
        for run_id in (name, child):
            uid = str(run_uuid(run_id))
            assert uid in stored[partition_of(run_id, 2)]
            assert uid not in stored[1 - partition_of(run_id, 2)]


def test_the_list_pages_and_searches_across_partitions(parts: Settings,
                                                       registry: Registry) -> None:
    """Issue 39: ``offset`` pages the merge of every partition (each run once), and
    ``prefix`` finds a run whichever partition holds it."""
    with Saga(parts, registry=registry) as saga:
        ids = submit_to_both(saga, 6)
        every = [r["run_id"] for r in saga.list_runs(limit=None)]
        pages = [[r["run_id"] for r in saga.list_runs(limit=2, offset=at)]
                 for at in range(0, len(ids) + 2, 2)]
        assert [r for page in pages for r in page] == every and sorted(every) == sorted(
            str(saga.get(i).id) for i in ids)
        for run_id in every:
            assert [r["run_id"] for r in saga.list_runs(prefix=run_id[:8])] == [run_id]


def test_payloads_encrypted_at_rest_over_partitions(clusters: tuple[Cluster, Cluster],
                                                     parts: Settings, tmp_path: Path) -> None:
    """Each partition keeps its runs' data keys beside their events: a run in either
    partition is sealed, read back by a new process with the key, and verified without."""
    import base64

    import psycopg

    key = base64.urlsafe_b64encode(os.urandom(32)).decode()
    sealed = {"SAGA_ENCRYPTION_KEY_ENV": "PART_KEY", "PART_KEY": key}
    flow = tmp_path / "echo.json"
    flow.write_text(json.dumps({"name": "echo", "inputs": [{"name": "who"}], "steps": [
        {"id": "a", "tool": "echo", "args": {"hi": "{{ inputs.who }}"}}]}))
    names = ("A-1", "A-4")
    assert sorted(partition_of(n, 2) for n in names) == [0, 1]
    for name in names:
        ran = cli(parts, "run", str(flow), "--id", name, "--input", "who=PARTSECRET42",
                  "--json", **sealed)
        assert ran.returncode == 0, ran.stderr
    for c in clusters:
        with psycopg.connect(c.url) as conn:
            states = conn.execute(f'SELECT state FROM "{parts.schema}".saga_events').fetchall()
        assert states and not any(b"PARTSECRET42" in bytes(s[0]) for s in states)
        assert any(b"_sealed_" in bytes(s[0]) for s in states)
    for name in names:
        history = cli(parts, "history", name, "--json", **sealed)
        assert history.returncode == 0 and "PARTSECRET42" in history.stdout, history.stderr
    verified = cli(parts, "audit", "verify", "--all", SAGA_ENCRYPTION_KEY_ENV="PART_KEY")
    assert verified.returncode == 0 and "2 runs checked, 0 broken" in verified.stdout, \
        verified.stdout + verified.stderr
    refused = cli(parts, "history", "A-4", SAGA_ENCRYPTION_KEY_ENV="PART_KEY")
    assert refused.returncode == 2 and "encrypted at rest" in refused.stderr
