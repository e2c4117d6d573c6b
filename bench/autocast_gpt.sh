#!/usr/bin/env bash
# bfloat16 autocast against float32 on the benchmark GPT (docs/architecture.md, "Autocast"):
#   1. the training step (bench_gpt_step), ROUNDS processes each, alternating float32 and bfloat16;
#      per dtype the median of the processes' median step times, and the best;
#   2. the step's products alone (bench_bf16_gemm): float32 (OpenBLAS) against bfloat16 operands;
#   3. `tessera train gpt --steps 400` in float32 and under --dtype bfloat16: held-out loss.
#   bench/autocast_gpt.sh [build dir]      (THREADS=2 CORES=0,1 ROUNDS=5 STEPS=30 SKIP_TRAIN=1)
set -euo pipefail
BUILD=${1:-${TESSERA_BUILD_DIR:-build}}
THREADS=${THREADS:-2} CORES=${CORES:-0,1} ROUNDS=${ROUNDS:-5} STEPS=${STEPS:-30}
run() { OMP_NUM_THREADS=$THREADS taskset -c "$CORES" "$@"; }
echo "== autocast_gpt: OMP_NUM_THREADS=$THREADS taskset -c $CORES, $ROUNDS rounds of $STEPS steps, load $(cut -d' ' -f1 /proc/loadavg)"
out=$(mktemp)
for r in $(seq "$ROUNDS"); do
  for d in float32 bfloat16; do run "$BUILD/bench/bench_gpt_step" --steps "$STEPS" --dtype "$d" | grep '^RESULT' | tee -a "$out"; done
done
python3 - "$out" <<'PY'
import re, statistics, sys
per = {}
for line in open(sys.argv[1]):
    kv = dict(re.findall(r'(\w+)=(\S+)', line))
    per.setdefault(kv['dtype'], []).append(float(kv['median_ms']))
f, b = per['float32'], per['bfloat16']
print(f"step ms, median of {len(f)} processes (best): float32 {statistics.median(f):.2f} ({min(f):.2f}), "
      f"bfloat16 autocast {statistics.median(b):.2f} ({min(b):.2f}); ratio {statistics.median(b) / statistics.median(f):.2f} "
      f"(best {min(b) / min(f):.2f})")
PY
rm -f "$out"
run "$BUILD/bench/bench_bf16_gemm" --reps 30
if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  for d in float32 bfloat16; do
    printf '%-9s ' "$d"; run "$BUILD/tools/tessera/tessera" train gpt --steps 400 --dtype "$d" | tail -1
  done
fi
