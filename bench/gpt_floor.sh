#!/usr/bin/env bash
# The benchmark GPT's training step against this machine's limits and against every peer at its
# best, in one run (issue 28, "Numbers to report"):
#   1. the limits (bench_machine_limits): the register-only float32 FMA peak and the bf16
#      dot-product peak on each thread count, the triad bandwidth (3 x 128 MiB arrays);
#   2. the step, ROUNDS processes of every configuration at every thread count, the order rotated
#      each round: Tessera float32 and bfloat16 autocast (bench_gpt_step, its step captured:
#      --capture, as `tessera train` runs it; CAPTURE=0 traces every step); PyTorch 1.13 eager
#      (Debian's /usr/bin/python3); PyTorch 2.x eager and torch.compile, float32 and bf16 autocast
#      (the venv of shared/peers/torch2-venv.sh); JAX's jit (build/pyenv, scripts/pyenv). Every
#      PyTorch runs with MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728 (its
#      best: glibc otherwise maps and unmaps each step's activations) and its step is bimodal across
#      processes, so each configuration's figure is its best process (fastest per-process median)
#      at its best thread count; the median over processes is printed beside it;
#   3. one profiled process per Tessera dtype at its best thread count (BENCH_PROFILE=lines): the
#      GEMM flops (the Gemm Steps' flops, and the matmuls' 2mnk alone), hence the floor = GEMM
#      flops / FMA peak and the 1.4x and 1.6x targets; the products' share of the peak (Gemm Step
#      time and flops); the rest (every other Step) against its bytes at the triad bandwidth; the
#      host's time outside Steps per step on a cache hit, by region.
#
#   bench/gpt_floor.sh [BUILD_DIR]      (default build/; builds nothing: bench_gpt_step, bench_machine_limits)
#   env: ROUNDS (3 processes per configuration and thread count), STEPS (30 timed), WARMUP (3;
#        torch.compile's first steps compile), THREADS ("1 2"),
#        PEERS ("torch1 torch2-eager torch2-compile jax"; "" for Tessera alone),
#        CAPTURE (1: Tessera's step replayed by tessera::StepCapture; 0: traced every step),
#        TORCH2 (the PyTorch 2 venv; default ~/.cache/tessera/torch2-venv, made by
#        /work/shared/peers/torch2-venv.sh DIR), JAXPY (BUILD_DIR/pyenv/bin/python)
#
# Every process is printed as it ends; the load (uptime) at the start, between rounds and at the end.
# The raw records stay in BUILD_DIR/gpt_floor/ (results.txt, profiles.txt); bench/gpt_floor_summary.py
# makes the summary from them.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="${1:-build}"
rounds="${ROUNDS:-3}" steps="${STEPS:-30}" warmup="${WARMUP:-3}" threads="${THREADS:-1 2}"
peers="${PEERS-torch1 torch2-eager torch2-compile jax}"
torch2="${TORCH2:-$HOME/.cache/tessera/torch2-venv}"
jaxpy="${JAXPY:-$build/pyenv/bin/python}"
capture=""; [[ ${CAPTURE:-1} == 0 ]] || capture="--capture"
gpt="$build/bench/bench_gpt_step" limits="$build/bench/bench_machine_limits"
alloc=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728)
for b in "$gpt" "$limits"; do
  [[ -x $b ]] || { echo "gpt_floor: no $b; build it first (cmake --build $build --target bench_gpt_step bench_machine_limits)" >&2; exit 1; }
done
load() { cut -d' ' -f1-3 /proc/loadavg; }

