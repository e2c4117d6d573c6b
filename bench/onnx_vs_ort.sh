#!/usr/bin/env bash
# Inference latency and throughput of the CNN and the transformer block that tests/onnx exports
# from PyTorch (tests/onnx/export_torch.py --dynamic-batch, Debian's python3-torch), and of their
# benchmark-size variants (--bench-size: cnn_large, the project's SmallCNN on 28x28 with
# BatchNorm; transformer_large, the block at width 128 over 64 positions): Tessera
# (bench/onnx_infer.cpp, cpu) against onnxruntime's CPU provider (bench/onnx_ort.py) in the same
# run, at each batch. onnxruntime comes from PyPI into build/ortenv (scripts/ort-requirements.txt:
# an exact version, the wheel's sha256 checked).
#
#   bench/onnx_vs_ort.sh [BUILD_DIR]      (default build/; builds nothing)
#   env: MODELS ("cnn transformer cnn_large transformer_large"), BATCHES ("64 1"), THREADS ("1 2"),
#        ROUNDS (5), RUNS (50 timed runs per process), WARMUP (5)
#
# Each round runs every (model, batch, threads, side) once, the two sides' order flipped every
# round; a cell is the median over rounds of each process's median run. Tessera's run splits into
# trace (host: building the lazy graph, with the shape operands it reads) and exec (compile-cache
# lookup, dispatch, kernels). Threads: onnxruntime's intra-op threads, Tessera's OMP_NUM_THREADS
# (on a loaded machine OpenMP's barriers stall when a thread is descheduled). Before timing,
# each model's outputs at each batch are checked against onnxruntime's (normalized error <= 1e-4).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
bin="$build/bench/bench_onnx_infer"
cli="$build/tools/tessera/tessera"
models="${MODELS:-cnn transformer cnn_large transformer_large}" batches="${BATCHES:-64 1}" threads="${THREADS:-1 2}" rounds="${ROUNDS:-5}" runs="${RUNS:-50}" warmup="${WARMUP:-5}"

