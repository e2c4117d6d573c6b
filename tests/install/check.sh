#!/usr/bin/env bash
# Installs a built Tessera into a temporary prefix, then configures, builds and runs a consumer
# project that uses find_package(Tessera) and Tessera::tessera against that prefix alone, with a
# backend plugin it builds against Tessera::sdk.
#   tests/install/check.sh <tessera-build-dir>
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 <tessera-build-dir>" >&2; exit 2; }
BUILD="$(cd "$1" && pwd)"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/tessera-install-check.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"

step() { printf '[install-check] %s\n' "$*"; }
fail() { printf '[install-check] FAILED: %s\n' "$*" >&2; exit 1; }

step "cmake --install $BUILD --prefix $PREFIX"
cmake --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" 2>&1 \
  || { cat "$WORK/install.log" >&2; fail "cmake --install"; }

CONFIG=$(find "$PREFIX" -name TesseraConfig.cmake -print -quit)
[[ -n "$CONFIG" ]] || fail "no TesseraConfig.cmake under $PREFIX"
[[ -f "$PREFIX/include/tessera/tessera.h" ]] || fail "no include/tessera/tessera.h under $PREFIX"

# The installed CLI must run from the prefix (its RPATH points at the installed library).
if [[ -x "$PREFIX/bin/tessera" ]]; then
  step "$PREFIX/bin/tessera --version"
  "$PREFIX/bin/tessera" --version || fail "installed tessera --version"
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
step "configure the consumer with CMAKE_PREFIX_PATH=$PREFIX"
cmake -S "$HERE" -B "$WORK/consumer" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  >"$WORK/configure.log" 2>&1 || { cat "$WORK/configure.log" >&2; fail "consumer configure"; }
grep -q "^Tessera_DIR:PATH=$PREFIX/" "$WORK/consumer/CMakeCache.txt" \
  || fail "Tessera was found outside $PREFIX: $(grep '^Tessera_DIR' "$WORK/consumer/CMakeCache.txt")"

step "build the consumer"
cmake --build "$WORK/consumer" >"$WORK/build.log" 2>&1 \
  || { cat "$WORK/build.log" >&2; fail "consumer build"; }

step "run the consumer (and its plugin, libtessera-backend-mirror.so)"
TESSERA_PLUGIN_PATH="$WORK/consumer" "$WORK/consumer/consumer" || fail "consumer run"
step "ok"
