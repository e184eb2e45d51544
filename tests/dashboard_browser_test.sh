#!/usr/bin/env bash
# The live KV dashboard (issue #24) in a real browser: `kvserve serve` on stories260K, Debian's
# chromium driven by playwright-core (tests/dashboard_browser, installed by scripts/test.sh)
# opens /dashboard while requests run; the page's DOM must agree with /metrics, list the running
# request, and log no console errors. The screenshot is kept as DASHBOARD_SCREENSHOT (default:
# dashboard.png in the working directory, the build's tests/ under ctest). Exits 77 (skipped)
# without the model, the package or chromium.
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[ -f "$MODEL" ] || { echo "skip: $MODEL not found (set KVSERVE_TEST_MODELS)"; exit 77; }
[ -n "$CHROMIUM" ] || { echo "skip: chromium not found (scripts/setup.sh installs it)"; exit 77; }
[ -d "$HERE/dashboard_browser/node_modules/playwright-core" ] || {
  echo "skip: playwright-core is not installed (scripts/test.sh runs npm install in tests/dashboard_browser)"; exit 77; }
TMP=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# A long context: the streamed request must outlast a page refresh (stories260K is fast).
"$BIN" serve -m "$MODEL" --port "$PORT" -np 1 -c 32768 -t 1 >"$TMP/server.log" 2>&1 &
SERVER=$!
trap 'kill -9 $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 300); do  # until /health says ok
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "FAIL - server died:"; cat "$TMP/server.log"; exit 1; }
  read -rt 0.1 <> <(:) || true
done
KVSERVE_URL="http://127.0.0.1:$PORT" CHROMIUM="$CHROMIUM" \
  SCREENSHOT="${DASHBOARD_SCREENSHOT:-$PWD/dashboard.png}" \
  node "$HERE/dashboard_browser/test.mjs"
rc=$?
[ $rc -eq 0 ] || { echo "server log:"; tail -20 "$TMP/server.log"; }
exit $rc
