#!/usr/bin/env bash
# The GPT and small-CNN training steps of two builds, alternated in one run (order flipped every
# round), so a change is measured as a ratio on the same, shared machine: medians per build, the
# ratio of medians and the median of per-round ratios, then every run.
#   bench/ab_steps.sh BASE_BUILD_DIR NEW_BUILD_DIR        (ROUNDS=8 THREADS=2 by default)
# A base build of an earlier commit: git worktree add /tmp/base <commit>, then
# cmake -S /tmp/base -B /tmp/base/build -G Ninja && cmake --build /tmp/base/build --target bench_gpt_step bench_cnn_step
set -euo pipefail
[[ $# -eq 2 ]] || { sed -n 2,8p "$0" >&2; exit 2; }
base="$1/bench" new="$2/bench" rounds="${ROUNDS:-8}" threads="${THREADS:-2}"
runs=()
for round in $(seq 1 "$rounds"); do
  order=(base new); (( round % 2 )) || order=(new base)
  for who in "${order[@]}"; do
    dir=$base; [[ $who == new ]] && dir=$new
    for b in "bench_gpt_step --steps 20 --warmup 3" "bench_cnn_step --model small --steps 20 --warmup 3"; do
      ms=$(OMP_NUM_THREADS=$threads $dir/$b 2>&1 | sed -n 's/^RESULT.*median_ms=\([0-9.]*\).*/\1/p')
      runs+=("$round $who ${b%% *} $ms")
    done
  done
done
printf '%s\n' "${runs[@]}" | python3 -c '
import sys, statistics as st
rows = [l.split() for l in sys.stdin if l.strip()]
for b in ("bench_gpt_step", "bench_cnn_step"):
    get = lambda who: [float(r[3]) for r in rows if r[1] == who and r[2] == b]
    base, new = get("base"), get("new")
    print(f"{b}: base {st.median(base):.2f} ms, new {st.median(new):.2f} ms, new/base {st.median(new) / st.median(base):.3f},"
          f" median per-round ratio {st.median(n / o for n, o in zip(new, base)):.3f}")
print("every run (round, build, bench, median ms):")
for r in rows: print("  " + " ".join(r))
'
