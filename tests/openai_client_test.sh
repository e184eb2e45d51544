#!/usr/bin/env bash
# `kvserve serve` end to end: the official openai npm package as a client (tests/openai_client,
# installed by scripts/test.sh), then SIGTERM while a long streamed request runs: the server
# must exit 0 and the stream must end. Exits 77 (skipped) without the model or the package.
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
[ -f "$MODEL" ] || { echo "skip: $MODEL not found (set KVSERVE_TEST_MODELS)"; exit 77; }
[ -d "$HERE/openai_client/node_modules/openai" ] || {
  echo "skip: the openai package is not installed (scripts/test.sh runs npm install in tests/openai_client)"; exit 77; }
TMP=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" serve -m "$MODEL" --port "$PORT" -np 4 -c 2048 -t 2 >"$TMP/server.log" 2>&1 &
SERVER=$!
trap 'kill -9 $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 300); do  # until /health says ok (the model loads in well under a second)
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "FAIL - server died:"; cat "$TMP/server.log"; exit 1; }
  read -rt 0.1 <> <(:) || true
done
failures=0
if KVSERVE_URL="http://127.0.0.1:$PORT" KVSERVE_MODEL_ID=stories260K node "$HERE/openai_client/test.mjs"; then
  echo "ok   - openai npm client"
else
  echo "FAIL - openai npm client"; failures=$((failures + 1))
fi
# The load generator against it.
out=$("$BIN" bench serve --url "http://127.0.0.1:$PORT" --concurrency 3 --requests 6 --prompt-tokens 9 --gen-tokens 7 --json)
if echo "$out" | grep -q '"errors":0' && echo "$out" | grep -q '"output_tokens":42' && echo "$out" | grep -q '"ttft_ms":{'; then
  echo "ok   - bench serve"; else echo "FAIL - bench serve: $out"; failures=$((failures + 1)); fi
# Metrics after all that: finished requests counted, no blocks held.
metrics=$(curl -s "http://127.0.0.1:$PORT/metrics")
if echo "$metrics" | grep -q '^kvserve:generation_tokens_total [1-9]' &&
   [ "$(echo "$metrics" | awk '/^kvserve:kv_cache_blocks_free /{print $2}')" = "$(echo "$metrics" | awk '/^kvserve:kv_cache_blocks_total /{print $2}')" ]; then
  echo "ok   - metrics"; else echo "FAIL - metrics: $(echo "$metrics" | grep -v '^#' | head -12)"; failures=$((failures + 1)); fi
# Shutdown under load: a long stream is running when SIGTERM arrives.
curl -sN "http://127.0.0.1:$PORT/v1/completions" -d '{"prompt":"Once","max_tokens":2000,"stream":true,"ignore_eos":true}' >"$TMP/stream" &
CURL=$!
for _ in $(seq 1 100); do [ -s "$TMP/stream" ] && break; read -rt 0.05 <> <(:) || true; done
kill -TERM $SERVER
wait $SERVER; rc=$?
wait $CURL
if [ $rc -eq 0 ] && grep -q "stopped" "$TMP/server.log"; then echo "ok   - SIGTERM under load: exit 0"; else
  echo "FAIL - SIGTERM under load: exit $rc"; cat "$TMP/server.log"; failures=$((failures + 1)); fi
if grep -q "data: \[DONE\]" "$TMP/stream"; then echo "ok   - the running stream was ended cleanly"; else
  echo "FAIL - the stream did not end with [DONE]: $(tail -c 200 "$TMP/stream")"; failures=$((failures + 1)); fi
exit $failures
