#!/usr/bin/env bash
# The long soak (issue 27): the e2e soak test on the benchmark GPT (block 64, embd 128, 4 layers,
# batch 16, dropout 0.1) for 10,000 steps (CI runs a tiny GPT for 1,000), printing the drift of
# live IR nodes, allocator bytes, malloc bytes in use, RSS and open files between step 200 and
# the end.
#   bench/soak.sh [steps] [tiny|benchmark]        (needs a Release build in build/)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="${TESSERA_BUILD_DIR:-$ROOT/build}/tests/e2e/e2e_soak"
[[ -x "$BIN" ]] || { echo "bench/soak.sh: $BIN not built (scripts/run build)" >&2; exit 1; }
start=$(date +%s)
TESSERA_SOAK_STEPS="${1:-10000}" TESSERA_SOAK_MODEL="${2:-benchmark}" "$BIN" --gtest_brief=1
echo "soak: $(( $(date +%s) - start )) s"
