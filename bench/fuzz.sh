#!/usr/bin/env bash
# Long fuzzing runs (issue 27): each libFuzzer harness of tests/fuzz/ for a given time, from its
# seeds, keeping what it finds in build-asan/fuzz-long/<name>/; prints executions and findings.
#   bench/fuzz.sh [seconds per harness, default 600] [harness ...]
# Needs the sanitized clang build (scripts/run test makes it in build-asan/).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ASAN_DIR="${TESSERA_ASAN_BUILD_DIR:-$ROOT/build-asan}"
SECS="${1:-600}"
shift || true
NAMES=("$@")
[[ ${#NAMES[@]} -gt 0 ]] || NAMES=(safetensors idx devices ir npy onnx)
for name in "${NAMES[@]}"; do
  bin="$ASAN_DIR/tests/fuzz/fuzz_$name"
  [[ -x "$bin" ]] || { echo "bench/fuzz.sh: $bin not built (scripts/run test)" >&2; exit 1; }
  corpus="$ASAN_DIR/fuzz-long/$name"
  mkdir -p "$corpus"
  log="$corpus.log"
  rc=0
  ASAN_OPTIONS=detect_leaks=1 "$bin" -max_total_time="$SECS" -print_final_stats=1 -artifact_prefix="$corpus/" \
    "$corpus" "$ROOT/tests/fuzz/seeds/$name" >"$log" 2>&1 || rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
  findings=$(find "$corpus" -maxdepth 1 -name 'crash-*' -o -maxdepth 1 -name 'leak-*' -o -maxdepth 1 -name 'timeout-*' -o -maxdepth 1 -name 'oom-*' | wc -l)
  printf '%-12s %10s executions in %s s, %s findings (exit %s; log %s)\n' "$name" "$execs" "$SECS" "$findings" "$rc" "$log"
done
