#!/usr/bin/env bash
# The long soak (issue 27): the e2e soak test run for 10,000 steps (CI runs 1,000), printing
# the drift of live IR nodes, allocator bytes, RSS and open files between step 200 and the end.
#   bench/soak.sh [steps]        (needs a Release build in build/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TESSERA_BUILD_DIR:-$ROOT/build}/tests/e2e/e2e_soak"
[[ -x "$BIN" ]] || { echo "bench/soak.sh: $BIN not built (scripts/run build)" >&2; exit 1; }
start=$(date +%s)
TESSERA_SOAK_STEPS="${1:-10000}" "$BIN" --gtest_brief=1
echo "soak: $(( $(date +%s) - start )) s"
