"""Statements prepared on each connection of a pool and run straight through libpq.

psycopg's cursor converts a query's placeholders, adapts each parameter through its
dumpers and keeps its own cache of prepared statements on every execution. For the
statement saga runs most (a step's append) those layers cost about as much CPU as the
rest of the append's client side, so :class:`PreparedStatements` sends it as psycopg's
own cursor would at the protocol level (prepared, parameters and results in binary where
given) without them.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from typing import Any

from psycopg import Connection, errors, pq
from psycopg.generators import execute

_MARK = re.compile(rb"%[sb]")


def numbered(statement: bytes) -> bytes:
    """A psycopg statement (``%s``/``%b`` placeholders) with libpq's ``$1``, ``$2``..."""
    if b"%%" in statement:
        raise ValueError("a literal % in a statement to number")
    marks = iter(range(1, 1 << 16))
    return _MARK.sub(lambda _: b"$%d" % next(marks), statement)


class PreparedStatements:
    """Named statements, each prepared on a connection the first time it runs there."""

    def __init__(self) -> None:
        # A pool's connections come and go (a reconnect makes new ones): what each has
        # prepared goes with it.
        self._prepared: weakref.WeakKeyDictionary[Connection[Any], set[bytes]] = \
            weakref.WeakKeyDictionary()

    def run(self, conn: Connection[Any], name: bytes, query: bytes,
            params: list[bytes | None], formats: list[int]) -> pq.abc.PGresult:
        """Execute ``query`` (``$n`` placeholders) on ``conn``, prepared as ``name``,
        with ``params`` already in the ``formats`` given (0 text, 1 binary) and binary
        results. A statement that fails raises psycopg's error for it, as a cursor does
        (so a library's handler of psycopg's errors maps it as usual)."""
        names = self._prepared.get(conn)
        if names is None:
            names = self._prepared[conn] = set()
        try:
            return _execute(conn, names, name, query, params, formats)
        except errors.InvalidSqlStatementName:
            # psycopg deallocates every statement prepared on a connection after a
            # ROLLBACK or a DROP there (to clear its own cache): prepare it again, once.
            # The statement did not run, so running it now runs it once.
            names.discard(name)
            return _execute(conn, names, name, query, params, formats)


def _execute(conn: Connection[Any], names: set[bytes], name: bytes, query: bytes,
             params: list[bytes | None], formats: list[int]) -> pq.abc.PGresult:
    """One try: prepare ``name`` unless ``names`` (those prepared on ``conn``) has it,
    then execute it."""
    pgconn = conn.pgconn
    if name not in names:
        pgconn.send_prepare(name, query)
        # Already there: prepared by a call whose end this process did not see.
        with contextlib.suppress(errors.DuplicatePreparedStatement):
            _check(conn, conn.wait(execute(pgconn))[-1], pq.ExecStatus.COMMAND_OK)
        names.add(name)
    pgconn.send_query_prepared(name, params, param_formats=formats,
                               result_format=pq.Format.BINARY)
    return _check(conn, conn.wait(execute(pgconn))[-1], pq.ExecStatus.TUPLES_OK)


def _check(conn: Connection[Any], result: pq.abc.PGresult,
           status: pq.ExecStatus) -> pq.abc.PGresult:
    if result.status != status:
        raise errors.error_from_result(result, encoding=conn.info.encoding)
    return result
