#!/usr/bin/env bash
# A long fuzzing run: tests/test_fuzz.py with many more examples per property (generated
# compositions, inputs and command lines against saga validate, run --dry-run and run).
# Usage: ops/fuzz.sh [EXAMPLES] [pytest args]     (EXAMPLES default: $SAGA_FUZZ_EXAMPLES or 5000)
set -euo pipefail
cd "$(dirname "$0")/.."
export SAGA_FUZZ_EXAMPLES=${1:-${SAGA_FUZZ_EXAMPLES:-5000}}
if [ $# -gt 0 ]; then shift; fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# No per-test time limit: a property runs until its examples are done.
exec python -m pytest -p no:cacheprovider --timeout=0 -q tests/test_fuzz.py "$@"
