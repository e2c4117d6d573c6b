#!/usr/bin/env bash
# The benchmark GPT's training step against this machine's limits and against every peer at its
# best, in one run (issue 28, "Numbers to report"):
#   1. the limits (bench_machine_limits): the register-only float32 FMA peak and the bf16
#      dot-product peak on each thread count, the triad bandwidth (3 x 128 MiB arrays);
#   2. the step, ROUNDS processes of every configuration at every thread count, the order rotated
#      each round: Tessera float32 and bfloat16 autocast (bench_gpt_step); PyTorch 1.13 eager
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
#        TORCH2 (the PyTorch 2 venv; default ~/.cache/tessera/torch2-venv, made by
#        /work/shared/peers/torch2-venv.sh DIR), JAXPY (BUILD_DIR/pyenv/bin/python)
#
# Every process is printed as it ends; the load (uptime) at the start, between rounds and at the end.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="${1:-build}"
rounds="${ROUNDS:-3}" steps="${STEPS:-30}" warmup="${WARMUP:-3}" threads="${THREADS:-1 2}"
peers="${PEERS-torch1 torch2-eager torch2-compile jax}"
torch2="${TORCH2:-$HOME/.cache/tessera/torch2-venv}"
jaxpy="${JAXPY:-$build/pyenv/bin/python}"
gpt="$build/bench/bench_gpt_step" limits="$build/bench/bench_machine_limits"
alloc=(MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728)
for b in "$gpt" "$limits"; do
  [[ -x $b ]] || { echo "gpt_floor: no $b; build it first (cmake --build $build --target bench_gpt_step bench_machine_limits)" >&2; exit 1; }
done
load() { cut -d' ' -f1-3 /proc/loadavg; }

# The configurations: label and command (THREADS is substituted per run).
labels=(tessera-fp32 tessera-bf16)
declare -A cmd
cmd[tessera-fp32]="env OMP_NUM_THREADS=@T $gpt --steps $steps --warmup $warmup --dtype float32"
cmd[tessera-bf16]="env OMP_NUM_THREADS=@T $gpt --steps $steps --warmup $warmup --dtype bfloat16"
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

results=$(mktemp) profiles=$(mktemp)
trap 'rm -f "$results" "$profiles"' EXIT
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
        "$(grep -o 'exec_ms=[^ ]*\|mode=[^ ]*' <<<"$line" | tr '\n' ' ')"
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
  OMP_NUM_THREADS=$t BENCH_PROFILE=lines "$gpt" --steps "$steps" --warmup "$warmup" --dtype "$dtype" |
    grep '^PROFILE\|^RESULT' | sed "s/^/$d t=$t /" | tee -a "$profiles" | grep -v '^.* region=' | sed 's/^/  /'
done
echo "load at end $(load)"
echo