[[ -x $bin && -x $cli ]] || { echo "onnx_vs_ort: no $bin or $cli; build them (ninja -C $build bench_onnx_infer tessera_cli)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "onnx_vs_ort: /usr/bin/python3 cannot import torch (apt install python3-torch)" >&2; exit 1; }

# onnxruntime in its own venv (numpy its only import), installed once per requirements file.
env="$build/ortenv" req="$root/scripts/ort-requirements.txt"
if ! cmp -s "$env/.installed" "$req"; then
  /usr/bin/python3 -m venv --clear "$env" >&2
  "$env/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --only-binary=:all: --no-deps \
    --require-hashes -r "$req" >&2
  cp "$req" "$env/.installed"
fi
py="$env/bin/python"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
/usr/bin/python3 "$root/tests/onnx/export_torch.py" "$work" --dynamic-batch --bench-size >"$work/export.log" 2>&1 ||
  { cat "$work/export.log" >&2; exit 1; }
for model in $models; do
  for b in $batches; do
    "$py" -c "import numpy as np, sys; x = np.load(sys.argv[1]); np.save(sys.argv[2], np.random.default_rng(0).standard_normal((int(sys.argv[3]),) + x.shape[1:]).astype(np.float32))" \
      "$work/${model}_x.npy" "$work/${model}_b$b.npy" "$b"
    # Same outputs first: Tessera's (tessera run) against onnxruntime's.
    "$py" "$here/onnx_ort.py" "$work/$model.onnx" "$work/${model}_b$b.npy" 1 1 1 --save "$work/ort_y.npy" >/dev/null
    "$cli" run "$work/$model.onnx" -i "x=$work/${model}_b$b.npy" -o "$work/out" >/dev/null
    "$py" -c "import numpy as np, sys; a, b = np.load(sys.argv[1]), np.load(sys.argv[2]); e = np.abs(a - b).max() / np.abs(b).max()
print(f'  check {sys.argv[3]}: outputs agree, normalized error {e:.1e}') if e <= 1e-4 else sys.exit(f'onnx_vs_ort: {sys.argv[3]}: outputs differ by {e:.3g}')" \
      "$work/out/y.npy" "$work/ort_y.npy" "$model batch $b"
  done
done

echo "$models inference, tessera (cpu) vs onnxruntime $("$py" -c 'import onnxruntime; print(onnxruntime.__version__)') (CPU):" \
  "$rounds rounds x threads {$threads} x $runs timed runs after $warmup"
echo "host: $(nproc) CPUs; load at start:$(uptime | sed 's/.*load average://')"
results="$work/results"
for ((r = 1; r <= rounds; ++r)); do
  if ((r % 2)); then order="tessera ort"; else order="ort tessera"; fi
  for model in $models; do
    for b in $batches; do
      for t in $threads; do
        for side in $order; do
          if [[ $side == tessera ]]; then
            out=$(OMP_NUM_THREADS=$t "$bin" "$work/$model.onnx" "$work/${model}_b$b.npy" --runs "$runs" --warmup "$warmup")
          else
            out=$("$py" "$here/onnx_ort.py" "$work/$model.onnx" "$work/${model}_b$b.npy" "$runs" "$warmup" "$t")
          fi
          line=$(grep '^RESULT ' <<<"$out" | tail -1) || { echo "onnx_vs_ort: $side printed no RESULT:" >&2; echo "$out" >&2; exit 1; }
          echo "$model $line" >>"$results"
        done
      done
    done
  done
done
echo "load at end:$(uptime | sed 's/.*load average://')"

awk -v models="$models" -v batches="$batches" -v threads="$threads" '
function field(k,   i, kv) { for (i = 4; i <= NF; ++i) { split($i, kv, "="); if (kv[1] == k) return kv[2] } return "" }
function median(list,   a, n, i, j, t) {
  n = split(list, a, " ")
  for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j-1] + 0 > a[j] + 0; --j) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ key = $1 " " field("batch") " " field("threads"); ms[key, $3] = ms[key, $3] " " field("median_ms"); keys[key] = 1
  if ($3 == "tessera") { tr[key] = tr[key] " " field("trace_ms"); ex[key] = ex[key] " " field("exec_ms") } }
END {
  printf "\n%-18s %5s %7s %12s %12s %12s %12s %14s %14s %9s\n", "model", "batch", "threads", "tessera ms", "(trace ms)", "(exec ms)",
         "ort ms", "tessera /s", "ort /s", "ratio"
  nm = split(models, mods, " "); nb = split(batches, bs, " "); nt = split(threads, ts, " ")
  for (i = 0; i < nm * nb * nt; ++i) {
    key = mods[int(i / (nb * nt)) + 1] " " bs[int(i / nt) % nb + 1] " " ts[i % nt + 1]; split(key, k, " ")
    if (!(key in keys)) continue
    t = median(ms[key, "tessera"]); o = median(ms[key, "ort"])
    printf "%-18s %5d %7d %12.4f %12.4f %12.4f %12.4f %14.0f %14.0f %8.2fx\n", k[1], k[2], k[3], t, median(tr[key]), median(ex[key]), o,
           1000 * k[2] / t, 1000 * k[2] / o, t / o
    if (!((k[1] " " k[2]) in best_t) || t < best_t[k[1] " " k[2]]) best_t[k[1] " " k[2]] = t
    if (!((k[1] " " k[2]) in best_o) || o < best_o[k[1] " " k[2]]) best_o[k[1] " " k[2]] = o
  }
  for (i = 0; i < nm * nb; ++i) {
    key = mods[int(i / nb) + 1] " " bs[i % nb + 1]
    if (key in best_t) printf "best of each side, %s: tessera %.4f ms, onnxruntime %.4f ms: %.2fx\n", key, best_t[key], best_o[key], best_t[key] / best_o[key]
  }
  print "ratio: tessera ms / onnxruntime ms (< 1: Tessera is faster); /s: samples per second; trace: host time building the graph"
}' "$results"
