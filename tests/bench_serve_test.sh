#!/usr/bin/env bash
# `kvserve bench serve` (the load generator) end to end: --prefixes refused where it makes no
# sense, then the shared-prefix workload against a real `kvserve serve` of stories260K, with
# one warmed prefix (the old behaviour) and with three taken in turn, none warmed; the JSON
# carries the prefix count and the prefix-cache hit rate from the replies' cached_tokens.
# The multi-turn workload: its flag checks, what it sends (session header, each turn's prompt
# the previous one plus reply plus new turn) against a stub server that records requests and
# reports neither cached_tokens nor token ids, then against kvserve, where turns 2 on hit the
# prefix cache exactly. Exits 77 (skipped) without the model (the stub checks still run).
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
TMP=$(mktemp -d)
SERVER=
STUB=
trap '[ -n "$SERVER" ] && kill -9 $SERVER 2>/dev/null; [ -n "$STUB" ] && kill -9 $STUB 2>/dev/null; rm -rf "$TMP"' EXIT
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
grep -q -- "--session-header" "$TMP/help" && grep -q "random (the default" "$TMP/help" &&
  pass "--help lists --session-header and names the default workload" || fail "--help: $(cat "$TMP/help")"
expect_error "--turns 0" "--turns: Value 0 not in range 1 to 1000" \
  "$BIN" bench serve --url $NOWHERE --workload multi-turn --turns 0
expect_error "--conversations 0" "--conversations: Value 0 not in range" \
  "$BIN" bench serve --url $NOWHERE --workload multi-turn --conversations 0
expect_error "unknown --workload" "--workload: chat not in {random,shared-prefix,multi-turn}" \
  "$BIN" bench serve --url $NOWHERE --workload chat
expect_error "--session-header 'a b'" "--session-header: 'a b' is not an HTTP header name" \
  "$BIN" bench serve --url $NOWHERE --workload multi-turn --session-header "a b"
expect_error "--session-header without multi-turn" \
  "--session-header is only used with --workload multi-turn (here: random)" \
  "$BIN" bench serve --url $NOWHERE --session-header X-Session-Id
expect_error "--turns with shared-prefix" "--turns is only used with --workload multi-turn" \
  "$BIN" bench serve --url $NOWHERE --workload shared-prefix --turns 3
expect_error "--requests with multi-turn" "--requests is not used with --workload multi-turn" \
  "$BIN" bench serve --url $NOWHERE --workload multi-turn --requests 10

# check NAME JSON-FILE PYTHON-EXPRESSION-ON-j: the expression must hold.
check() {
  if python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' \
      "$2" "$3" 2>"$TMP/py"; then
    pass "$1"
  else
    fail "$1: $3 does not hold for $(head -c 600 "$2") $(head -c 300 "$TMP/py")"
  fi
}

# The stub: what multi-turn sends, and a server that reports no cached_tokens nor token ids.
python3 "$HERE/openai_stub.py" "$TMP/stub.port" "$TMP/stub.log" &
STUB=$!
for _ in $(seq 1 100); do [ -f "$TMP/stub.port" ] && break; read -rt 0.1 <> <(:) || true; done
STUB_URL="http://127.0.0.1:$(cat "$TMP/stub.port" 2>/dev/null)"
"$BIN" bench serve --url "$STUB_URL" --workload multi-turn --conversations 3 --turns 3 \
  --prompt-tokens 5 --gen-tokens 4 --session-header X-Session-Id --json >"$TMP/stub.json" 2>"$TMP/err" ||
  fail "multi-turn against the stub: exit $? $(head -3 "$TMP/err")"
check "stub: 9 requests, no errors, no hit rate reported (-1), no token ids" "$TMP/stub.json" \
  'j["requests"] == 9 and j["errors"] == 0 and j["prefix_hit_rate"] == -1 and j["replies_with_token_ids"] == 0 and [t["prefix_hit_rate"] for t in j["per_turn"]] == [-1] * 3 and j["session_header"] == "X-Session-Id"'
# Each chat's requests carry one X-Session-Id of its own, and every turn's prompt is the previous
# prompt, 4 stand-in reply ids and 5 new ones.
if python3 - "$TMP/stub.log" <<'PY' 2>"$TMP/py"
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1])]
assert len(reqs) == 9, len(reqs)
chats = {}
for r in reqs:
    chats.setdefault(r["headers"]["X-Session-Id"], []).append(r["prompt"])
assert len(chats) == 3 and all(len(p) == 3 for p in chats.values()), chats.keys()
for prompts in chats.values():
    assert len(prompts[0]) == 5, prompts
    for a, b in zip(prompts, prompts[1:]):
        assert b[:len(a)] == a and len(b) == len(a) + 4 + 5, (a, b)
PY
then pass "stub: one X-Session-Id per chat, each turn's prompt extends the previous one"
else fail "stub: $(tail -3 "$TMP/py")"; fi
: >"$TMP/stub.log"
"$BIN" bench serve --url "$STUB_URL" --workload multi-turn --conversations 2 --turns 2 \
  --prompt-tokens 5 --gen-tokens 4 --json >"$TMP/stub.json" 2>"$TMP/err"
check "stub: session_header null without --session-header" "$TMP/stub.json" \
  'j["session_header"] is None and j["requests"] == 4'
grep -qi "x-session-id" "$TMP/stub.log" && fail "stub: X-Session-Id sent without --session-header" ||
  pass "stub: no session header without --session-header"

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

# Multi-turn against kvserve: 2 chats x 3 turns of 16 new tokens and 17 generated. A turn's KV
# holds its prompt and 16 of the reply's 17 tokens: 32 positions after turn 1, 65 after turn 2,
# so with the reply resent as the server's token ids turn 2 finds 2 full blocks per chat and
# turn 3 finds 4: exactly, or the resent ids are not the ones the server generated.
"$BIN" bench serve --url "$URL" --workload multi-turn --conversations 2 --turns 3 --prompt-tokens 16 \
  --gen-tokens 17 --session-header X-Session-Id --json >"$TMP/mt" 2>"$TMP/err" ||
  fail "bench serve --workload multi-turn: exit $? $(head -3 "$TMP/err")"
check "multi-turn: 6 requests, no errors, every reply's token ids returned" "$TMP/mt" \
  'j["requests"] == 6 and j["errors"] == 0 and j["replies_with_token_ids"] == 6 and len(j["per_turn"]) == 3'
check "multi-turn: turn 1 misses, turns 2 and 3 hit whole blocks (32 and 64 tokens a chat)" "$TMP/mt" \
  '[t["cached_tokens"] for t in j["per_turn"]] == [0, 64, 128] and all(t["prefix_hit_rate"] > 0 for t in j["per_turn"][1:])'
check "multi-turn: per-turn and later-turn TTFT and hit rate" "$TMP/mt" \
  'all(t["ttft_ms"]["mean"] > 0 and t["ttft_ms"]["p99"] >= t["ttft_ms"]["p50"] > 0 for t in j["per_turn"]) and j["after_first_turn"]["prefix_hit_rate"] > 0.6'
# Another seed: other chats, none of the blocks above.
"$BIN" bench serve --url "$URL" --workload multi-turn --conversations 2 --turns 3 --prompt-tokens 16 \
  --gen-tokens 17 --seed 7 >"$TMP/text" 2>&1
grep -q "^| 2 | 98 | 64 | 0.653 |" "$TMP/text" && grep -q "replies resent as the server's token ids: 6 of 6" "$TMP/text" &&
  pass "multi-turn summary: per-turn table" || fail "multi-turn summary: $(cat "$TMP/text")"
exit $failures
