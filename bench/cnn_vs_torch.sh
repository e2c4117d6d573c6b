#!/usr/bin/env bash
# Training-step time and memory of the Fashion-MNIST classifiers: Tessera (bench/cnn_step.cpp)
# against the same model in PyTorch (bench/cnn_step_torch.py, Debian's python3-torch) on the CPU,
# side by side in one run.
#
#   bench/cnn_vs_torch.sh [BUILD_DIR]      (default build/; builds nothing)
#   env: MODEL (small | resnet), BATCH (64), ROUNDS (3), STEPS (30 timed steps per run), THREADS ("1 2")
#
# Each round runs every (side, thread count) once, alternating sides and flipping the order
# every round; a cell is the median over rounds of each run's median step. Each side's best is
# its fastest thread count; the ratio is tessera_best / torch_best (< 1: Tessera is faster).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="${1:-build}"
bin="$build/bench/bench_cnn_step"
py=/usr/bin/python3
model="${MODEL:-small}" batch="${BATCH:-64}" rounds="${ROUNDS:-3}" steps="${STEPS:-30}" threads="${THREADS:-1 2}"

[[ -x $bin ]] || { echo "cnn_vs_torch: no $bin; build it first (cmake --build $build --target bench_cnn_step)" >&2; exit 1; }
$py -c 'import torch' 2>/dev/null || { echo "cnn_vs_torch: $py cannot import torch (apt install python3-torch)" >&2; exit 1; }
results=$(mktemp)
trap 'rm -f "$results"' EXIT

echo "$model CNN training step (batch $batch, Adam), tessera vs torch: $rounds rounds x threads {$threads}, $steps timed steps"
echo "host: $(nproc) CPUs; load at start:$(uptime | sed 's/.*load average://')"
for ((r = 1; r <= rounds; ++r)); do
  if ((r % 2)); then order="tessera torch"; else order="torch tessera"; fi
  for t in $threads; do
    for side in $order; do
      if [[ $side == tessera ]]; then
        out=$(OMP_NUM_THREADS=$t "$bin" --model "$model" --batch "$batch" --steps "$steps")
      else
        out=$(OMP_NUM_THREADS=$t $py "$here/cnn_step_torch.py" "$t" --model "$model" --batch "$batch" --steps "$steps")
      fi
      line=$(grep '^RESULT ' <<<"$out" | tail -1) || { echo "cnn_vs_torch: $side printed no RESULT:" >&2; echo "$out" >&2; exit 1; }
      echo "$line" >>"$results"
      echo "  round $r  $(head -1 <<<"$out")"
    done
  done
done
echo "load at end:$(uptime | sed 's/.*load average://')"

awk '
function field(k,   i, kv) { for (i = 3; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "" }
function median(list,   a, n, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; --j) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
$1 == "RESULT" { key = $2 " " field("threads"); ms[key] = ms[key] " " field("median_ms"); rss[key] = rss[key] " " field("maxrss_mb")
                 if ($2 == "tessera") peak[key] = peak[key] " " field("peak_mb") }
END {
  printf "\n%-8s %8s %10s %10s %12s\n", "side", "threads", "median ms", "peak MiB", "max RSS MiB"
  for (key in ms) {
    split(key, k, " "); m = median(ms[key])
    printf "%-8s %8s %10.2f %10s %12.1f\n", k[1], k[2], m, k[1] == "tessera" ? sprintf("%.1f", median(peak[key])) : "-", median(rss[key])
    if (!(k[1] in best) || m < best[k[1]]) { best[k[1]] = m; bt[k[1]] = k[2]; brss[k[1]] = median(rss[key]) }
  }
  for (s in best) printf "%-8s best: %.2f ms/step at %s thread(s), max RSS %.1f MiB\n", s, best[s], bt[s], brss[s]
  if (("tessera" in best) && ("torch" in best))
    printf "ratio tessera_best / torch_best = %.3f (goal <= 0.7); max RSS ratio %.2f\n", best["tessera"] / best["torch"], brss["tessera"] / brss["torch"]
  print "(peak MiB: the tessera allocator high-water mark over the timed steps; max RSS: whole process, torch includes the interpreter and libtorch)"
}' "$results"
