"""The sql tool against a real SQLite file and a real PostgreSQL schema."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from saga.config import Settings
from saga.errors import ToolError
from saga.tools.sql import make_tool
from tests.conftest import PG_URL
from tests.tools.test_common import FAIL, call, chain, engine, undo


@dataclass
class Db:
    """One database to test against, with its driver's placeholder style."""

    kind: str
    url: str
    table: str

    def q(self, name: str) -> str:
        """A named placeholder in this driver's style."""
        return f":{name}" if self.kind == "sqlite" else f"%({name})s"

    @property
    def p(self) -> str:
        """A positional placeholder in this driver's style."""
        return "?" if self.kind == "sqlite" else "%s"

    @property
    def config(self) -> dict[str, Any]:
        return {"sql": {"connections": {"main": self.url}}}


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Db]:
    if request.param == "sqlite":
        d = Db("sqlite", f"sqlite:///{tmp_path / 'test.db'}", "items")
        schema = None
    else:
        import psycopg

        schema = f"tools_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        d = Db("postgres", PG_URL, f'"{schema}".items')
    tool = make_tool(d.config)
    call(tool, {"connection": "main", "statement": f"CREATE TABLE {d.table} "
                "(id INTEGER PRIMARY KEY, name TEXT NOT NULL, price NUMERIC)"})
    yield d
    if schema is not None:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def rows(d: Db) -> list[dict[str, Any]]:
    return call(make_tool(d.config), {"connection": "main",
                                      "statement": f"SELECT id, name FROM {d.table} ORDER BY id"}
                )["rows"]


def test_parameterised_insert_and_select(db: Db) -> None:
    t = make_tool(db.config)
    sneaky = "x'); DROP TABLE items; --"
    out = call(t, {"connection": "main", "statement":
                   f"INSERT INTO {db.table} (id, name, price) VALUES ({db.p}, {db.p}, {db.p})",
                   "params": [1, sneaky, 2.5]})
    assert out == {"rows": [], "rowcount": 1}
    call(t, {"connection": "main", "statement":
             f"INSERT INTO {db.table} (id, name) VALUES ({db.q('id')}, {db.q('name')})",
             "params": {"id": 2, "name": "plain"}})
    out = call(t, {"connection": "main", "statement":
                   f"SELECT id, name, price FROM {db.table} WHERE id >= {db.p} ORDER BY id",
                   "params": [1]})
    assert out == {"rows": [{"id": 1, "name": sneaky, "price": 2.5},
                            {"id": 2, "name": "plain", "price": None}], "rowcount": 2}
    quiet = call(t, {"connection": "main", "statement": f"SELECT * FROM {db.table}",
                     "fetch": False})
    assert quiet["rows"] == []
    out = call(t, {"connection": "main", "statement":
                   f"UPDATE {db.table} SET name = {db.p} WHERE id > {db.p}", "params": ["n", 0]})
    assert out == {"rows": [], "rowcount": 2}


def test_a_sql_error_is_not_retryable_and_carries_the_driver_message(db: Db) -> None:
    t = make_tool(db.config)
    with pytest.raises(ToolError) as failed:
        call(t, {"connection": "main", "statement": "SELECT * FROM no_such_table"})
    assert failed.value.error_type == "SQLError" and failed.value.retryable is False
    assert "no_such_table" in str(failed.value)


def test_statements_run_in_one_transaction_rolled_back_on_error(db: Db) -> None:
    t = make_tool(db.config)
    insert = f"INSERT INTO {db.table} (id, name) VALUES ({db.p}, {db.p})"
    with pytest.raises(ToolError) as failed:
        call(t, {"connection": "main", "statements": [
            {"statement": insert, "params": [1, "first"]},
            {"statement": insert, "params": [2, "second"]},
            {"statement": insert, "params": [1, "duplicate"]}]})
    assert failed.value.error_type == "SQLError"
    assert rows(db) == []
    out = call(t, {"connection": "main", "statements": [
        {"statement": insert, "params": [1, "first"]},
        {"statement": f"SELECT name FROM {db.table}"}]})
    assert out["rows"] == [{"name": "first"}]
    assert [r["rowcount"] for r in out["results"]] == [1, 1]


