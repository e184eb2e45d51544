#!/usr/bin/env bash
# `kvserve bench serve` (the load generator) end to end: --prefixes refused where it makes no
# sense, then the shared-prefix workload against a real `kvserve serve` of stories260K, with
# one warmed prefix (the old behaviour) and with three taken in turn, none warmed; the JSON
# carries the prefix count and the prefix-cache hit rate from the replies' cached_tokens.
# Exits 77 (skipped) without the model.
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
TMP=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill -9 $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
failures=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; failures=$((failures + 1)); }

# expect_error NAME FRAGMENT CMD...: non-zero exit, stderr mentions FRAGMENT, no crash.
expect_error() {
  local name=$1 fragment=$2; shift 2
  "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  if [ $rc -eq 0 ]; then fail "$name: exit 0"; return; fi
  if [ $rc -ge 128 ]; then fail "$name: crashed (exit $rc)"; return; fi
  if ! grep -q -- "$fragment" "$TMP/err"; then fail "$name: stderr lacks '$fragment': $(head -3 "$TMP/err")"; return; fi
  pass "$name"
}

# No server is needed for these: both are refused before any request (port 9 is discard).
NOWHERE=http://127.0.0.1:9
expect_error "--prefixes 0" "--prefixes: Value 0 not in range 1 to 100000" \
  "$BIN" bench serve --url $NOWHERE --workload shared-prefix --prefixes 0
expect_error "--prefixes 100001" "--prefixes: Value 100001 not in range 1 to 100000" \
  "$BIN" bench serve --url $NOWHERE --workload shared-prefix --prefixes 100001
expect_error "--prefixes 2 --workload random" \
  "--prefixes is only used with --workload shared-prefix (here: random)" \
  "$BIN" bench serve --url $NOWHERE --workload random --prefixes 2
expect_error "--prefixes 2 alone (random is the default)" "--prefixes is only used with" \
  "$BIN" bench serve --url $NOWHERE --prefixes 2
expect_error "--prefixes 1 --workload multi-turn" "(here: multi-turn)" \
  "$BIN" bench serve --url $NOWHERE --workload multi-turn --prefixes 1
"$BIN" bench serve --help >"$TMP/help" 2>&1 && grep -q -- "--prefixes" "$TMP/help" &&
  pass "--help lists --prefixes" || fail "--help: $(grep -- --workload "$TMP/help")"

if [ ! -f "$MODEL" ]; then
  echo "skipping the server checks: $MODEL not found (set KVSERVE_TEST_MODELS)"
  [ $failures -eq 0 ] && exit 77 || exit 1
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
"$BIN" serve -m "$MODEL" --port "$PORT" -np 4 -c 2048 -t 2 >"$TMP/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 300); do  # until /health says ok (the model loads in well under a second)
  curl -sf "$URL/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "FAIL - server died:"; cat "$TMP/server.log"; exit 1; }
  read -rt 0.1 <> <(:) || true
done

# check NAME JSON-FILE PYTHON-EXPRESSION-ON-j: the expression must hold.
check() {
  if python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' \
      "$2" "$3" 2>"$TMP/py"; then
    pass "$1"
  else
    fail "$1: $3 does not hold for $(head -c 600 "$2") $(head -c 300 "$TMP/py")"
  fi
}

# Three prefixes of two full blocks each, taken in turn by six requests one at a time:
# the first three compute theirs, the last three find them in the (ample) KV cache.
"$BIN" bench serve --url "$URL" --workload shared-prefix --prefixes 3 --prefix-tokens 32 \
  --prompt-tokens 8 --gen-tokens 4 --requests 6 --concurrency 1 --json >"$TMP/three" 2>"$TMP/err" ||
  fail "bench serve --prefixes 3: exit $? $(head -3 "$TMP/err")"
check "--prefixes 3: prefixes == 3, no errors" "$TMP/three" \
  'j["prefixes"] == 3 and j["workload"] == "shared-prefix" and j["errors"] == 0 and j["output_tokens"] == 24'
check "--prefixes 3: 0 < prefix_hit_rate < 1" "$TMP/three" \
  '0 < j["prefix_hit_rate"] < 1 and j["cached_tokens"] > 0'
check "--prefixes 3: mean TTFT reported, no warm-up figures" "$TMP/three" \
  'j["ttft_ms"]["mean"] > 0 and "ttft_cold_ms" not in j and "cold_over_warm_ttft" not in j'

# One prefix (the default): warmed by a first request left out, so every counted request hits.
"$BIN" bench serve --url "$URL" --workload shared-prefix --prefix-tokens 32 --prompt-tokens 8 \
  --gen-tokens 4 --requests 4 --concurrency 2 --json >"$TMP/one" 2>"$TMP/err" ||
  fail "bench serve --workload shared-prefix: exit $? $(head -3 "$TMP/err")"
check "one prefix: prefixes == 1, warmed, every request hits" "$TMP/one" \
  'j["prefixes"] == 1 and j["errors"] == 0 and j["ttft_cold_ms"] > 0 and j["prefix_hit_rate"] > 0'

# The human-readable summary says the same.
"$BIN" bench serve --url "$URL" --workload shared-prefix --prefixes 3 --prefix-tokens 32 \
  --prompt-tokens 8 --gen-tokens 4 --requests 6 --concurrency 1 >"$TMP/text" 2>&1
grep -q "^3 shared prefixes of 32 tokens" "$TMP/text" && grep -q "prefix cache: .* (hit rate 0\.[0-9]*)" "$TMP/text" &&
  pass "summary: prefixes and hit rate" || fail "summary: $(cat "$TMP/text")"
exit $failures
