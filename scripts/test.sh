#!/usr/bin/env bash
# The whole test suite: install dependencies, build, run every test; then build again with
# AddressSanitizer + UndefinedBehaviorSanitizer and run the same tests there.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The server's client test uses the official openai npm package (tests/openai_client).
(cd tests/openai_client && npm install --no-audit --no-fund --loglevel=error)
jobs=$(nproc)
scripts/build.sh release
(cd build && ctest --output-on-failure -j "$jobs")
if [ "${KVSERVE_SKIP_ASAN:-0}" != 1 ]; then
  scripts/build.sh asan
  (cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --output-on-failure -j "$jobs")
fi