def test_undo_statement_with_params_or_with_each_returned_row(db: Db) -> None:
    t = make_tool(db.config)
    params = {"connection": "main",
              "statement": f"INSERT INTO {db.table} (id, name) VALUES ({db.p}, {db.p}), "
                           f"({db.p}, {db.p}) RETURNING id",
              "params": [1, "a", 2, "b"],
              "undo_statement": f"DELETE FROM {db.table} WHERE id = {db.q('id')}"}
    output = call(t, params)
    assert output["rows"] == [{"id": 1}, {"id": 2}]
    call(t, {"connection": "main",
             "statement": f"INSERT INTO {db.table} (id, name) VALUES (3, 'c')"})
    assert undo(t, params, output)["rowcount"] == 2
    assert rows(db) == [{"id": 3, "name": "c"}]
    explicit = {"connection": "main", "statement": f"UPDATE {db.table} SET name = 'z'",
                "undo_statement": f"UPDATE {db.table} SET name = {db.p} WHERE id = {db.p}",
                "undo_params": ["c", 3]}
    undo(t, explicit, call(t, explicit))
    assert rows(db) == [{"id": 3, "name": "c"}]
    with pytest.raises(ToolError) as nothing:
        undo(t, {"connection": "main", "statement": "SELECT 1"}, {"rows": []})
    assert nothing.value.error_type == "NoCompensation"


def test_undo_capture_reads_the_rows_to_restore_in_the_same_transaction(db: Db) -> None:
    t = make_tool(db.config)
    call(t, {"connection": "main", "statement": f"INSERT INTO {db.table} (id, name) VALUES "
             "(1, 'a'), (2, 'b'), (3, 'c')"})
    params = {"connection": "main",
              "statement": f"UPDATE {db.table} SET name = 'z' WHERE id < {db.q('n')}",
              "params": {"n": 3}, "fetch": False,
              "undo_capture": {"statement": f"SELECT id, name FROM {db.table} "
                                           f"WHERE id < {db.q('n')}", "params": {"n": 3}},
              "undo_statement": f"UPDATE {db.table} SET name = {db.q('name')} "
                                f"WHERE id = {db.q('id')}"}
    output = call(t, params)
    assert output["rowcount"] == 2 and output["rows"] == []
    assert output["_undo"] == {"rows": [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]}
    assert [r["name"] for r in rows(db)] == ["z", "z", "c"]
    assert undo(t, params, output)["rowcount"] == 2
    assert [r["name"] for r in rows(db)] == ["a", "b", "c"]
    assert undo(t, params, {"rowcount": 0, "rows": [], "_undo": {"rows": []}}) == {
        "rows": [], "rowcount": 0}  # nothing was captured: nothing to undo
    assert t.check_parameters({"connection": "main", "statement": "SELECT 1",
                               "undo_capture": {"statement": "SELECT 1"}}) == [
        "undo_capture needs undo_statement (and no undo_params)"]
    assert t.check_parameters({"connection": "main", "statement": "SELECT 1",
                               "undo_statement": "SELECT 1",
                               "undo_capture": {"statement": "SELECT '{{ inputs.x }}'"}}) == [
        "undo_capture.statement is a template: only params may carry values (SQL injection)"]


def test_parameters_and_connections_are_checked(tmp_path: Path) -> None:
    t = make_tool({"sql": {"connections": {"main": "sqlite:///x.db",
                                           "other": {"url": "sqlite:///y.db"}}}})
    assert t.check_parameters({"connection": "main", "statement": "SELECT 1"}) == []
    assert t.check_parameters({"connection": "other", "statement": "SELECT 1"}) == []
    assert t.check_parameters({"connection": "{{ inputs.db }}", "statement": "SELECT 1"}) == [
        "connection must be a name declared in saga.toml [sql.connections], not a URL or a "
        "template"]
    assert t.check_parameters({"connection": "main", "statement": "SELECT '{{ inputs.x }}'"}) \
        == ["statement is a template: only params may carry values (SQL injection)"]
    assert t.check_parameters({"connection": "main", "statement": "SELECT 1; DROP TABLE t"}) \
        == ["statement holds more than one statement (use statements)"]
    assert t.check_parameters({"connection": "main", "statement": "{{ inputs.sql }}",
                               "dynamic_sql": True}) == []
    assert t.check_parameters({"connection": "main"}) == [
        "give exactly one of statement or statements"]
    assert t.check_parameters({"connection": "nope", "statement": "SELECT 1",
                               "params": "1"}) == ["params: expected array or object, got string"]
    assert t.check_parameters({"connection": "nope", "statement": "SELECT 1"}) == [
        "unknown SQL connection 'nope' (declared in [sql.connections]: main, other)"]
    with pytest.raises(ToolError, match="unknown SQL connection 'nope'"):
        call(t, {"connection": "nope", "statement": "SELECT 1"})
    for url in ("mysql://h/db", "postgresql://postgres@127.0.0.1:5432/test",
                "sqlite:////tmp/saga-store.db"):  # a URL from a step never connects
        with pytest.raises(ToolError) as inline:
            call(t, {"connection": url, "statement": "SELECT 1"})
        assert inline.value.error_type == "NotAllowed"
    down = make_tool({"sql": {"connections": {"down": "postgresql://postgres@127.0.0.1:1/t"}}})
    with pytest.raises(ToolError) as unreachable:
        call(down, {"connection": "down", "statement": "SELECT 1"})
    assert unreachable.value.error_type == "SQLConnectionError"
    assert unreachable.value.retryable is True
    with pytest.raises(ToolError, match="one statement at a time"):
        call(t, {"connection": "main", "statement": "SELECT 1; SELECT 2"})


