#!/usr/bin/env bash
# ARM64: cross-builds kvserve and the kernel tests with Debian's g++-aarch64-linux-gnu (the
# libraries as arm64 -dev packages), then runs under Debian's qemu-user (qemu-aarch64 -L
# /usr/aarch64-linux-gnu): the kernel tests at every level the ARM64 build carries (neon,
# scalar) and `kvserve generate` on stories260K, which must print the golden greedy output.
# No ARM host is at hand: this checks correctness, not speed.
#   usage: scripts/test-arm64.sh      (installs what it needs; build in build-arm64/)
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
PKGS=(g++-aarch64-linux-gnu qemu-user libgtest-dev:arm64 libxxhash-dev:arm64 libzstd-dev:arm64
      libhiredis-dev:arm64 libzmq3-dev:arm64 libcpp-httplib-dev:arm64 zlib1g-dev:arm64
      cppzmq-dev:arm64 nlohmann-json3-dev libcli11-dev libmsgpack-cxx-dev cmake ninja-build pkg-config)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
jobs=${KVSERVE_BUILD_JOBS:-$(nproc)}
[ -f build-arm64/build.ninja ] || cmake -S . -B build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DKVSERVE_UNITY_BUILD=ON >/dev/null
echo "== cross-building kvserve and kernels_test for aarch64"
cmake --build build-arm64 -j "$jobs" --target kvserve kernels_test
file build-arm64/kvserve | grep -q 'ARM aarch64' || { echo "build-arm64/kvserve is not an ARM64 binary"; exit 1; }
run=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
"${run[@]}" build-arm64/kvserve --version
models=${KVSERVE_TEST_MODELS:-../shared/models}
fail=0
for level in neon scalar; do
  echo "== kernel tests at $level under qemu-aarch64"
  # The large products are the same code at smaller sizes; under emulation they would take most
  # of the time.
  KVSERVE_ISA=$level "${run[@]}" build-arm64/tests/kernels_test --gtest_brief=1 \
    --gtest_filter='-MatMul.LargeMatrices' || fail=1
  if [ -f "$models/stories260K.gguf" ]; then
    expected=$(awk '/^text:/{f=1;next} f' "$models/stories260K.greedy256.expected.txt")
    got=$(KVSERVE_ISA=$level "${run[@]}" build-arm64/kvserve generate -m "$models/stories260K.gguf" \
          -p "" -n 256 --temp 0 2>/dev/null)
    if [ "$got" = "$expected" ]; then echo "golden greedy output at $level: same"; else
      echo "golden greedy output at $level differs:"; diff <(echo "$expected") <(echo "$got") | head -5
      fail=1
    fi
  else
    echo "skipped the golden run: no $models/stories260K.gguf"
  fi
done
[ $fail = 0 ] && echo "arm64: passed" || echo "arm64: FAILED"
exit $fail
