"""The ``sql`` tool: parameterised statements on SQLite or PostgreSQL, in one transaction.

Parameters:
    connection: a name from saga.toml ``[sql.connections]``, written in the composition
        (never a URL, never a template: a connection taken from input could reach any
        database, saga's own store included). Required.
    statement: ONE statement, written in the composition (never a template: only
        ``params`` carry values); ``params`` its parameters, a list (``?`` for SQLite,
        ``%s`` for PostgreSQL) or a mapping (``:name`` on both: it is what makes one
        statement run on SQLite and PostgreSQL alike; ``%(name)s`` too). Values are always
        bound by the driver, never formatted into the text. Stacked statements
        (``...; DROP ...``) are refused: use ``statements``.
    dynamic_sql: ``true`` lets ``statement``/``statements`` be templates: for SQL an
        operator supplies on purpose (a migration), never for values (use ``params``).
    statements: instead of ``statement``, a list of ``{statement, params}`` run in order
        in the same transaction (all or nothing).
    fetch: whether to return rows (default: whenever the statement produces rows, e.g.
        ``SELECT`` or ``... RETURNING``).
    timeout: seconds; a statement timeout on PostgreSQL, the lock wait on SQLite.
    undo_statement, undo_params: what the tool's own compensation (``compensate: true``)
        runs, on the same connection. Without ``undo_params`` the undo statement runs once
        per row the step returned, with that row as named parameters (so ``INSERT ...
        RETURNING id`` pairs with ``DELETE FROM t WHERE id = :id``), or once without
        parameters when the step returned no rows. Both are rendered before the step
        runs; to use other parts of the output, write an explicit compensate block, where
        the step's output is ``{{ output }}`` (``params: ["{{ output.rows[0].id }}"]``).
    undo_capture: ``{statement, params}``, a query run first, in the same transaction, whose
        rows are what the undo needs (``SELECT id, password FROM users WHERE id = :id``
        before an ``UPDATE``). They are undo state: kept in the undo store, never in the
        log or the output, and the undo statement runs once per captured row.

Output: ``{"rows": [{column: value}, ...], "rowcount": n}`` for the (last) statement; with
``statements`` also ``"results"``, one such object per statement. Values that are not JSON
become JSON: decimals become numbers, times ISO strings, UUIDs strings, bytes base64.

Errors: ``SQLError`` with the driver's message (not retryable; the transaction is rolled
back), ``SQLConnectionError`` when the database cannot be reached (retryable).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import sqlite3
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from saga.errors import ToolError
from saga.tools.base import UNDO, Tool, ToolContext
from saga.tools.schema import is_template

_BIND = {"type": ["array", "object"]}
PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "connection": {"type": "string", "minLength": 1},
        "statement": {"type": "string", "minLength": 1},
        "params": _BIND,
        "statements": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["statement"], "additionalProperties": False,
            "properties": {"statement": {"type": "string"}, "params": _BIND}}},
        "fetch": {"type": "boolean"},
        "timeout": {"type": "number", "minimum": 0},
        "undo_statement": {"type": "string", "minLength": 1},
        "undo_params": _BIND,
        "undo_capture": {"type": "object", "required": ["statement"],
                         "additionalProperties": False,
                         "properties": {"statement": {"type": "string", "minLength": 1},
                                        "params": _BIND}},
        "dynamic_sql": {"type": "boolean"},
    },
    "required": ["connection"],
    "additionalProperties": False,
}


def connections(config: Mapping[str, Any]) -> dict[str, str]:
    """Named connections from saga.toml ``[sql.connections]`` (a URL or ``{url = ...}``)."""
    section = config.get("sql") or {}
    named = section.get("connections", {}) if isinstance(section, dict) else {}
    out = {}
    for name, value in (named or {}).items():
        url = value.get("url") if isinstance(value, dict) else value
        if isinstance(url, str):
            out[str(name)] = url
    return out


def resolve_url(connection: str, config: Mapping[str, Any]) -> str:
    """The URL a connection name stands for, or ToolError."""
    if "://" in connection or connection.startswith("sqlite:"):
        raise ToolError("a SQL connection is a name declared in saga.toml [sql.connections], "
                        "never a URL in a step", error_type="NotAllowed", retryable=False)
    try:
        return connections(config)[connection]
    except KeyError:
        known = ", ".join(sorted(connections(config))) or "none"
        raise ToolError(f"unknown SQL connection {connection!r} (declared: {known})",
                        error_type="SQLError", retryable=False) from None


def stacked(statement: str) -> bool:
    """True when the text holds more than one statement: a ``;`` outside quotes, dollar
    quotes and comments with anything but a comment or space after it."""
    i, n, seen_end = 0, len(statement), False
    while i < n:
        c = statement[i]
        if statement.startswith("--", i):
            end = statement.find("\n", i)
            i = n if end < 0 else end
            continue
        if statement.startswith("/*", i):
            end = statement.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if seen_end and not c.isspace():
            return True
        if c in ("'", '"'):
            end = i + 1
            while end < n and statement[end] != c:
                end += 1
            i = end + 1
            continue
        if c == "$":
            tag_end = statement.find("$", i + 1)
            tag = statement[i:tag_end + 1] if tag_end > i else ""
            if tag and all(ch.isalnum() or ch == "_" for ch in tag[1:-1]):
                close = statement.find(tag, tag_end + 1)
                i = n if close < 0 else close + len(tag)
                continue
        if c == ";":
            seen_end = True
        i += 1
    return False


Fetch = bool | None | list[bool | None]


def execute(url: str, statements: list[tuple[str, Any]], fetch: Fetch = None,
            timeout: float | None = None) -> list[dict[str, Any]]:
    """Run statements in one transaction; one ``{rows, rowcount}`` per statement.
    ``fetch``: for every statement, or a list with one value per statement."""
    for statement, _ in statements:
        if stacked(statement):
            raise ToolError("one statement at a time (use `statements` for several): "
                            f"{statement[:80]!r}", error_type="NotAllowed", retryable=False)
    if url.startswith(("postgresql://", "postgres://")):
        return _postgres(url, statements, fetch, timeout)
    if url.startswith("sqlite:"):
        return _sqlite(_sqlite_path(url), statements, fetch, timeout)
    raise ToolError(f"unsupported SQL URL {url.split('://')[0]!r}: use postgresql:// or "
                    "sqlite:///path", error_type="SQLError", retryable=False)


def _sqlite_path(url: str) -> str:
    rest = url.removeprefix("sqlite:").removeprefix("//")
    path = rest[1:] if rest.startswith("/") else rest
    if not path:
        raise ToolError(f"SQLite URL {url!r} names no file (sqlite:///path.db)",
                        error_type="SQLError", retryable=False)
    return path


def _fetch(fetch: Fetch, index: int) -> bool | None:
    return fetch[index] if isinstance(fetch, list) else fetch


def _sqlite(path: str, statements: list[tuple[str, Any]], fetch: Fetch,
            timeout: float | None) -> list[dict[str, Any]]:
    if path != ":memory:" and not Path(path).parent.is_dir():
        raise ToolError(f"SQLite database directory {str(Path(path).parent)!r} does not exist",
                        error_type="SQLConnectionError", retryable=False)
    conn = sqlite3.connect(path, timeout=timeout or 30, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        results = []
        conn.execute("BEGIN")
        for i, (statement, params) in enumerate(statements):
            cur = conn.execute(statement, _bind(params, ()))
            results.append(_result(cur, _fetch(fetch, i),
                                   lambda r: dict(zip(r.keys(), r, strict=True))))
        conn.execute("COMMIT")
        return results
    except sqlite3.Error as e:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise ToolError(f"{type(e).__name__}: {e}", error_type="SQLError",
                        retryable=False) from e
    finally:
        conn.close()


def _postgres(url: str, statements: list[tuple[str, Any]], fetch: Fetch,
              timeout: float | None) -> list[dict[str, Any]]:
    try:
        import psycopg
        from psycopg.rows import dict_row
    except ImportError as e:  # pragma: no cover - psycopg is the postgres extra
        raise ToolError("PostgreSQL needs psycopg (pip install 'saga[postgres]')",
                        error_type="SQLError", retryable=False) from e
    try:
        conn = psycopg.connect(url, row_factory=dict_row, connect_timeout=10)
    except psycopg.OperationalError as e:
        raise ToolError(f"cannot connect: {e}".strip(), error_type="SQLConnectionError",
                        retryable=True) from e
    try:
        with conn:  # commits on success, rolls back on an error, closes
            if timeout:
                conn.execute("SELECT set_config('statement_timeout', %s, true)",
                             [str(int(float(timeout) * 1000))])
            results = []
            for i, (statement, params) in enumerate(statements):
                if isinstance(params, Mapping) and "%(" not in statement:
                    statement = _pyformat(statement)
                # The extended protocol (prepare=True) makes the server itself refuse a
                # second statement, whatever quoting hid it from stacked().
                cur = conn.execute(statement, _bind(params, None), prepare=True)
                results.append(_result(cur, _fetch(fetch, i), dict))
            return results
    except psycopg.Error as e:
        detail = (e.diag.message_primary if e.diag and e.diag.message_primary else str(e))
        state = f" [{e.sqlstate}]" if e.sqlstate else ""
        raise ToolError(f"{type(e).__name__}{state}: {detail}", error_type="SQLError",
                        retryable=False) from e


def _pyformat(statement: str) -> str:
    """``:name`` placeholders (SQLite's style) as psycopg's ``%(name)s``, outside quotes
    and comments, leaving ``::type`` casts alone."""
    out, i, n = [], 0, len(statement)
    while i < n:
        c = statement[i]
        if c in ("'", '"'):
            end = statement.find(c, i + 1)
            end = n - 1 if end < 0 else end
            out.append(statement[i:end + 1].replace("%", "%%"))
            i = end + 1
            continue
        if statement.startswith("--", i):
            end = statement.find("\n", i)
            end = n if end < 0 else end
            out.append(statement[i:end])
            i = end
            continue
        if c == ":" and statement.startswith("::", i):
            out.append("::")
            i += 2
            continue
        if c == ":" and i + 1 < n and (statement[i + 1].isalpha() or statement[i + 1] == "_"):
            j = i + 1
            while j < n and (statement[j].isalnum() or statement[j] == "_"):
                j += 1
            out.append(f"%({statement[i + 1:j]})s")
            i = j
            continue
        out.append("%%" if c == "%" else c)
        i += 1
    return "".join(out)


def _bind(params: Any, empty: Any) -> Any:
    if params is None:
        return empty
    if isinstance(params, Mapping):
        return dict(params)
    if isinstance(params, list | tuple):
        return tuple(params)
    raise ToolError("params must be a list or a mapping", error_type="BadParameters",
                    retryable=False)


def _result(cur: Any, fetch: bool | None, as_dict: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    if cur.description is not None and fetch is not False:
        rows = [{k: _jsonable(v) for k, v in as_dict(r).items()} for r in cur.fetchall()]
    rowcount = cur.rowcount
    if rowcount is None or rowcount < 0:
        rowcount = len(rows)
    return {"rows": rows, "rowcount": rowcount}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def make_tool(config: Mapping[str, Any]) -> Tool:
    """The ``sql`` tool, with the connections declared in ``config``."""

    def check(params: dict[str, Any]) -> list[str]:
        problems = []
        if ("statement" in params) == ("statements" in params):
            problems.append("give exactly one of statement or statements")
        if "undo_params" in params and "undo_statement" not in params:
            problems.append("undo_params needs undo_statement")
        capture = params.get("undo_capture")
        if capture is not None and ("undo_statement" not in params or "undo_params" in params):
            problems.append("undo_capture needs undo_statement (and no undo_params)")
        connection = params.get("connection")
        texts = [("statement", params.get("statement")),
                 ("undo_statement", params.get("undo_statement")),
                 ("undo_capture.statement",
                  capture.get("statement") if isinstance(capture, dict) else None),
                 *((f"statements[{i}].statement", s.get("statement"))
                   for i, s in enumerate(params.get("statements") or [])
                   if isinstance(s, dict))]
        if "statements" in params and is_template(params["statements"]):
            texts.append(("statements", params["statements"]))
        for where, text in texts:
            if isinstance(text, str) and is_template(text) and not params.get("dynamic_sql"):
                problems.append(f"{where} is a template: only params may carry values "
                                "(SQL injection)")
            elif isinstance(text, str) and stacked(text):
                problems.append(f"{where} holds more than one statement (use statements)")
        if isinstance(connection, str) and (is_template(connection) or "://" in connection
                                            or connection.startswith("sqlite:")):
            problems.append("connection must be a name declared in saga.toml "
                            "[sql.connections], not a URL or a template")
        elif isinstance(connection, str) and connection not in connections(config):
            known = ", ".join(sorted(connections(config))) or "none"
            problems.append(f"unknown SQL connection {connection!r} (declared in "
                            f"[sql.connections]: {known})")
        return problems

    def sql(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        """Runs parameterised SQL in one transaction."""
        url = resolve_url(str(params.get("connection", "")), config)
        if params.get("statements"):
            batch = [(s["statement"], s.get("params")) for s in params["statements"]]
        else:
            batch = [(params.get("statement") or "", params.get("params"))]
        capture = params.get("undo_capture")
        if isinstance(capture, dict):  # rows for the undo, read in the same transaction
            batch.insert(0, (capture.get("statement") or "", capture.get("params")))
        fetch = params.get("fetch")
        results = execute(url, batch, [True, *[fetch] * (len(batch) - 1)] if capture else fetch,
                          params.get("timeout"))
        captured = results.pop(0) if isinstance(capture, dict) else None
        out = dict(results[-1])
        if params.get("statements"):
            out["results"] = results
        if captured is not None:
            out[UNDO] = {"rows": captured["rows"]}
        return out

    def undo(params: dict[str, Any], output: Any, ctx: ToolContext) -> dict[str, Any]:
        statement = params.get("undo_statement")
        if not statement:
            raise ToolError("sql step has no undo_statement to compensate with",
                            error_type="NoCompensation", retryable=False)
        url = resolve_url(str(params.get("connection", "")), config)
        state = output.get(UNDO) if isinstance(output, dict) else None
        if "undo_params" in params:
            batch = [(statement, params["undo_params"])]
        elif isinstance(state, dict) and "rows" in state:  # captured by undo_capture
            batch = [(statement, row) for row in state["rows"]]
            if not batch:
                return {"rows": [], "rowcount": 0}
        else:
            rows = output.get("rows") if isinstance(output, dict) else None
            batch = [(statement, row) for row in rows] if rows else [(statement, None)]
        results = execute(url, batch, None, params.get("timeout"))
        return {"rows": [r for res in results for r in res["rows"]],
                "rowcount": sum(res["rowcount"] for res in results)}

    return Tool("sql", sql, undo, "Runs parameterised SQL (SQLite or PostgreSQL) in one "
                "transaction; undo_statement compensates.", "builtin", PARAMS, check)