@pytest.mark.postgres
def test_postgres_values_become_json() -> None:
    t = make_tool({"sql": {"connections": {"pg": PG_URL}}})
    out = call(t, {"connection": "pg", "statement":
                   "SELECT 12.50::numeric AS price, 3::numeric AS n, "
                   "'2024-01-02 03:04:05+00'::timestamptz AS at, "
                   "'6f1c8c4e-0000-4000-8000-000000000000'::uuid AS id, "
                   "'\\x0102'::bytea AS raw, ARRAY[1, 2] AS xs, '{\"a\": 1}'::jsonb AS doc"})
    assert out["rows"] == [{"price": 12.5, "n": 3, "at": "2024-01-02T03:04:05+00:00",
                            "id": "6f1c8c4e-0000-4000-8000-000000000000", "raw": "AQI=",
                            "xs": [1, 2], "doc": {"a": 1}}]


def test_engine_deletes_the_inserted_row_when_a_later_step_fails(
        db: Db, sqlite_settings: Settings) -> None:
    with engine(sqlite_settings, **db.config) as s:
        plan = s.load(chain(
            {"id": "insert", "tool": "sql", "compensate": True, "args": {
                "connection": "main",
                "statement": f"INSERT INTO {db.table} (id, name) VALUES ({db.p}, {db.p}) "
                             "RETURNING id",
                "params": ["{{ inputs.id }}", "{{ inputs.name }}"],
                "undo_statement": f"DELETE FROM {db.table} WHERE id = {db.q('id')}"}},
            {"id": "rename", "tool": "sql", "args": {
                "connection": "main",
                "statement": f"UPDATE {db.table} SET name = 'renamed' WHERE id = {db.p} "
                             "RETURNING id, name",
                "params": ["{{ insert.rows[0].id }}"]},
             "compensate": {"tool": "sql", "args": {
                 "connection": "main",
                 "statement": f"UPDATE {db.table} SET name = {db.p} WHERE id = {db.p}",
                 "params": ["{{ inputs.name }}", "{{ output.rows[0].id }}"]}}},
            FAIL, inputs=[{"name": "id", "type": "integer"}, {"name": "name"}]))
        run = s.run(plan, {"id": 41, "name": "widget"})
        assert run.status == "compensated"
        assert run.steps["rename"]["output"]["rows"] == [{"id": 41, "name": "renamed"}]
        assert run.steps["rename"]["status"] == "compensated"
        assert run.steps["insert"]["status"] == "compensated"
    assert rows(db) == []


def test_a_second_statement_hidden_by_quoting_is_refused_by_the_database(db: Db) -> None:
    """An E'' string hides the ``;`` from the text check; the database itself refuses it
    (PostgreSQL's extended protocol, SQLite's one-statement execute)."""
    t = make_tool(db.config)
    hidden = (f"SELECT E'\\''; DROP TABLE {db.table}; --'" if db.kind == "postgres" else
              f"SELECT 'a'; DROP TABLE {db.table}")
    with pytest.raises(ToolError) as refused:
        call(t, {"connection": "main", "statement": hidden, "dynamic_sql": True})
    assert refused.value.error_type in ("SQLError", "InvalidParameters", "NotAllowed")
    assert rows(db) == []  # the table is still there
