#!/usr/bin/env bash
# ARM64: cross-builds kvserve and the kernel tests with Debian's g++-aarch64-linux-gnu (the
# libraries as arm64 -dev packages), then runs under Debian's qemu-user (qemu-aarch64 -L /, the
# arm64 multiarch glibc: see below): kernel tests at every level the ARM64 build carries (neon,
# scalar) and `kvserve generate` on stories260K, which must print the golden greedy output. No ARM
# host is at hand: this checks correctness, not speed.
#   usage: scripts/test-arm64.sh   (installs what it needs; build in build-arm64/; --golden, once
#   needed to opt in to the golden generation, is still accepted and changes nothing)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --arm64
jobs=${KVSERVE_BUILD_JOBS:-$(nproc)}
# What the runs need, checked before the (long) cross build.
command -v qemu-aarch64 >/dev/null || { echo "no qemu-aarch64 (Debian's qemu-user)"; exit 1; }
[ -e /lib/ld-linux-aarch64.so.1 ] || { echo "no /lib/ld-linux-aarch64.so.1 (libc6:arm64)"; exit 1; }
[ -f build-arm64/build.ninja ] || cmake -S . -B build-arm64 -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake -DKVSERVE_UNITY_BUILD=ON >/dev/null
echo "== cross-building kvserve and kernels_test for aarch64"
cmake --build build-arm64 -j "$jobs" --target kvserve kernels_test
# An ELF64 binary's e_machine (bytes 18-19) is 0xb7 0x00 for AArch64.
[ "$(od -An -tx1 -j18 -N2 build-arm64/kvserve | tr -d ' ')" = b700 ] ||
  { echo "build-arm64/kvserve is not an ARM64 binary"; exit 1; }
# The loader and libc must come from one glibc build: libc.so.6 reaches into ld.so's private
# _rtld_global (GLIBC_PRIVATE: no ABI between two builds, even of one version). With -L
# /usr/aarch64-linux-gnu the loader was the cross package's (libc6-arm64-cross 2.36-8cross1,
# _rtld_global 4512 bytes) but libc.so.6 the multiarch one found in /lib/aarch64-linux-gnu
# (libc6:arm64 2.36-9+deb12u14, 4520 bytes), where the other libraries live too: the first
# pthread_create then walked the thread-stack cache list 8 bytes off its head and spun forever in
# libc (no syscall), so anything that started a thread (a model load's pool, the matmul tests)
# never finished. -L / takes the loader, libc and every library from the arm64 multiarch packages.
run=(qemu-aarch64 -L /)
timeout 60 "${run[@]}" build-arm64/kvserve --version || { echo "kvserve --version failed under qemu"; exit 1; }
models=${KVSERVE_TEST_MODELS:-../shared/models}
fail=0
checks=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# The kernel tests that take minutes under emulation (MatMul.LargeMatrices, the attention walks
# over every query count, type and head size, the quantized-attention sweep: about 8 minutes a
# level) are left to native runs; the rest, the thread-pool matmul tests included, run here.
UNDER_EMULATION='Quantize.*:F16.*:BF16.*:KvQuant.*:KvTypes.*:KvLayer.*:KvTransform.*:KeyWhitening.*'
UNDER_EMULATION+=':KeyOffsets.*:ComputePeak.*:Attention.EqualKeysAverageTheValues'
UNDER_EMULATION+=':Attention.StableForPeakedScores:Attention.AQuerysOutputDoesNotDependOnItsNeighbours'
UNDER_EMULATION+=':AttentionWalk.AnInfValuePastAQuerysKeysDoesNotReachIt:AttentionWalk.BufferGrowsAcrossCalls'
UNDER_EMULATION+=':AttentionPartition.OnePartitionIsTheWholeAttention:MatMul.*:Interleave.*'
UNDER_EMULATION+=':AttentionWindow.KeysBeforeEveryWindowAreNeverRead:AttentionWindow.AQuerysBitsDoNotDependOnItsNeighbours'
UNDER_EMULATION+=':AttentionWindow.PartitionsMergeToAttendsBits'
UNDER_EMULATION+='-MatMul.LargeMatrices'
for level in neon scalar; do
  echo "== kernel tests at $level under qemu-aarch64"
  KVSERVE_ISA=$level timeout 600 "${run[@]}" build-arm64/tests/kernels_test --gtest_brief=1 \
    --gtest_filter="$UNDER_EMULATION" || fail=$((fail + 1))
  checks=$((checks + 1))
  if [ -f "$models/stories260K.gguf" ]; then
    # Two threads: the load and the matmuls run on the thread pool, as they do natively.
    expected=$(awk '/^text:/{f=1;next} f' "$models/stories260K.greedy256.expected.txt")
    rc=0
    got=$(KVSERVE_ISA=$level timeout 300 "${run[@]}" build-arm64/kvserve generate \
          -m "$models/stories260K.gguf" -p "" -n 256 --temp 0 -t 2 2>"$log") || rc=$?
    checks=$((checks + 1))
    if [ $rc -ne 0 ]; then
      echo "golden generation at $level failed (exit $rc$([ $rc = 124 ] && echo ', timed out after 300 s')):"
      tail -5 "$log"
      fail=$((fail + 1))
    elif [ "$got" = "$expected" ]; then echo "golden greedy output at $level: same"; else
      echo "golden greedy output at $level differs:"; diff <(echo "$expected") <(echo "$got") | head -5
      fail=$((fail + 1))
    fi
  else
    echo "skipped the golden run: no $models/stories260K.gguf"
  fi
done
echo "arm64: $((checks - fail)) passed, $fail failed"
[ $fail = 0 ]
