#!/usr/bin/env bash
# The benchmark GPT's training step three ways, alternated in one run (the order rotated every
# round): Tessera's own cpu backend, Tessera through XLA's CPU PJRT plugin (pjrt:0), and jax.jit
# of the same model (bench/gpt_step_jax.py under BUILD_DIR/pyenv). Prints the medians, the ratios
# pjrt/cpu, jax/cpu and pjrt/jax (of the medians, and the median of per-round ratios), the
# compile times (cpu: Tessera's compiles; pjrt: XLA's compiles; jax: the first call), the load
# average before and after, and every run.
#   bench/pjrt_vs_cpu.sh [BUILD_DIR]        (ROUNDS=6 THREADS=2 STEPS=20 by default)
# Every run is pinned to the first THREADS cores (taskset), since XLA sizes its thread pools by
# the affinity mask, not OMP_NUM_THREADS (which Tessera's cpu backend follows, and also gets).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build}" rounds="${ROUNDS:-6}" threads="${THREADS:-2}" steps="${STEPS:-20}"
cores="0-$((threads - 1))"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
runs=()
field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$line"; }  # a field of the run's RESULT line
for round in $(seq 1 "$rounds"); do
  order=(cpu pjrt jax)
  for ((i = 0; i < (round - 1) % 3; ++i)); do order=("${order[@]:1}" "${order[0]}"); done
  for dev in "${order[@]}"; do
    if [[ $dev == jax ]]; then
      cmd=("$build/pyenv/bin/python" "$ROOT/bench/gpt_step_jax.py" "$threads" --steps "$steps" --warmup 3)
    else
      cmd=("$build/bench/bench_gpt_step" --device "$dev" --steps "$steps" --warmup 3)
    fi
    line=$(OMP_NUM_THREADS=$threads taskset -c "$cores" "${cmd[@]}" 2>&1 | grep '^RESULT')
    runs+=("$round $dev $(field median_ms) $(field compile_ms) $(field last_loss) $(cut -d' ' -f1 /proc/loadavg)")
  done
done
echo "THREADS=$threads (cores $cores) ROUNDS=$rounds STEPS=$steps; load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%s\n' "${runs[@]}" | python3 -c '
import sys, statistics as st
rows = [l.split() for l in sys.stdin if l.strip()]
get = lambda dev, k: [float(r[k]) for r in rows if r[1] == dev]
ms = {d: get(d, 2) for d in ("cpu", "pjrt", "jax")}
med = {d: st.median(v) for d, v in ms.items()}
print("GPT step (median ms): " + ", ".join(f"{d} {m:.2f}" for d, m in med.items()) + " (pjrt: XLA CPU plugin; jax: jax.jit)")
for a, b in (("pjrt", "cpu"), ("jax", "cpu"), ("pjrt", "jax")):
    per_round = st.median(x / y for x, y in zip(ms[a], ms[b]))
    print(f"  {a}/{b} {med[a] / med[b]:.3f}, median per-round ratio {per_round:.3f}")
print("compiling per run (median ms): " + ", ".join(f"{d} {st.median(get(d, 3)):.0f}" for d in ("cpu", "pjrt", "jax"))
      + " (cpu, pjrt: Tessera compile_ms; jax: the first call)")
print("every run (round, device, median step ms, compile ms, last loss, 1-min load after):")
for r in rows: print("  " + " ".join(r))
'
