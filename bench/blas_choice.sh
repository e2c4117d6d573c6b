#!/usr/bin/env bash
# Measures each Debian OpenBLAS build for the CPU backend (see blas_choice.cpp). Needs the runtime
# packages libopenblas0-openmp, libopenblas0-pthread and libopenblas0-serial; missing ones are skipped.
# Leaves OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as the machine exports them.
set -euo pipefail
bin="${1:-build/bench/blas_choice}"
lib=/usr/lib/$(gcc -print-multiarch)
for v in openmp pthread serial; do
  so="$lib/openblas-$v/libopenblas.so.0"
  [[ -f $so ]] || { echo "== $v: not installed (libopenblas0-$v)"; continue; }
  echo "== openblas-$v"
  OMP_NUM_THREADS=2 "$bin" "$so" $([[ $v == serial ]] && echo serial)
done