/usr/bin/python3 - "$results" "$profiles" "$steps" <<'PY'
import re, statistics, sys
steps = int(sys.argv[3])
kv = lambda s: dict(re.findall(r'(\w+)=(\S+)', s))
limits, runs = {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if f[0] == "LIMIT":
        d = kv(line); limits[(f[1], int(d["threads"]))] = d
    elif f[0] == "RUN":
        d = kv(line); runs.setdefault(f[1], {}).setdefault(int(d["t"]), []).append(d)
prof = {}
for line in open(sys.argv[2]):
    f = line.split(); d = kv(line)
    p = prof.setdefault(f[0], {"t": int(d["t"]), "kind": {}, "region": {}})
    if "kind" in d: p["kind"][d["kind"]] = {k: float(d[k]) for k in ("ms", "med_ms", "flops", "bytes", "calls")}
    elif "region" in d: p["region"][d["region"]] = (float(d["med_ms"]), float(d["ms"]))
    elif f[2] == "PROFILE" and f[3] == "products": p["products"] = float(d["flops"]); p["wall"] = float(d["wall_ms"])
    elif f[2] == "RESULT": p["result"] = d

fma = {t: float(d["cpu_gflops"]) for (k, t), d in limits.items() if k == "fma_f32"}
fma_wall = {t: float(d["gflops"]) for (k, t), d in limits.items() if k == "fma_f32"}
dot = {t: float(d["cpu_gflops"]) for (k, t), d in limits.items() if k == "dot_bf16"}
triad = {t: float(d["gbs"]) for (k, t), d in limits.items() if k == "triad"}
tmax = max(fma)
peak = fma[tmax]

def best(label):
    """(best process median, its thread count, median over that thread count's processes, every process)"""
    out = None
    for t, rs in runs.get(label, {}).items():
        ms = [float(r["median_ms"]) for r in rs]
        cand = (min(ms), t, statistics.median(ms), ms)
        if out is None or cand[0] < out[0]: out = cand
    return out

print("== this machine's limits (best of 20 repetitions each)")
for t in sorted(fma):
    print(f"  {t} thread(s): float32 FMA {fma[t]:.1f} GFLOP/s per CPU-second ({fma_wall[t]:.1f} by the wall clock under this load),"
          f" bf16 dot {dot.get(t, 0):.1f}, triad {triad.get(t, 0):.1f} GB/s")

fp = prof.get("fp32")
gemm_flops = fp["kind"]["gemm"]["flops"] if fp else float("nan")
floor = gemm_flops / peak / 1e6
print(f"\n== the floor: the step's Gemm Steps {gemm_flops / 1e9:.3f} GFLOP (the matmuls' 2mnk alone "
      f"{fp['products'] / 1e9:.3f}; profiler, per step) at the {tmax}-thread FMA peak {peak:.1f} GFLOP/s")
print(f"  floor {floor:.2f} ms; goal 1.4x = {1.4 * floor:.2f} ms; resolves at 1.6x = {1.6 * floor:.2f} ms")

print("\n== the step, each configuration at its best (fastest process median at its best thread count)")
print(f"  {'configuration':<22} {'best ms':>8} {'thr':>4} {'median ms':>10} {'x floor':>8}  every process (ms) per thread count")
table = {}
for label in runs:
    b = best(label)
    table[label] = b
    every = "; ".join(f"{t}: " + " ".join(f"{float(r['median_ms']):.1f}" for r in runs[label][t]) for t in sorted(runs[label]))
    print(f"  {label:<22} {b[0]:8.2f} {b[1]:4d} {b[2]:10.2f} {b[0] / floor:8.2f}  {every}")
modes = {l: sorted({f"{r.get('version', '')} {r.get('mode', '')} malloc_mmap={r.get('malloc_mmap', '-')}".strip()
                    for rs in runs[l].values() for r in rs}) for l in runs if l.startswith("torch")}
for l, m in modes.items(): print(f"  ({l}: {', '.join(m)})")

f32, b16 = table.get("tessera-fp32"), table.get("tessera-bf16")
if f32:
    v = f32[0] / floor
    print(f"\n== Tessera float32 step {f32[0]:.2f} ms = {v:.2f}x the floor: 1.6x {'met' if v <= 1.6 else 'NOT met'}, 1.4x {'met' if v <= 1.4 else 'NOT met'}")
    for l in table:
        if not l.startswith("tessera"):
            print(f"  tessera-fp32 / {l:<20} {f32[0] / table[l][0]:.2f}" + (f"   tessera-bf16 / {l}: {b16[0] / table[l][0]:.2f}" if b16 else ""))
if f32 and b16:
    print(f"  bf16 step / fp32 step = {b16[0] / f32[0]:.2f} (goal <= 0.7; medians over processes: {b16[2] / f32[2]:.2f})")

for d, p in prof.items():
    t = p["t"]
    k = p["kind"]
    gemm = k.get("gemm", {"ms": 0, "med_ms": 0, "flops": 0, "bytes": 0})
    rest = {n: v for n, v in k.items() if n != "gemm" and not n.startswith("<")}
    rest_ms = sum(v["med_ms"] for v in rest.values())
    rest_bytes = sum(v["bytes"] for v in rest.values())
    host = k.get("<runtime>", {"med_ms": 0, "ms": 0})
    pk = dot.get(t) if d == "bf16" else fma.get(t)
    rate = gemm["flops"] / gemm["med_ms"] / 1e6 if gemm["med_ms"] else 0
    print(f"\n== profiled {d} step at {t} thread(s) (every Step waited for; per step, the median over its {steps} timed steps"
          f" of each step's sum, mean in brackets; profile wall {p['wall']:.2f} ms/step, unprofiled median {float(p['result']['median_ms']):.2f} ms)")
    print(f"  products (Gemm Steps): {gemm['med_ms']:.2f} ms ({gemm['ms']:.2f}), {gemm['flops'] / 1e9:.3f} GFLOP, {rate:.1f} GFLOP/s ="
          f" {100 * rate / fma[t]:.0f}% of the {t}-thread float32 FMA peak ({fma[t]:.1f})"
          + (f", {100 * rate / pk:.0f}% of the bf16 dot peak ({pk:.1f})" if d == "bf16" else "") + " (goal >= 83% in float32)")
    bw = triad.get(t, max(triad.values()))
    print(f"  the rest (every other Step): {rest_ms:.2f} ms for {rest_bytes / 1e6:.1f} MB by the cost rules ="
          f" {rest_bytes / bw / 1e6:.2f} ms at the {t}-thread triad {bw:.1f} GB/s ({rest_ms / (rest_bytes / bw / 1e6):.1f}x it;"
          f" goal ~5 ms)")
    print("    " + "; ".join(f"{n} {v['med_ms']:.2f} ms ({v['calls']:.0f} Steps, {v['bytes'] / 1e6:.1f} MB)" for n, v in sorted(rest.items(), key=lambda x: -x[1]["ms"])))
    r = p["region"]
    print(f"  host time outside Steps on a cache hit: {host['med_ms']:.3f} ms per step ({host['ms']:.3f}) (goal <= 1 ms); by region,"
          f" each its median (mean): " + "; ".join(f"{n} {v[0]:.3f} ({v[1]:.3f})" for n, v in sorted(r.items())))
    print("    (trace: the model's forward, loss, backward and AdamW traced by the caller, and from_vector; graph: gathering the"
          " pending tensors and the graph's key; lookup: the cache; launch: arena and slots; copy: item()'s copy and rebinding)")
    exec_gap = [float(x["host_ms"]) for x in runs.get(f"tessera-{d}", {}).get(t, [])]
    if exec_gap:
        print(f"  unprofiled: each step minus its 'running the compiled graph' (arena, slots and Steps) {statistics.median(exec_gap):.3f} ms"
              f" (median over steps, then over processes: {' '.join(f'{g:.3f}' for g in exec_gap)})")
    prof[d]["gemm_ms"] = gemm["med_ms"]
if "fp32" in prof and "bf16" in prof:
    print(f"\n  bf16 products / fp32 products = {prof['bf16']['gemm_ms'] / prof['fp32']['gemm_ms']:.2f} (goal <= 0.55)")
PY
