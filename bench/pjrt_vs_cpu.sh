#!/usr/bin/env bash
# The benchmark GPT's training step on Tessera's own cpu backend and through XLA's CPU PJRT plugin
# (pjrt:0), alternated in one run (order flipped every round): medians per backend, their ratio,
# the median of per-round ratios, and the compile time of each run (on pjrt: XLA's compiles).
#   bench/pjrt_vs_cpu.sh [BUILD_DIR]        (ROUNDS=6 THREADS=2 STEPS=20 by default)
set -euo pipefail
build="${1:-build}" rounds="${ROUNDS:-6}" threads="${THREADS:-2}" steps="${STEPS:-20}"
runs=()
for round in $(seq 1 "$rounds"); do
  order=(cpu pjrt); (( round % 2 )) || order=(pjrt cpu)
  for dev in "${order[@]}"; do
    line=$(OMP_NUM_THREADS=$threads "$build/bench/bench_gpt_step" --device "$dev" --steps "$steps" --warmup 3 2>&1 | grep '^RESULT')
    ms=$(sed -n 's/.*median_ms=\([0-9.]*\).*/\1/p' <<<"$line")
    compile=$(sed -n 's/.*compile_ms=\([0-9.]*\).*/\1/p' <<<"$line")
    loss=$(sed -n 's/.*last_loss=\([0-9.]*\).*/\1/p' <<<"$line")
    runs+=("$round $dev $ms $compile $loss")
  done
done
printf '%s\n' "${runs[@]}" | python3 -c '
import sys, statistics as st
rows = [l.split() for l in sys.stdin if l.strip()]
get = lambda dev, k: [float(r[k]) for r in rows if r[1] == dev]
cpu, pjrt = get("cpu", 2), get("pjrt", 2)
compile_cpu, compile_pjrt = st.median(get("cpu", 3)), st.median(get("pjrt", 3))
print(f"GPT step: cpu {st.median(cpu):.2f} ms, pjrt (XLA CPU) {st.median(pjrt):.2f} ms, pjrt/cpu {st.median(pjrt) / st.median(cpu):.3f},"
      f" median per-round ratio {st.median(p / c for p, c in zip(pjrt, cpu)):.3f}")
print(f"compiling per run: cpu {compile_cpu:.0f} ms, pjrt {compile_pjrt:.0f} ms (median)")
print("every run (round, device, median step ms, compile ms, last loss):")
for r in rows: print("  " + " ".join(r))
'
