#!/usr/bin/env bash
# The build refuses an upward include: a file of the runtime layer including the tensor layer's
# header does not compile against runtime's include directory, and the same file compiles against
# tensor's (so the failure is the layering, not the file).
#   usage: upward_include.sh CXX BUILD_DIR
set -euo pipefail
cxx="$1" build="$2"
src="$(mktemp --suffix=.cpp)"
trap 'rm -f "$src"' EXIT
printf '#include "tensor/tensor_impl.h"\nint main() { return 0; }\n' >"$src"
if out=$("$cxx" -std=c++20 -fsyntax-only -I"$build/layers/runtime" "$src" 2>&1); then
  echo "FAIL: the runtime layer could include tensor/tensor_impl.h"; exit 1
fi
grep -qE "tensor/tensor_impl.h: No such file|'tensor/tensor_impl.h' file not found" <<<"$out"  # gcc's, clang's || { echo "FAIL: unexpected error: $out"; exit 1; }
"$cxx" -std=c++20 -fsyntax-only -I"$build/layers/tensor" "$src" || { echo "FAIL: the tensor layer cannot include its own header"; exit 1; }
echo "ok: runtime cannot include tensor/tensor_impl.h; tensor can"
