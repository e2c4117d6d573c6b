#!/usr/bin/env bash
# The memory budget (issue 24) on the benchmark GPT at batch 32: step time and the allocator's
# measured peak with no budget, 3/4 (rematerialization in one graph), 1/2 and 1/4 (micro-batches
# auto), against PyTorch's same model plain and with torch.utils.checkpoint on every block (peak:
# the process's max RSS growth over the run, as the CPU allocator keeps no statistics).
#
# One graph (no micro-batches) under 1/2 and 1/4 too ("0.5-1g", "0.25-1g"): the compiler's budget
# passes, batch unstacking inside the step and rematerialization, the cheaper plan by the cost rules.
#
# MODEL=vocab-peak: the seed's case instead, a model whose peak is a vocabulary-sized tensor (the
# head's logits over 12,608 tokens at batch 32, block 256: bench_gpt_step --preset vocab-peak),
# with no budget and with 1/8 of the no-budget run's measured peak: by micro-batches auto ("1/8"),
# and in one graph by batch unstacking inside the step alone ("1/8-1g": micro-batches off,
# TESSERA_DISABLE_PASSES=remat), no torch.
#
#   bench/memory_budget.sh [BUILD_DIR]     (default build/; builds nothing)
#   env: ROUNDS (3), STEPS (20 timed steps per run), THREADS (2), MODEL (gpt, vocab-peak)
#
# A cell is the median over rounds of each run's median step time; runs alternate within a round.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="${1:-build}"
bin="$build/bench/bench_gpt_step"
py=/usr/bin/python3
rounds="${ROUNDS:-3}"
steps="${STEPS:-20}"
threads="${THREADS:-2}"
[[ -x $bin ]] || { echo "memory_budget: no $bin; build it first (cmake --build $build --target bench_gpt_step)" >&2; exit 1; }

model="${MODEL:-gpt}"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
if [[ $model == vocab-peak ]]; then
  echo "vocabulary-peak model (vocab 12608, block 256, batch 32) under 1/8 of its peak: $rounds rounds, $steps timed steps, $threads threads"
  configs=("none|--preset vocab-peak" "1/8|--preset vocab-peak --memory-budget @EIGHTH@ --micro-batches auto"
           "1/8-1g|--preset vocab-peak --memory-budget @EIGHTH@")
else
  echo "benchmark GPT at batch 32 under memory budgets: $rounds rounds, $steps timed steps, $threads threads"
  configs=("none|" "0.75|--memory-budget 0.75" "0.5|--memory-budget 0.5 --micro-batches auto"
           "0.25|--memory-budget 0.25 --micro-batches auto" "0.5-1g|--memory-budget 0.5" "0.25-1g|--memory-budget 0.25"
           "torch|" "torch-ckpt|--checkpoint")
fi
echo "host: $(nproc) CPUs; load at start:$(uptime | sed 's/.*load average://')"
eighth=""  # bytes: 1/8 of the first no-budget run's measured peak
for ((r = 0; r < rounds; ++r)); do
  for c in "${configs[@]}"; do
    name=${c%%|*} flags=${c#*|}
    flags=${flags/@EIGHTH@/$eighth}
    if [[ $name == torch* ]]; then
      # shellcheck disable=SC2086
      line=$(cd "$here" && OMP_NUM_THREADS=$threads $py gpt_step_torch.py "$threads" --steps "$steps" --batch 32 $flags | grep '^RESULT')
    else
      # shellcheck disable=SC2086
      off=""  # the vocabulary-peak one-graph run: unstacking alone
      [[ $name == 1/8-1g ]] && off=remat
      # shellcheck disable=SC2086
      line=$(TESSERA_DISABLE_PASSES=$off OMP_NUM_THREADS=$threads "$bin" --steps "$steps" --batch 32 $flags | grep '^RESULT')
      if [[ $name == none && -z $eighth ]]; then
        eighth=$(sed -E 's/.* peak_mb=([0-9.]+).*/\1/' <<<"$line" | awk '{printf "%d", $1 * 1048576 / 8}')
        echo "no budget: peak $(sed -E 's/.* peak_mb=([0-9.]+).*/\1/' <<<"$line") MiB; 1/8 of it: $eighth B"
      fi
    fi
    echo "$name $line" >>"$results"
  done
done
echo "load at end:$(uptime | sed 's/.*load average://')"
$py - "$results" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, rest = line.split(" ", 1)
    kv = dict(re.findall(r"(\w+)=([\w.\-]+)", rest))
    rows.setdefault(name, []).append(kv)
base = statistics.median(float(k["median_ms"]) for k in rows["none"])
print(f"{'budget':<11}{'step ms':>10}{'x none':>8}{'peak MiB':>10}{'micro':>7}{'recomputed':>12}{'slices':>8}{'last loss':>11}")
for name, runs in rows.items():
    ms = statistics.median(float(k["median_ms"]) for k in runs)
    if name.startswith("torch"):
        peak = statistics.median(float(k["maxrss_mb"]) - float(k["base_rss_mb"]) for k in runs)
        micro, rec, sl = "-", "-", "-"
    else:
        peak = statistics.median(float(k["peak_mb"]) for k in runs)
        micro, rec, sl = runs[0]["micro_batches"], runs[0]["recomputed"], runs[0].get("unstacked", "0")
    print(f"{name:<11}{ms:>10.1f}{ms / base:>8.2f}{peak:>10.1f}{micro:>7}{rec:>12}{sl:>8}{float(runs[0]['last_loss']):>11.4f}")
EOF
