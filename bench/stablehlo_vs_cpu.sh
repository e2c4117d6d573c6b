#!/usr/bin/env bash
# The benchmark GPT's training step exported as StableHLO and run under jax for N steps (default
# 20), its losses against Tessera's cpu backend's (within 1e-4 relative):
#   bench/stablehlo_vs_cpu.sh [steps]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${TESSERA_BUILD_DIR:-$ROOT/build}"
STEPS="${1:-20}"
PY="$("$ROOT/scripts/pyenv" "$BUILD")"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
"$BUILD/tools/tessera/tessera" export --stablehlo gpt --out "$OUT/step.mlir" --steps "$STEPS"
"$PY" "$ROOT/bench/stablehlo_jax.py" "$OUT/step.mlir"
