#!/usr/bin/env bash
# Configures and builds one flavour of kvserve.  usage: build.sh [release|asan] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-release}
shift || true
case "$flavour" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  # -O1 -g1 (line tables): the usual sanitizer build, with file:line in every report; it
  # compiles in about half the time of RelWithDebInfo's -O2 -g.
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVSERVE_SANITIZE=ON
                               "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG") ;;
  *) echo "usage: build.sh [release|asan]" >&2; exit 2 ;;
esac
jobs=${KVSERVE_BUILD_JOBS:-$(nproc)}
[ -f "$dir/build.ninja" ] || cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
targets=(); [ $# -gt 0 ] && targets=(--target "$@")
cmake --build "$dir" -j "$jobs" "${targets[@]}"
