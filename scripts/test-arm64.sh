#!/usr/bin/env bash
# ARM64: cross-builds kvserve and the kernel tests with Debian's g++-aarch64-linux-gnu (the
# libraries as arm64 -dev packages), then runs under Debian's qemu-user (qemu-aarch64 -L
# /usr/aarch64-linux-gnu): the kernel tests at every level the ARM64 build carries (neon,
# scalar) and `kvserve generate` on stories260K, which must print the golden greedy output.
# No ARM host is at hand: this checks correctness, not speed.
#   usage: scripts/test-arm64.sh      (installs what it needs; build in build-arm64/)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --arm64
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
checks=0
SLOW_UNDER_EMULATION='MatMul.LargeMatrices:AttentionWalk.EveryTypeAndCoding:AttentionWalk.HeadSizes'
SLOW_UNDER_EMULATION+=':AttentionWalk.EveryQueryCountOneToSeventyWildKeyCounts'
SLOW_UNDER_EMULATION+=':AttentionPartition.HeadsTogetherMatchAttendBitForBit:Interleave.MatMulMatchesReference'
SLOW_UNDER_EMULATION+=':Attention.QuantizedTypesMatchScalarTwinAndStayNearF32:AttentionWalk.KeysOverSeveralPartitions'
SLOW_UNDER_EMULATION+=':Attention.MatchesReferenceOverHeadSizesAndKeyCounts'
for level in neon scalar; do
  echo "== kernel tests at $level under qemu-aarch64"
  # The largest cases (big products, every head size, type and key count of the attention walk:
  # 77 of the 79 seconds these tests take natively at the portable level) are the same code at
  # smaller sizes in the other tests; under emulation they would take over 10 minutes a level.
  KVSERVE_ISA=$level "${run[@]}" build-arm64/tests/kernels_test --gtest_brief=1 \
    --gtest_filter="-$SLOW_UNDER_EMULATION" || fail=$((fail + 1))
  checks=$((checks + 1))
  if [ -f "$models/stories260K.gguf" ]; then
    expected=$(awk '/^text:/{f=1;next} f' "$models/stories260K.greedy256.expected.txt")
    got=$(KVSERVE_ISA=$level "${run[@]}" build-arm64/kvserve generate -m "$models/stories260K.gguf" \
          -p "" -n 256 --temp 0 2>/dev/null)
    checks=$((checks + 1))
    if [ "$got" = "$expected" ]; then echo "golden greedy output at $level: same"; else
      echo "golden greedy output at $level differs:"; diff <(echo "$expected") <(echo "$got") | head -5
      fail=$((fail + 1))
    fi
  else
    echo "skipped the golden run: no $models/stories260K.gguf"
  fi
done
echo "arm64: $((checks - fail)) passed, $fail failed"
[ $fail = 0 ]
