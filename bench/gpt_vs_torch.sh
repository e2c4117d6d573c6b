#!/usr/bin/env bash
# Training-step time of the benchmark GPT (vocab 114, block 64, embd 128, 4 heads, 4 layers,
# batch 16, AdamW, no dropout): Tessera (bench/gpt_step.cpp) against the same model in PyTorch
# (bench/gpt_step_torch.py, Debian's python3-torch) on the CPU, side by side in one run.
#
#   bench/gpt_vs_torch.sh [BUILD_DIR]      (default build/; builds nothing)
#   env: ROUNDS (3), STEPS (30 timed steps per run), THREADS ("1 2")
#
# Each round runs every (side, thread count) once, the two sides alternating and the order
# flipped every round; a cell is the median over rounds of each run's median step time. Each
# side's best is its fastest thread count, and the ratio is tessera_best / torch_best (< 1:
# Tessera is faster). Leaves OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as the machine exports them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="${1:-build}"
bin="$build/bench/bench_gpt_step"
py=/usr/bin/python3
rounds="${ROUNDS:-3}"
steps="${STEPS:-30}"
threads="${THREADS:-1 2}"
alloc=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728)  # issue 28: glibc otherwise maps and unmaps each step's activations

[[ -x $bin ]] || { echo "gpt_vs_torch: no $bin; build it first (cmake --build $build --target bench_gpt_step)" >&2; exit 1; }
$py -c 'import torch' 2>/dev/null || { echo "gpt_vs_torch: $py cannot import torch (apt install python3-torch)" >&2; exit 1; }

results=$(mktemp)
logs=$(mktemp)
trap 'rm -f "$results" "$logs"' EXIT

echo "GPT training step, tessera vs torch: $rounds rounds x threads {$threads}, $steps timed steps per run"
echo "host: $(nproc) CPUs; load at start:$(uptime | sed 's/.*load average://')"
echo "torch runs with ${alloc[*]} (its best; bench/gpt_floor.sh takes several processes and PyTorch 2.x and JAX too)"
echo "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>} (left as exported)"

run_side() {  # side threads
  local out
  if [[ $1 == tessera ]]; then
    out=$(OMP_NUM_THREADS=$2 "$bin" --steps "$steps")
  else
    out=$(env "${alloc[@]}" OMP_NUM_THREADS=$2 $py "$here/gpt_step_torch.py" "$2" --steps "$steps")
  fi
  printf '%s\n' "$out" >>"$logs"
  local line
  line=$(grep '^RESULT ' <<<"$out" | tail -1)
  [[ -n $line ]] || { echo "gpt_vs_torch: $1 at $2 threads printed no RESULT line:" >&2; printf '%s\n' "$out" >&2; exit 1; }
  echo "$line" >>"$results"
  printf '  round %d  %-7s threads=%s  median %8.2f ms\n' "$r" "$1" "$2" "$(sed 's/.*median_ms=\([^ ]*\).*/\1/' <<<"$line")"
}

for ((r = 1; r <= rounds; ++r)); do
  if ((r % 2)); then order="tessera torch"; else order="torch tessera"; fi
  for t in $threads; do
    for side in $order; do run_side "$side" "$t"; done
  done
done
echo "load at end:$(uptime | sed 's/.*load average://')"

awk -v rounds="$rounds" '
function field(k,   i, kv) { for (i = 3; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "" }
function median(list,   a, n, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; --j) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
$1 == "RESULT" {
  side = $2; t = field("threads"); key = side SUBSEP t
  ms[key] = ms[key] " " field("median_ms")
  rss[key] = rss[key] " " field("maxrss_mb")
  if (side == "tessera") { peak[key] = peak[key] " " field("peak_mb"); ex[key] = ex[key] " " field("exec_ms") }
  if (!(t in seen)) { seen[t] = 1; order[++nt] = t }
}
END {
  printf "\n%-8s %8s %12s %12s %10s %12s\n", "side", "threads", "median ms", "in graph ms", "peak MiB", "max RSS MiB"
  for (s = 1; s <= 2; ++s) {
    side = s == 1 ? "tessera" : "torch"
    for (i = 1; i <= nt; ++i) {
      t = order[i]; key = side SUBSEP t
      if (!(key in ms)) continue
      m = median(ms[key])
      printf "%-8s %8s %12.2f %12s %10s %12.1f\n", side, t, m, side == "tessera" ? sprintf("%.2f", median(ex[key])) : "-",
        side == "tessera" ? sprintf("%.1f", median(peak[key])) : "-", median(rss[key])
      if (!(side in best) || m < best[side]) { best[side] = m; bt[side] = t }
    }
  }
  print ""
  for (s = 1; s <= 2; ++s) {
    side = s == 1 ? "tessera" : "torch"
    if (side in best) printf "%-8s best: %.2f ms/step at %s thread(s)\n", side, best[side], bt[side]
  }
  if (("tessera" in best) && ("torch" in best))
    printf "ratio tessera_best / torch_best = %.3f  (%s)\n", best["tessera"] / best["torch"],
      best["tessera"] < best["torch"] ? sprintf("tessera %.2fx faster", best["torch"] / best["tessera"]) \
                                      : sprintf("torch %.2fx faster", best["tessera"] / best["torch"])
  print "(cells: median over " rounds " rounds of each run'"'"'s median step; in graph ms: tessera time running the compiled step graph (mean), the rest of the step is tracing, autodiff and graph lookup; peak MiB: tessera allocator high-water mark over the timed steps; max RSS: whole process, torch includes ~the interpreter and libtorch)"
}' "$results"
echo
echo "last losses (sanity, same batches; inits differ):"
grep '^RESULT' "$results" | awk '{ for (i = 3; i <= NF; ++i) if ($i ~ /^last_loss=/) l[$2 " " $3] = $i } END { for (k in l) print "  " k " " l[k] }' | sort
