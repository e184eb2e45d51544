#!/usr/bin/env bash
# The disk tier through the server (issue #20): a restarted server serves a prompt from disk
# (usage.prompt_tokens_details.disk_tokens > 0) with the cold run's tokens; the KV documents API
# (save, list, get, delete; names checked, the API key required, 405s); /reset_prefix_cache; the
# kv_disk metrics; `kvserve kv save|ls|rm`; and a crash test: the server is killed with SIGKILL
# at random moments while it writes blocks (20 rounds), then a restart must give every prompt the
# cold run's tokens with no block failing a check. Exits 77 (skipped) without the model.
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
ROUNDS=${KVSERVE_CRASH_ROUNDS:-20}
TMP=$(mktemp -d)
SERVER=
trap '[ -n "$SERVER" ] && kill -9 $SERVER 2>/dev/null; rm -rf "$TMP"' EXIT
failures=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; failures=$((failures + 1)); }
if [ ! -f "$MODEL" ]; then
  echo "skipping: $MODEL not found (set KVSERVE_TEST_MODELS)"
  exit 77
fi
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"

# start ARGS...: a server on $PORT, ready when this returns (or the test fails).
start() {
  "$BIN" serve -m "$MODEL" --port "$PORT" -np 4 -c 512 -t 1 "$@" >>"$TMP/server.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 300); do
    curl -sf "$URL/health" >/dev/null && return 0
    kill -0 $SERVER 2>/dev/null || { echo "FAIL - server died:"; tail -20 "$TMP/server.log"; exit 1; }
    read -rt 0.05 <> <(:) || true
  done
  echo "FAIL - server not ready"; exit 1
}
stop() {  # SIGTERM: a clean stop (which flushes the disk tier)
  kill -TERM $SERVER; wait $SERVER; local rc=$?; SERVER=
  [ $rc -eq 0 ] || fail "server exit $rc on SIGTERM"
}
crash() { kill -9 $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; SERVER=; }

# complete PROMPT_TOKENS_JSON [KEY]: greedy completion, the JSON reply on stdout.
complete() {
  local auth=()
  [ -n "${2:-}" ] && auth=(-H "Authorization: Bearer $2")
  curl -s "${auth[@]}" "$URL/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": $1, \"max_tokens\": 12, \"temperature\": 0}"
}
field() { python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }

# Six prompts of 60-110 tokens (token ids, so no tokenizer differences).
PROMPTS=()
for p in 0 1 2 3 4 5; do
  PROMPTS+=("$(python3 -c "print([1]+[3+($p*97+i*31+i*i*7)%509 for i in range(1,60+10*$p)])")")
done

# Cold: no disk tier.
start
COLD=()
for p in "${PROMPTS[@]}"; do COLD+=("$(complete "$p" | field 'j["choices"][0]["text"]')"); done
for what in documents documents/x; do
  code=$(curl -s -o "$TMP/r" -w '%{http_code}' "$URL/v1/kv/$what")
  [ "$what" = documents ] && want=200 || want=400
  [ "$code" = "$want" ] && pass "GET /v1/kv/$what without --kv-disk: $code" ||
    fail "GET /v1/kv/$what without --kv-disk: $code $(cat "$TMP/r")"
done
code=$(curl -s -o "$TMP/r" -w '%{http_code}' "$URL/v1/kv/documents" -d '{"name":"a","prompt":"Once upon a time there was a girl who liked to play in the park with her dog"}')
[ "$code" = 400 ] && grep -q -- "--kv-disk" "$TMP/r" && pass "POST a document without --kv-disk: 400 naming --kv-disk" ||
  fail "POST without --kv-disk: $code $(cat "$TMP/r")"
stop