# The configurations: label and command (THREADS is substituted per run).
labels=(tessera-fp32 tessera-bf16)
declare -A cmd
cmd[tessera-fp32]="env OMP_NUM_THREADS=@T $gpt --steps $steps --warmup $warmup --dtype float32 $capture"
cmd[tessera-bf16]="env OMP_NUM_THREADS=@T $gpt --steps $steps --warmup $warmup --dtype bfloat16 $capture"
tpy="$here/gpt_step_torch.py --steps $steps --warmup $warmup"
for p in $peers; do
  case $p in
    torch1)
      /usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "gpt_floor: /usr/bin/python3 cannot import torch (apt install python3-torch)" >&2; exit 1; }
      labels+=(torch1-eager-fp32)
      cmd[torch1-eager-fp32]="env ${alloc[*]} OMP_NUM_THREADS=@T /usr/bin/python3 $tpy @T" ;;
    torch2-eager | torch2-compile)
      [[ -x $torch2/bin/python && -f $torch2/env.sh ]] || { echo "gpt_floor: no PyTorch 2 venv at $torch2 (make it: /work/shared/peers/torch2-venv.sh $torch2), or leave $p out of PEERS" >&2; exit 1; }
      # shellcheck disable=SC1091
      lib=$(. "$torch2/env.sh"; echo "$LD_LIBRARY_PATH")
      m=${p#torch2-}
      flag=""; [[ $m == compile ]] && flag="--compile"
      labels+=("torch2-$m-fp32" "torch2-$m-bf16")
      cmd[torch2-$m-fp32]="env LD_LIBRARY_PATH=$lib ${alloc[*]} OMP_NUM_THREADS=@T $torch2/bin/python $tpy @T $flag"
      cmd[torch2-$m-bf16]="env LD_LIBRARY_PATH=$lib ${alloc[*]} OMP_NUM_THREADS=@T $torch2/bin/python $tpy @T $flag --bf16" ;;
    jax)
      [[ -x $jaxpy ]] || { echo "gpt_floor: no $jaxpy (scripts/pyenv $build, or symlink /work/main/build/pyenv), or leave jax out of PEERS" >&2; exit 1; }
      labels+=(jax-jit-fp32)
      cmd[jax-jit-fp32]="$jaxpy $here/gpt_step_jax.py @T --steps $steps --warmup $warmup" ;;
    *) echo "gpt_floor: unknown peer '$p' (torch1 torch2-eager torch2-compile jax)" >&2; exit 2 ;;
  esac
done

keep="$build/gpt_floor"  # the raw records, for bench/gpt_floor_summary.py
mkdir -p "$keep"
results="$keep/results.txt" profiles="$keep/profiles.txt"
: >"$results"
: >"$profiles"
echo "== gpt_floor: the benchmark GPT step (vocab 114, block 64, embd 128, 4 heads, 4 layers, batch 16, AdamW)"
echo "host: $(nproc) CPUs, $(lscpu | sed -n 's/^Model name: *//p'); $(date -u '+%F %H:%M UTC'); load at start $(load)"
echo "$rounds processes per configuration and thread count {$threads}, $steps timed steps each after $warmup warm-up"
echo "PyTorch runs with ${alloc[*]}"
echo
"$limits" --threads "$threads" | tee -a "$results"
echo

n=${#labels[@]}
for ((r = 1; r <= rounds; ++r)); do
  echo "-- round $r (load $(load))"
  for t in $threads; do
    for ((i = 0; i < n; ++i)); do
      label=${labels[$(((i + r - 1) % n))]}
      c=${cmd[$label]//@T/$t}
      if ! out=$($c 2>&1); then
        echo "gpt_floor: $label at $t threads failed: $c" >&2; printf '%s\n' "$out" | tail -20 >&2; exit 1
      fi
      line=$(grep '^RESULT ' <<<"$out" | tail -1) || { echo "gpt_floor: $label printed no RESULT line:" >&2; printf '%s\n' "$out" | tail -20 >&2; exit 1; }
      echo "RUN $label t=$t round=$r ${line#RESULT }" >>"$results"
      printf '  %-20s threads=%s  median %8.2f ms  %s\n' "$label" "$t" "$(sed 's/.*median_ms=\([^ ]*\).*/\1/' <<<"$line")" \
        "$(grep -o 'p10=[^ ]*\|p90=[^ ]*\|host_ms=[^ ]*\|mode=[^ ]*\|last_loss=[^ ]*' <<<"$line" | tr '\n' ' ')"
    done
  done
done

# The profiled processes: each Tessera dtype at its best thread count (best process median).
for d in fp32 bf16; do
  t=$(awk -v l="tessera-$d" '$1 == "RUN" && $2 == l { split($3, a, "="); for (i = 5; i <= NF; ++i) if ($i ~ /^median_ms=/) { split($i, m, "="); v = m[2] + 0 }
        if (!(a[2] in best) || v < best[a[2]]) best[a[2]] = v }
      END { b = ""; for (k in best) if (b == "" || best[k] < best[b]) b = k; print b }' "$results")
  dtype=float32; [[ $d == bf16 ]] && dtype=bfloat16
  echo "-- profiled: tessera-$d at $t threads (BENCH_PROFILE=lines; every Step waited for), load $(load)"
  OMP_NUM_THREADS=$t BENCH_PROFILE=lines "$gpt" --steps "$steps" --warmup "$warmup" --dtype "$dtype" $capture |
    grep '^PROFILE\|^RESULT' | sed "s/^/$d t=$t /" | tee -a "$profiles" | grep -v '^.* region=' | sed 's/^/  /'
done
echo "load at end $(load)"
echo

/usr/bin/python3 "$here/gpt_floor_summary.py" "$results" "$profiles" "$steps"
echo "(records kept in $keep: bench/gpt_floor_summary.py $results $profiles $steps prints this summary again)"
