#!/usr/bin/env bash
# The fused attention Step against its decomposition (TESSERA_DISABLE_PASSES=attention), one
# build, alternated process by process (order flipped every round) at 1 and 2 threads: the
# benchmark GPT's evaluation (forward + loss, where the Step applies) and its training step
# (where the backward reads the probabilities, so nothing fuses: the same plan both ways).
# Medians per side, their ratio and the load before and after.
#   bench/attention_ab.sh [BUILD_DIR]        (ROUNDS=5 STEPS=20 by default)
set -euo pipefail
build="${1:-build}" rounds="${ROUNDS:-5}" steps="${STEPS:-20}"
bin="$build/bench/bench_gpt_step"
[[ -x $bin ]] || { echo "attention_ab: no $bin (build the bench_gpt_step target)" >&2; exit 2; }
echo "load before: $(uptime)"
runs=()
for round in $(seq 1 "$rounds"); do
  order=(fused decomposed); (( round % 2 )) || order=(decomposed fused)
  for threads in 1 2; do
    for mode in eval train; do
      for who in "${order[@]}"; do
        off=""; [[ $who == decomposed ]] && off=attention
        flag=""; [[ $mode == eval ]] && flag=--eval
        ms=$(TESSERA_DISABLE_PASSES=$off OMP_NUM_THREADS=$threads "$bin" --steps "$steps" --warmup 3 $flag 2>&1 |
             sed -n 's/^RESULT.*median_ms=\([0-9.]*\).*/\1/p')
        runs+=("$round $threads $mode $who $ms")
      done
    done
  done
done
echo "load after: $(uptime)"
printf '%s\n' "${runs[@]}" | python3 -c '
import sys, statistics as st
rows = [l.split() for l in sys.stdin if l.strip()]
for t in ("1", "2"):
    for mode in ("eval", "train"):
        get = lambda who: [float(r[4]) for r in rows if r[1] == t and r[2] == mode and r[3] == who]
        f, d = get("fused"), get("decomposed")
        print(f"threads {t} {mode:5}: fused {st.median(f):8.2f} ms, decomposed {st.median(d):8.2f} ms, fused/decomposed "
              f"{st.median(f) / st.median(d):.3f}, median per-round ratio {st.median(a / b for a, b in zip(f, d)):.3f}")
print("every run (round, threads, mode, side, median ms):")
for r in rows: print("  " + " ".join(r))
'
