#!/usr/bin/env bash
# The whole test suite: SQLite and a real PostgreSQL server, unit to end-to-end.
# Usage: ops/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check saga tests ops
mypy saga
# Without PostgreSQL (none running, none installable) its half of the suite is skipped, with
# one line saying so; in CI it is required.
if ! pg_log=$(bash ops/ensure-postgres.sh 2>&1); then
  if [ -n "${CI:-}" ]; then echo "$pg_log" >&2; exit 1; fi
  echo "ops/test.sh: ${pg_log##*$'\n'} - the PostgreSQL half of the suite will be skipped" >&2
elif [ -n "$pg_log" ]; then
  echo "$pg_log" >&2
fi
# The viewer's browser tests need Debian's chromium; without it they skip (never in CI).
bash ops/ensure-browser.sh || { [ -z "${CI:-}" ] || exit 1; echo "ops/test.sh: no chromium: the browser tests will be skipped" >&2; }
export SAGA_TEST_DATABASE_URL=${SAGA_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/test}
# Two pytest processes (pytest-xdist), each test handed to whichever is free: most tests
# wait on real processes and servers, so two share the machine's CPUs well.
# SAGA_TEST_PROCESSES=0 runs the suite in one process.
python -m pytest -n "${SAGA_TEST_PROCESSES:-2}" --dist worksteal "$@"
