#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every test; then build again with
# AddressSanitizer + UndefinedBehaviorSanitizer and run the same tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The server's client test uses the official openai npm package (tests/openai_client).
(cd tests/openai_client && npm install --no-audit --no-fund --loglevel=error)
# The dashboard's browser test drives the system chromium with playwright-core.
(cd tests/dashboard_browser && npm install --no-audit --no-fund --loglevel=error)
jobs=$(nproc)
scripts/build.sh release
(cd build && ctest --output-on-failure -j "$jobs")
if [ "${KVSERVE_SKIP_ASAN:-0}" != 1 ]; then
  scripts/build.sh asan
  # multi_replica_test (Redis, two servers, HAProxy, a subscriber; ~30 s of prefill) runs in the
  # release pass only: under the sanitizers it would cost CI's 20-minute budget, and the C++ it
  # drives (the Redis tier, the KV events, the lookup) runs under them in redis_tier_test,
  # kv_events_engine_test and server_test.
  # qemu_x86_test runs the release binary's level choice under qemu-user, where a sanitized
  # binary cannot map its shadow memory; the per-level tests (isa_level_*) run here too.
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j "$jobs" -E '^(multi_replica_test|qemu_x86_test)$')
fi
# ARM64 (issue #40): cross-built, its kernel tests and a golden generation under qemu-aarch64.
if [ "${KVSERVE_SKIP_ARM64:-0}" != 1 ]; then
  bash scripts/test-arm64.sh
fi
