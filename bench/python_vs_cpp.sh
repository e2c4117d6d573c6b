#!/usr/bin/env bash
# The benchmark GPT's training step three ways, side by side in one run: Tessera's C++ API
# (bench_gpt_step), the same model as a PyTorch file run on Tessera from Python
# (bench/gpt_step_tessera.py over bench/gpt_step_torch.py's model) and PyTorch 1.13 eager
# (bench/gpt_step_torch.py, /usr/bin/python3, glibc malloc thresholds raised so torch does not
# return and refetch its buffers every step).
#
#   bench/python_vs_cpp.sh [BUILD_DIR]     (default build/; builds nothing; needs build/pyvenv with tessera installed)
#   env: ROUNDS (5), STEPS (30 timed steps per run), THREADS (2)
#
# Each round runs each side once (one process each, order rotated); a cell is the median over
# rounds of each process's median step; torch's best is also shown (best process).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="${1:-build}"
bin="$build/bench/bench_gpt_step"
venv_py="$build/pyvenv/bin/python"
rounds="${ROUNDS:-5}"
steps="${STEPS:-30}"
threads="${THREADS:-2}"
[[ -x $bin ]] || { echo "python_vs_cpp: no $bin (cmake --build $build --target bench_gpt_step)" >&2; exit 1; }
"$venv_py" -c 'import tessera' 2>/dev/null || { echo "python_vs_cpp: $venv_py cannot import tessera" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "python_vs_cpp: /usr/bin/python3 cannot import torch" >&2; exit 1; }

results=$(mktemp)
trap 'rm -f "$results"' EXIT
echo "GPT training step: C++ API vs Python on Tessera vs PyTorch eager; $rounds rounds, $steps timed steps, OMP_NUM_THREADS=$threads"
echo "host: $(nproc) CPUs; load at start:$(uptime | sed 's/.*load average://')"

run_side() {
  local out
  case $1 in
    cpp) out=$(OMP_NUM_THREADS=$threads "$bin" --steps "$steps") ;;
    python) out=$(OMP_NUM_THREADS=$threads "$venv_py" "$here/gpt_step_tessera.py" --steps "$steps") ;;
    torch) out=$(OMP_NUM_THREADS=$threads MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728 \
                 /usr/bin/python3 "$here/gpt_step_torch.py" "$threads" --steps "$steps") ;;
  esac
  local ms line
  line=$(grep '^RESULT ' <<<"$out" | tail -1)
  ms=$(sed 's/.*median_ms=\([^ ]*\).*/\1/' <<<"$line")
  [[ $1 == python ]] && echo "trace $(sed 's/.*trace_ms=\([^ ]*\).*/\1/' <<<"$line")" >>"$results"
  [[ -n $ms ]] || { echo "python_vs_cpp: $1 printed no RESULT line:" >&2; printf '%s\n' "$out" >&2; exit 1; }
  echo "$1 $ms" >>"$results"
  printf '  round %d  %-7s median %8.2f ms\n' "$r" "$1" "$ms"
}

sides=(cpp python torch)
for ((r = 1; r <= rounds; ++r)); do
  for ((i = 0; i < 3; ++i)); do run_side "${sides[(i + r) % 3]}"; done
done
echo "load at end:$(uptime | sed 's/.*load average://')"
awk '
function median(list,   a, n, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; --j) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
$1 == "trace" { tr = tr " " $2; next }
{ ms[$1] = ms[$1] " " $2; if (!($1 in best) || $2 + 0 < best[$1]) best[$1] = $2 + 0 }
END {
  printf "\n%-28s %12s %10s\n", "side", "median ms", "best ms"
  printf "%-28s %12.2f %10.2f\n", "C++ API (bench_gpt_step)", median(ms["cpp"]), best["cpp"]
  printf "%-28s %12.2f %10.2f\n", "Python on Tessera", median(ms["python"]), best["python"]
  printf "%-28s %12.2f %10.2f\n", "PyTorch 1.13 eager", median(ms["torch"]), best["torch"]
  printf "(Python on Tessera: %.2f ms of its step is tracing in Python, median)\n", median(tr)
  printf "\nPython / C++ = %.3f (goal <= 1.1)\n", median(ms["python"]) / median(ms["cpp"])
  printf "Python on Tessera / PyTorch eager = %.3f (medians), %.3f (best processes)\n", median(ms["python"]) / median(ms["torch"]), best["python"] / best["torch"]
}' "$results"
