#!/usr/bin/env bash
# Training-step time and memory of the Fashion-MNIST classifiers: Tessera (bench/cnn_step.cpp)
# against the same model in PyTorch (bench/cnn_step_torch.py) on the CPU, each peer at its best,
# side by side in one run.
#
#   bench/cnn_vs_torch.sh [BUILD_DIR]      (default build/; builds nothing)
#   env: MODEL (small | resnet), BATCH (64), ROUNDS (3 processes per side and thread count),
#        STEPS (30 timed steps per process), THREADS ("1 2"),
#        SIDES ("tessera torch1 torch2"; torch1-default adds PyTorch 1.13 with glibc's default
#        allocator settings), TORCH2 (the PyTorch 2 venv, default ~/.cache/tessera/torch2-venv,
#        made by /work/shared/peers/torch2-venv.sh DIR; torch2 is left out, with a note, without it)
#
# PyTorch at its best (issue 28): torch1 (Debian's python3-torch 1.13) and torch2 run with
# MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728 (by default glibc maps and
# unmaps each step's large activations, paying page faults), and its step varies across processes,
# so each side's figure is its best process (fastest per-process median) at its best thread
# count; the median over processes is printed beside it, and every process. Each round runs every
# (side, thread count) once, the order rotated every round. Ratios: tessera_best / peer_best
# (< 1: Tessera is faster; the issue's goal is <= 0.7 for both models).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="${1:-build}"
bin="$build/bench/bench_cnn_step"
model="${MODEL:-small}" batch="${BATCH:-64}" rounds="${ROUNDS:-3}" steps="${STEPS:-30}" threads="${THREADS:-1 2}"
sides="${SIDES:-tessera torch1 torch2}"
torch2="${TORCH2:-$HOME/.cache/tessera/torch2-venv}"
alloc=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728)

[[ -x $bin ]] || { echo "cnn_vs_torch: no $bin; build it first (cmake --build $build --target bench_cnn_step)" >&2; exit 1; }
declare -A cmd
labels=()
args="--model $model --batch $batch --steps $steps"
for s in $sides; do
  case $s in
    tessera) cmd[tessera]="env OMP_NUM_THREADS=@T $bin $args" ;;
    torch1 | torch1-default)
      /usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "cnn_vs_torch: /usr/bin/python3 cannot import torch (apt install python3-torch)" >&2; exit 1; }
      env_=""; [[ $s == torch1 ]] && env_="${alloc[*]}"
      cmd[$s]="env $env_ OMP_NUM_THREADS=@T /usr/bin/python3 $here/cnn_step_torch.py @T $args" ;;
    torch2)
      if [[ ! -x $torch2/bin/python || ! -f $torch2/env.sh ]]; then
        echo "cnn_vs_torch: no PyTorch 2 venv at $torch2 (make it: /work/shared/peers/torch2-venv.sh $torch2): torch2 left out"
        continue
      fi
      # shellcheck disable=SC1091
      lib=$(. "$torch2/env.sh"; echo "$LD_LIBRARY_PATH")
      cmd[torch2]="env LD_LIBRARY_PATH=$lib ${alloc[*]} OMP_NUM_THREADS=@T $torch2/bin/python $here/cnn_step_torch.py @T $args" ;;
    *) echo "cnn_vs_torch: unknown side '$s' (tessera torch1 torch1-default torch2)" >&2; exit 2 ;;
  esac
  labels+=("$s")
done
results=$(mktemp)
trap 'rm -f "$results"' EXIT

echo "$model CNN training step (batch $batch, Adam): sides {${labels[*]}}, $rounds processes x threads {$threads}, $steps timed steps"
echo "host: $(nproc) CPUs; $(date -u '+%F %H:%M UTC'); load at start $(cut -d' ' -f1-3 /proc/loadavg)"
echo "torch1, torch2: ${alloc[*]}; torch1-default: glibc's defaults"
n=${#labels[@]}
for ((r = 1; r <= rounds; ++r)); do
  for t in $threads; do
    for ((i = 0; i < n; ++i)); do
      side=${labels[$(((i + r - 1) % n))]}
      c=${cmd[$side]//@T/$t}
      out=$($c 2>&1) || { echo "cnn_vs_torch: $side failed: $c" >&2; echo "$out" | tail -20 >&2; exit 1; }
      line=$(grep '^RESULT ' <<<"$out" | tail -1) || { echo "cnn_vs_torch: $side printed no RESULT:" >&2; echo "$out" >&2; exit 1; }
      echo "RUN $side t=$t ${line#RESULT }" >>"$results"
      echo "  round $r $side: $(head -1 <<<"$out")"
    done
  done
done
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"

/usr/bin/python3 - "$results" <<'PY'
import re, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = line.split(); d = dict(re.findall(r'(\w+)=(\S+)', line))
    runs.setdefault(f[1], {}).setdefault(int(d["t"]), []).append(d)
best = {}
print(f"\n{'side':<15} {'threads':>7} {'best ms':>8} {'median ms':>10} {'peak MiB':>9} {'max RSS MiB':>12}  every process (ms)")
for side, per in runs.items():
    for t in sorted(per):
        rs = per[t]
        ms = [float(r["median_ms"]) for r in rs]
        rss = statistics.median(float(r["maxrss_mb"]) for r in rs)
        peak = f"{statistics.median(float(r['peak_mb']) for r in rs):.1f}" if side == "tessera" else "-"
        print(f"{side:<15} {t:7d} {min(ms):8.2f} {statistics.median(ms):10.2f} {peak:>9} {rss:12.1f}  {' '.join(f'{m:.2f}' for m in ms)}")
        if side not in best or min(ms) < best[side][0]: best[side] = (min(ms), t, statistics.median(ms), rss)
print()
for side, b in best.items():
    print(f"{side:<15} best: {b[0]:.2f} ms/step at {b[1]} thread(s) (median of its processes {b[2]:.2f}), max RSS {b[3]:.1f} MiB")
if "tessera" in best:
    for side, b in best.items():
        if side != "tessera":
            print(f"ratio tessera_best / {side}_best = {best['tessera'][0] / b[0]:.3f} (goal <= 0.7; medians: {best['tessera'][2] / b[2]:.3f});"
                  f" max RSS ratio {best['tessera'][3] / b[3]:.2f}")
print("(peak MiB: the tessera allocator high-water mark over the timed steps; max RSS: whole process, torch includes the interpreter and libtorch)")
PY