# Restart: one server computes and writes; the next loads.
DISK="$TMP/disk"
start --kv-disk "$DISK"
out=$(complete "${PROMPTS[0]}")
[ "$(echo "$out" | field 'j["choices"][0]["text"]')" = "${COLD[0]}" ] && pass "first run: cold tokens" || fail "first run: $out"
stop
grep -q "kv disk: flushed" "$TMP/server.log" && pass "SIGTERM flushed the tier" || fail "no flush line in the log"
ls "$DISK"/*.kvb >/dev/null 2>&1 && pass "block files written" || fail "no block files in $DISK"
start --kv-disk "$DISK"
out=$(complete "${PROMPTS[0]}")
text=$(echo "$out" | field 'j["choices"][0]["text"]')
disk=$(echo "$out" | field 'j["usage"]["prompt_tokens_details"]["disk_tokens"]')
cached=$(echo "$out" | field 'j["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$text" = "${COLD[0]}" ] && [ "$disk" -gt 0 ] && [ "$cached" -ge "$disk" ] &&
  pass "after a restart: cold tokens, $disk of $cached cached tokens from disk" ||
  fail "after a restart: text '$text' vs '${COLD[0]}', disk_tokens $disk, cached $cached"
curl -s "$URL/metrics" >"$TMP/metrics"
for m in kv_disk_hits_total kv_disk_misses_total kv_disk_bytes_written_total \
         kv_disk_bytes_read_total kv_disk_corrupt_total kv_disk_usage_bytes; do
  grep -q "^kvserve:$m" "$TMP/metrics" && pass "metric kvserve:$m" || fail "metric kvserve:$m missing"
done
hits=$(awk '/^kvserve:kv_disk_hits_total/ {print $2}' "$TMP/metrics")
python3 -c "import sys; sys.exit(0 if float('$hits') > 0 else 1)" && pass "kv_disk_hits_total $hits" || fail "kv_disk_hits_total $hits"

# /reset_prefix_cache (without a body, as vLLM's docs call it), then the prompt comes from disk again.
code=$(curl -s -o "$TMP/r" -w '%{http_code}' -X POST "$URL/reset_prefix_cache")
[ "$code" = 200 ] && pass "POST /reset_prefix_cache: $(cat "$TMP/r")" || fail "reset: $code $(cat "$TMP/r")"
out=$(complete "${PROMPTS[0]}")
[ "$(echo "$out" | field 'j["usage"]["prompt_tokens_details"]["disk_tokens"]')" -gt 0 ] &&
  pass "after a reset: served from disk" || fail "after a reset: $out"

# KV documents.
post_doc() { curl -s -o "$TMP/r" -w '%{http_code}' "$URL/v1/kv/documents" -H 'Content-Type: application/json' -d "$1"; }
code=$(post_doc "{\"name\": \"story-1\", \"tokens\": ${PROMPTS[1]}}")
[ "$code" = 200 ] && [ "$(field 'j["status"]' <"$TMP/r")" = ready ] &&
  [ "$(field 'j["blocks_on_disk"] == j["blocks"] > 0' <"$TMP/r")" = True ] &&
  pass "POST /v1/kv/documents: $(cat "$TMP/r")" || fail "POST document: $code $(cat "$TMP/r")"
for bad in '{"name": "../etc", "prompt": "x"}' '{"name": "a b", "prompt": "x"}' \
           "{\"name\": \"$(printf 'n%.0s' $(seq 200))\", \"prompt\": \"x\"}" '{"name": ".hidden", "prompt": "x"}' \
           '{"prompt": "x"}' '{"name": "a"}' '{"name": "a", "prompt": "x", "tokens": [1]}' '[1,2]' '{"name": 5, "prompt": "x"}' \
           '{"name": "short", "tokens": [1, 2, 3]}' '{"name": "v", "tokens": [1, 99999]}'; do
  code=$(post_doc "$bad")
  [ "$code" = 400 ] && grep -q '"error"' "$TMP/r" && pass "refused ${bad:0:40}: 400" || fail "${bad:0:40}: $code $(cat "$TMP/r")"
done
[ ! -e "$TMP/etc.json" ] && [ ! -e "$DISK/etc.json" ] && pass "no file outside the documents directory" || fail "path traversal wrote a file"
curl -s "$URL/v1/kv/documents" >"$TMP/r"
[ "$(field '[d["name"] for d in j["data"]]' <"$TMP/r")" = "['story-1']" ] && pass "GET /v1/kv/documents lists it" || fail "list: $(cat "$TMP/r")"
code=$(curl -s -o "$TMP/r" -w '%{http_code}' "$URL/v1/kv/documents/story-1")
[ "$code" = 200 ] && pass "GET /v1/kv/documents/story-1" || fail "get: $code $(cat "$TMP/r")"
code=$(curl -s -o "$TMP/r" -w '%{http_code}' "$URL/v1/kv/documents/nope")
[ "$code" = 404 ] && pass "GET an unknown document: 404" || fail "unknown: $code $(cat "$TMP/r")"
code=$(curl -s -o "$TMP/r" -w '%{http_code}' -X PUT -d '{}' "$URL/v1/kv/documents/story-1")
[ "$code" = 405 ] && pass "PUT a document: 405" || fail "PUT: $code"
# A prompt starting with the document's tokens loads them, after the RAM copy is dropped.
curl -s -X POST -d '' "$URL/reset_prefix_cache" >/dev/null
longer=$(python3 -c "import json; print(json.loads('${PROMPTS[1]}') + [7, 8, 9, 10])")
out=$(complete "$longer")
[ "$(echo "$out" | field 'j["usage"]["prompt_tokens_details"]["disk_tokens"]')" -ge 16 ] &&
  pass "a prompt starting with the document loads it" || fail "document hit: $out"
code=$(curl -s -o "$TMP/r" -w '%{http_code}' -X DELETE "$URL/v1/kv/documents/story-1")
[ "$code" = 200 ] && pass "DELETE /v1/kv/documents/story-1" || fail "delete: $code $(cat "$TMP/r")"
code=$(curl -s -o "$TMP/r" -w '%{http_code}' -X DELETE "$URL/v1/kv/documents/story-1")
[ "$code" = 404 ] && pass "DELETE it again: 404" || fail "delete again: $code"
stop

# The API key guards the documents and the reset as it guards /v1.
start --kv-disk "$DISK" --api-key sesame
for req in "GET /v1/kv/documents" "POST /reset_prefix_cache"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X ${req% *} -d '' "$URL/${req#* /}")
  [ "$code" = 401 ] && pass "$req without the key: 401" || fail "$req without the key: $code"
done
code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer sesame' "$URL/v1/kv/documents")
[ "$code" = 200 ] && pass "with the key: 200" || fail "with the key: $code"
stop

# The CLI: kv save, ls, rm on the same directory; a server then serves the document from disk.
printf 'Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine with her friends and her dog.' >"$TMP/doc.txt"
"$BIN" kv save -m "$MODEL" -f "$TMP/doc.txt" --kv-disk "$DISK" --name lily --json -t 1 >"$TMP/save.json" 2>"$TMP/save.err" &&
  [ "$(field 'j["blocks_on_disk"] == j["blocks"] > 0' <"$TMP/save.json")" = True ] &&
  pass "kv save: $(cat "$TMP/save.json")" || fail "kv save: $(cat "$TMP/save.err")"
"$BIN" kv ls --kv-disk "$DISK" --json >"$TMP/ls.json" 2>&1 &&
  [ "$(field '[d["name"] for d in j]' <"$TMP/ls.json")" = "['lily']" ] && pass "kv ls" || fail "kv ls: $(cat "$TMP/ls.json")"
"$BIN" kv save -m "$MODEL" -f "$TMP/doc.txt" --kv-disk "$DISK" --name ../x >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "name" "$TMP/err" && pass "kv save --name ../x refused" || fail "kv save ../x: $(cat "$TMP/err")"
"$BIN" kv save -m "$MODEL" -f "$TMP/doc.txt" --kv-disk "$DISK" --name long -c 16 >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "context (-c) holds 16" "$TMP/err" && pass "kv save refuses a document longer than -c" ||
  fail "kv save -c 16: $(cat "$TMP/err")"
# A save whose block writes the disk refuses (a file size limit: EFBIG) names the disk's reason,
# not --kv-disk-size. (4 KiB: its message still reaches the log file; a block file is larger.)
(ulimit -f 4 && "$BIN" kv save -m "$MODEL" -f "$TMP/doc.txt" --kv-disk "$TMP/efbig" --name big -t 1) \
  >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "reached the disk: .*File too large" "$TMP/err" && ! grep -q "kv-disk-size" "$TMP/err" &&
  pass "kv save under a failing disk names its reason" || fail "kv save, EFBIG: $(cat "$TMP/err")"
# A read-only --kv-disk (a read-only tmpfs in a user namespace, where one can be made) turns the
# tier off instead of failing the start.
mkdir -p "$TMP/ro"
if unshare -rm bash -c 'mount -t tmpfs -o ro none "$1"' _ "$TMP/ro" 2>/dev/null; then
  unshare -rm bash -c 'mount -t tmpfs -o ro none "$1" && shift && "$@"' _ "$TMP/ro" \
    "$BIN" generate -m "$MODEL" -p "Once upon a time" -n 4 --temp 0 --kv-disk "$TMP/ro" >"$TMP/ro.out" 2>"$TMP/err"
  [ $? -eq 0 ] && grep -q "not writable (Read-only file system): the disk tier is off" "$TMP/err" &&
    pass "a read-only --kv-disk turns the tier off; the run goes on" || fail "read-only --kv-disk: $(cat "$TMP/err")"
  unshare -rm bash -c 'mount -t tmpfs -o ro none "$1" && shift && "$@"' _ "$TMP/ro" \
    "$BIN" kv save -m "$MODEL" -f "$TMP/doc.txt" --kv-disk "$TMP/ro" --name ro -t 1 >/dev/null 2>"$TMP/err"
  [ $? -eq 1 ] && grep -q "disk tier, which is off: --kv-disk $TMP/ro could not be written" "$TMP/err" &&
    pass "kv save on a read-only --kv-disk says the tier is off" || fail "kv save, read-only: $(cat "$TMP/err")"
else
  echo "skip: a read-only --kv-disk (no user namespace here may mount a read-only tmpfs)"
fi
# An immutable --kv-disk (chattr +i: not even root may write it; EPERM, not EROFS) turns the tier
# off too, where the file system takes the attribute.
mkdir -p "$TMP/immutable"
if chattr +i "$TMP/immutable" 2>/dev/null; then
  "$BIN" generate -m "$MODEL" -p "Once upon a time" -n 4 --temp 0 --kv-disk "$TMP/immutable" \
    >/dev/null 2>"$TMP/err"
  rc=$?
  chattr -i "$TMP/immutable"
  [ $rc -eq 0 ] && grep -q "not writable (Operation not permitted): the disk tier is off" "$TMP/err" &&
    pass "an immutable --kv-disk turns the tier off; the run goes on" || fail "immutable --kv-disk: $(cat "$TMP/err")"
else
  echo "skip: an immutable --kv-disk (chattr +i is not available here)"
fi
"$BIN" kv rm --kv-disk "$DISK" --name lily 2>/dev/null && "$BIN" kv ls --kv-disk "$DISK" --json >"$TMP/ls.json" &&
  [ "$(cat "$TMP/ls.json")" = "[]" ] && pass "kv rm" || fail "kv rm: $(cat "$TMP/ls.json")"
"$BIN" kv rm --kv-disk "$DISK" --name lily >/dev/null 2>&1
[ $? -eq 1 ] && pass "kv rm of an unknown name: exit 1" || fail "kv rm unknown: exit 0"

# Flags and paths that make no sense are refused with a message naming the problem.
"$BIN" kv ls --kv-disk "$TMP/nonexistent" >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "not a directory" "$TMP/err" && pass "kv ls of a missing directory: exit 1" || fail "kv ls missing: $(cat "$TMP/err")"
for args in "--kv-disk-size abc --kv-disk $TMP/x|--kv-disk-size 'abc'" "--kv-disk-size 0 --kv-disk $TMP/x|positive size" "--kv-disk-size 99999999T --kv-disk $TMP/x|overflows" "--kv-disk-size 0.1 --kv-disk $TMP/x|less than one byte" \
            "--kv-disk-policy write-back|--kv-disk-policy is only used with --kv-disk" \
            "--kv-disk-codec zstd|--kv-disk-codec is only used with --kv-disk" "--kv-disk-size 1G|only used with --kv-disk" \
            "--kv-disk $TMP/x --kv-disk-size 1K|fewer than 4 blocks"; do
  flags=${args%%|*}; want=${args#*|}
  eval "\"$BIN\" generate -m \"$MODEL\" -p hi -n 1 $flags" >/dev/null 2>"$TMP/err"
  rc=$?
  [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q -- "$want" "$TMP/err" && pass "refused: $flags" || fail "$flags: rc $rc $(cat "$TMP/err")"
done

# Crash test: SIGKILL at random moments while blocks are written (four long generations commit
# a block every 16 tokens each, written through as they go); then every prompt's tokens must
# equal the cold run's and no stored block may fail a check.
CRASH="$TMP/crash"
for round in $(seq 1 "$ROUNDS"); do
  start --kv-disk "$CRASH"
  for p in "${PROMPTS[@]}"; do
    curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\": $p, \"max_tokens\": 400, \"temperature\": 0.8, \"seed\": $round, \"ignore_eos\": true}" >/dev/null &
  done
  read -rt "0.$((RANDOM % 30))" <> <(:) || true  # a random moment (0-0.29 s) into the writes
  crash
  wait 2>/dev/null
done
leftovers=$(find "$CRASH" -name '.*tmp*' | wc -l)
start --kv-disk "$CRASH"
ok=1
for i in "${!PROMPTS[@]}"; do
  text=$(complete "${PROMPTS[$i]}" | field 'j["choices"][0]["text"]')
  [ "$text" = "${COLD[$i]}" ] || { ok=0; fail "after $ROUNDS crashes, prompt $i: '$text' vs '${COLD[$i]}'"; }
done
curl -s "$URL/metrics" >"$TMP/metrics"
corrupt=$(awk '/^kvserve:kv_disk_corrupt_total/ {print $2}' "$TMP/metrics")
hits=$(awk '/^kvserve:kv_disk_hits_total/ {print $2}' "$TMP/metrics")
[ $ok = 1 ] && pass "after $ROUNDS SIGKILLs: every prompt gives the cold tokens ($hits blocks loaded)"
blocks=$(ls "$CRASH"/*.kvb | wc -l)
[ "$corrupt" = 0 ] && pass "no stored block failed a check (kv_disk_corrupt_total 0; $blocks blocks stored; $leftovers temporary files left by the crashes were removed at start)" ||
  fail "kv_disk_corrupt_total $corrupt after the crashes"
[ "$(find "$CRASH" -name '.*tmp*' | wc -l)" = 0 ] && pass "no temporary file left after start-up" || fail "temporary files left"
stop

[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
[ $failures -eq 0 ]
