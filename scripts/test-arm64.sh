#!/usr/bin/env bash
# ARM64: cross-builds kvserve and the kernel tests with Debian's g++-aarch64-linux-gnu (the
# libraries as arm64 -dev packages), then runs under Debian's qemu-user (qemu-aarch64 -L
# /usr/aarch64-linux-gnu): kernel tests at every level the ARM64 build carries (neon, scalar)
# and, with --golden, `kvserve generate` on stories260K, which must print the golden greedy
# output (it does not finish under qemu yet: see below). No ARM host is at hand: this checks
# correctness, not speed.
#   usage: scripts/test-arm64.sh [--golden]   (installs what it needs; build in build-arm64/)
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
# Under qemu-aarch64 the tests that run a thread pool (the matmul tests, model loading) do not
# finish: a model load went quiet in user code for over 3 minutes (no syscall under -strace),
# where qemu-x86_64 runs the whole golden generation in 10 s. Until that is understood, CI runs
# the kernel tests that take no pool; --golden also tries the golden generation (-t 1).
UNDER_EMULATION='Quantize.*:F16.*:BF16.*:KvQuant.*:KvTypes.*:KvLayer.*:KvTransform.*:KeyWhitening.*'
UNDER_EMULATION+=':KeyOffsets.*:ComputePeak.*:Attention.EqualKeysAverageTheValues'
UNDER_EMULATION+=':Attention.StableForPeakedScores:Attention.AQuerysOutputDoesNotDependOnItsNeighbours'
UNDER_EMULATION+=':AttentionWalk.AnInfValuePastAQuerysKeysDoesNotReachIt:AttentionWalk.BufferGrowsAcrossCalls'
UNDER_EMULATION+=':AttentionPartition.OnePartitionIsTheWholeAttention'
golden=0
[ "${1:-}" = --golden ] && golden=1
for level in neon scalar; do
  echo "== kernel tests at $level under qemu-aarch64"
  KVSERVE_ISA=$level timeout 600 "${run[@]}" build-arm64/tests/kernels_test --gtest_brief=1 \
    --gtest_filter="$UNDER_EMULATION" || fail=$((fail + 1))
  checks=$((checks + 1))
  if [ $golden = 0 ]; then
    echo "golden generation at $level: not run (--golden; see above)"
  elif [ -f "$models/stories260K.gguf" ]; then
    expected=$(awk '/^text:/{f=1;next} f' "$models/stories260K.greedy256.expected.txt")
    got=$(KVSERVE_ISA=$level timeout 600 "${run[@]}" build-arm64/kvserve generate \
          -m "$models/stories260K.gguf" -p "" -n 256 --temp 0 -t 1 2>/dev/null || true)
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
