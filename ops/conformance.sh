#!/usr/bin/env bash
# The conformance simulator (tests/conformance): generated compositions driven by real
# worker processes under kills, zombies, pauses, cancels, approvals, signals and redrives,
# checked against saga's promises and an oracle.
#
# Usage: ops/conformance.sh [--minutes M] [--seed S] [--store sqlite|postgres]
#                           [--examples N] [--case FILE] [--no-shrink] [pytest args]
#   (no option)     the CI budget: SIM_EXAMPLES cases per store (default 4), seed 38
#   --minutes M     the long mode: cases for M minutes per store, chains up to 300 steps,
#                   worker churn; prints the totals (cases, operations, kills) at the end
#   --seed S        Hypothesis's seed: the same S generates the same cases and operations
#   --store S       one store only (default: both; PostgreSQL at SAGA_TEST_DATABASE_URL)
#   --case FILE     replay the case a failure saved (its message names the file)
#   --no-shrink     report the first failing case as found, without shrinking it
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export SAGA_TEST_DATABASE_URL=${SAGA_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/test}
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) export SIM_MINUTES="$2"; shift 2 ;;
    --seed) export SIM_SEED="$2"; shift 2 ;;
    --store) export SIM_STORE="$2"; shift 2 ;;
    --examples) export SIM_EXAMPLES="$2"; shift 2 ;;
    --case) SIM_CASE="$(realpath "$2")"; shift 2 ;;
    --no-shrink) export SIM_SHRINK=0; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "${SIM_SEED:-}" ] && [ -n "${SIM_MINUTES:-}" ]; then
  SIM_SEED=$(( RANDOM * 32768 + RANDOM )); export SIM_SEED
fi
echo "conformance: seed ${SIM_SEED:-38}, store ${SIM_STORE:-both}, minutes ${SIM_MINUTES:-0} (CI budget otherwise)" >&2
export SIM_STATS=${SIM_STATS:-$(mktemp -t saga-conformance-stats.XXXXXX)}
if [ -n "${SIM_CASE:-}" ]; then
  exec python -m tests.conformance.runner "$SIM_CASE" ${SIM_STORE:+--store "$SIM_STORE"}
fi
status=0
python -m pytest -p no:cacheprovider --timeout=0 -q tests/conformance "${args[@]}" || status=$?
python - "$SIM_STATS" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
for store in sorted({r["store"] for r in rows}):
    mine = [r for r in rows if r["store"] == store]
    total = lambda k: sum(r[k] for r in mine)
    print(f"conformance {store}: {len(mine)} cases, {total('steps')} steps, {total('ops')} "
          f"operations, {total('kills')} kills, {total('zombies')} zombies, "
          f"{total('reads')} reads, {total('commands')} commands, "
          f"{sum(r.get('migrations', 0) for r in mine)} migrations, "
          f"{sum(r.get('resets', 0) for r in mine)} resets, "
          f"{sum(r.get('labels', 0) for r in mine)} label changes, "
          f"{sum(r['failed'] for r in mine)} failing", file=sys.stderr)
PY
echo "conformance: seed ${SIM_SEED:-38} (replay with: bash ops/conformance.sh --seed ${SIM_SEED:-38})" >&2
exit $status
