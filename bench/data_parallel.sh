#!/usr/bin/env bash
# Data-parallel scaling of `tessera train gpt` (the benchmark GPT: block 64, embd 128, 4 heads,
# 4 layers, AdamW; global batch BATCH) on this machine, tokens/s of the training step:
#   1r x 1t   one rank, OMP_NUM_THREADS=1
#   1r x 2t   one rank, OMP_NUM_THREADS=2
#   2r x 1t   mpirun -np 2 --distributed, OMP_NUM_THREADS=1 per rank (each rank half the batch)
#   2t-in x 1t  --data-parallel 2 (in-process rank threads), OMP_NUM_THREADS=1 per rank thread
# A run's figure is BATCH * 64 tokens over the median step_ms of its --log-json (the first 3 steps,
# compiles, dropped; rank 0's log under mpirun: its step includes waiting for the other rank).
# A cell is the median over ROUNDS rounds; the configurations alternate within a round. The load
# (/proc/loadavg) is printed before and after: the machine is shared. Last, one 2-rank run under
# --profile gives the share of rank 0's time in collective Steps (communication not hidden), and
# TESSERA_MPI_WAIT_SPLIT splits each rank's all-reduce time after the 3 warm-up steps into waiting
# for the other rank, the signature exchange and the transfer.
#
#   bench/data_parallel.sh [BUILD_DIR]     (default build/; builds nothing)
#   env: ROUNDS (3), STEPS (15), BATCH (16)
set -euo pipefail
build="${1:-build}"
tessera="$build/tools/tessera/tessera"
rounds="${ROUNDS:-3}"
steps="${STEPS:-15}"
batch="${BATCH:-16}"
[[ -x $tessera ]] || { echo "data_parallel: no $tessera; build it first (cmake --build $build --target tessera_cli)" >&2; exit 1; }
command -v mpirun > /dev/null || { echo "data_parallel: no mpirun (apt-get install openmpi-bin libopenmpi-dev)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(train gpt --device cpu --steps "$steps" --batch "$batch" --block 64 --embd 128 --heads 4 --layers 4
      --eval-every 100000 --seed 7)

# tokens/s of one run's log
rate() {
  /usr/bin/python3 - "$1" "$batch" <<'PY'
import json, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[1])][3:]
print("%.0f" % (int(sys.argv[2]) * 64 / (statistics.median(ms) / 1000)))
PY
}
run() {  # name, then the command's environment and arguments
  local name=$1 log="$dir/$1.jsonl"
  shift
  rm -f "$log"*
  "$@" --log-json "$log" > "$dir/$name.out" 2>&1 || { cat "$dir/$name.out"; echo "data_parallel: $name failed" >&2; exit 1; }
  echo "$name $(rate "$log")" >> "$dir/results"
}

steal() { awk '/^cpu / { print $9 }' /proc/stat; }  # jiffies the hypervisor ran others on our CPUs
steal0=$(steal)
echo "== data_parallel: benchmark GPT, global batch $batch x 64 tokens, $steps steps, $rounds rounds; load $(cut -d' ' -f1-3 /proc/loadavg)"
uptime
for ((r = 1; r <= rounds; r++)); do
  run 1r_x_1t env OMP_NUM_THREADS=1 "$tessera" "${args[@]}"
  run 1r_x_2t env OMP_NUM_THREADS=2 "$tessera" "${args[@]}"
  run 2r_x_1t mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$tessera" "${args[@]}" --distributed
  run 2t-in_x_1t env OMP_NUM_THREADS=1 "$tessera" "${args[@]}" --data-parallel 2
done
/usr/bin/python3 - "$dir/results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, v = line.split()
    runs.setdefault(name, []).append(float(v))
base = statistics.median(runs["1r_x_1t"])
for name, vs in runs.items():
    m = statistics.median(vs)
    print(f"{name:12s} {m:8.0f} tokens/s  ({m / base:.2f}x 1r_x_1t)   runs: {', '.join('%.0f' % v for v in vs)}")
PY
# Communication not hidden: one profiled 2-rank run (--profile: rank 0's op table); the collective
# Steps' time is what blocks the rank: starting each all-reduce (the signature exchange, which waits
# for the other rank) and completing it where a Step needs its result (runtime/overlap.h; with
# TESSERA_COLLECTIVE_OVERLAP=0 every collective Step blocks for its whole transfer).
# TESSERA_MPI_WAIT_SPLIT=24: from the 4th step on (8 all-reduces a step: 7 buckets and the loss),
# an MPI_Barrier before each all-reduce times the wait apart from the transfer (each rank prints).
mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x TESSERA_MPI_WAIT_SPLIT=24 "$tessera" "${args[@]}" --distributed --profile "$dir/prof" --log-json "$dir/prof.jsonl" > "$dir/prof.out" 2>&1 ||
  { cat "$dir/prof.out"; echo "data_parallel: the profiled run failed" >&2; exit 1; }
awk '/^  collective / { printf "2r_x_1t: collective Steps %s ms of the profiled run, %s%% of its wall time (rank 0; exposed: starts and completions)\n", $2, $3 }' "$dir/prof/ops.txt"
/usr/bin/python3 - "$dir/prof.out" "$dir/prof.jsonl" <<'PY'
import json, re, statistics, sys
ms = [json.loads(l)["step_ms"] for l in open(sys.argv[2])][3:]
step, mean = statistics.median(ms), statistics.mean(ms)
for line in sorted(l for l in open(sys.argv[1]) if l.startswith("[mpi] rank")):
    print(line.rstrip())
    v = [float(x) for x in re.findall(r"([0-9.]+) ms", line)]
    w, a, t = v[:3]
    k = len(ms)  # the steps the split counts (the 4th on)
    if len(v) > 3:  # the part of the transfer moved in tests between Steps (overlap)
        print(f"  of the transfer, in MPI_Test calls between Steps: {v[3] / k:.2f} ms a step (the rank's own copying)")
    print(f"  per step (mean of the {k}): waiting {w / k:.2f} ms, signature exchange {a / k:.2f} ms, transfer {t / k:.2f} ms = "
          f"{(w + a + t) / k:.2f} ms of a {mean:.2f} ms step ({100 * (w + a + t) / k / mean:.1f}% not hidden; median step {step:.2f} ms)")
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg); CPU steal during the run $(( $(steal) - steal0 )) jiffies (/proc/stat)"
uptime
