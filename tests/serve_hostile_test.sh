#!/usr/bin/env bash
# `kvserve serve` as a process against hostile clients (issue #16): a second server on the
# port in use must fail; with hundreds of slow connections and a client that never reads,
# /health and a completion still answer within a second; a decompression bomb gets 413 and
# the process does not grow; a streamed request with top_logprobs 20, n 2 and 1,500 tokens
# does not grow it either; SIGTERM then exits 0 within 10 s. Prints the figures it measured.
# Exits 77 (skipped) without the model.
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
[ -f "$MODEL" ] || { echo "skip: $MODEL not found (set KVSERVE_TEST_MODELS)"; exit 77; }
TMP=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
"$BIN" serve -m "$MODEL" --port "$PORT" -np 4 --max-queue 0 -c 2048 -t 2 >"$TMP/server.log" 2>&1 &
SERVER=$!
HOLDER=
trap 'kill -9 $SERVER $HOLDER 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 300); do
  curl -sf "$URL/health" >/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "FAIL - server died:"; cat "$TMP/server.log"; exit 1; }
  read -rt 0.1 <> <(:) || true
done
failures=0
ok() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; failures=$((failures + 1)); }
rss_kib() { awk '/^VmRSS:/{print $2}' "/proc/$SERVER/status"; }
# Under AddressSanitizer freed memory sits in its quarantine: RSS growth is compared in the
# release build only (and printed in both).
RSS_LIMIT_MIB=48; LP_LIMIT_MIB=8
if grep -qa __asan_init "$BIN"; then RSS_LIMIT_MIB=100000; LP_LIMIT_MIB=100000; fi

# The KV format a server runs with is the one `inspect` reports for the same flags (issue #17:
# inspect loads the model as the engine does, so a calibrated K type's fingerprint agrees).
PORT2=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BIN" serve -m "$MODEL" --port "$PORT2" -c 2048 -t 2 -ctk q8_0 >"$TMP/q8.log" 2>&1 &
Q8=$!
for _ in $(seq 1 300); do grep -q "KV format" "$TMP/q8.log" && break; read -rt 0.1 <> <(:) || true; done
kill $Q8 2>/dev/null; wait $Q8 2>/dev/null
served=$(grep -o "fingerprint [0-9a-f]*" "$TMP/q8.log" | cut -d' ' -f2)
inspected=$("$BIN" inspect "$MODEL" --json -c 2048 -ctk q8_0 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["kv_format_fingerprint"])')
if [ -n "$served" ] && [ "$served" = "$inspected" ]; then ok "inspect --json gives the served KV format's fingerprint ($served)";
else fail "served fingerprint '$served' vs inspect '$inspected': $(tail -3 "$TMP/q8.log")"; fi

# A second server on the same port exits non-zero at once, saying why.
timeout 20 "$BIN" serve -m "$MODEL" --port "$PORT" >"$TMP/second.log" 2>&1; rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "in use" "$TMP/second.log"; then
  ok "second server on a taken port: exit $rc, $(grep -m1 error "$TMP/second.log")"
else fail "second server on a taken port: exit $rc: $(cat "$TMP/second.log")"; fi

# A decompression bomb: 512 MiB of zeros in well under a MiB of gzip.
python3 - "$TMP/bomb.gz" <<'EOF'
import sys, zlib
c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
zeros = bytes(1 << 20)
with open(sys.argv[1], "wb") as f:
    for _ in range(512):
        f.write(c.compress(zeros))
    f.write(c.flush())
EOF
before=$(rss_kib)
code=$(curl -s -o "$TMP/bomb.out" -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
  -H 'Content-Encoding: gzip' --data-binary @"$TMP/bomb.gz")
after=$(rss_kib)
grown=$(( (after - before) / 1024 ))
if [ "$code" = 413 ] && [ $grown -lt $RSS_LIMIT_MIB ]; then
  ok "decompression bomb ($(stat -c %s "$TMP/bomb.gz") bytes -> 512 MiB): 413, server RSS ${before} -> ${after} KiB"
else fail "decompression bomb: HTTP $code, RSS grew ${grown} MiB: $(cat "$TMP/bomb.out")"; fi

# Streamed logprobs: nothing per token is kept.
body='{"messages":[{"role":"user","content":"Tell a story"}],"n":2,"max_tokens":1500,"ignore_eos":true,"logprobs":true,"top_logprobs":20,"stream":true}'
# Warm up where RSS growth is compared (under ASan it is not, and this costs 3,000 tokens).
if [ $LP_LIMIT_MIB -lt 100000 ]; then
  curl -s "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >/dev/null
fi
before=$(rss_kib)
curl -s "$URL/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >"$TMP/lp.out"
after=$(rss_kib)
entries=$(grep -o '"top_logprobs":\[{' "$TMP/lp.out" | wc -l)
grown=$(( (after - before) / 1024 ))
if [ "$entries" -eq 3000 ] && [ $grown -lt $LP_LIMIT_MIB ]; then
  ok "streamed n 2 x 1500 tokens x top_logprobs 20 ($(stat -c %s "$TMP/lp.out") bytes): server RSS ${before} -> ${after} KiB"
else fail "streamed logprobs: $entries entries, RSS grew ${grown} MiB"; fi

# 300 connections that drip their head, and one client that never reads its stream.
python3 - "$PORT" "$TMP/holder.ready" <<'EOF' &
import socket, sys, time
port, ready = int(sys.argv[1]), sys.argv[2]
socks = []
for i in range(300):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    socks.append(s)
stalled = socket.socket()
stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
stalled.connect(("127.0.0.1", port))
# ~6 MB of chunks: more than the socket buffers hold, so the server's writes stall.
body = (b'{"messages":[{"role":"user","content":"Hi"}],"max_tokens":1400,"n":2,"stream":true,'
        b'"ignore_eos":true,"logprobs":true,"top_logprobs":20}')
stalled.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
open(ready, "w").close()
for _ in range(600):  # drip a header byte a second each, for at most 10 minutes
    for s in socks:
        try: s.send(b"a")
        except OSError: pass
    time.sleep(1)
EOF
HOLDER=$!
for _ in $(seq 1 100); do [ -e "$TMP/holder.ready" ] && break; read -rt 0.1 <> <(:) || true; done
t0=$(date +%s%N)
health=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "$URL/health")
t1=$(date +%s%N)
comp=$(curl -s -m 1 -o /dev/null -w '%{http_code}' "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt":"Once upon a time","max_tokens":4}')
t2=$(date +%s%N)
if [ "$health" = 200 ] && [ "$comp" = 200 ]; then
  ok "with 300 slow connections and a stalled reader: /health in $(( (t1 - t0) / 1000000 )) ms, a completion in $(( (t2 - t1) / 1000000 )) ms"
else fail "with slow connections: /health $health, completion $comp (curl -m 1)"; fi

# SIGTERM with all of them still open, once the stalled reader's response is all generated
# (and stuck in the server's writes).
for _ in $(seq 1 600); do
  curl -s "$URL/metrics" | grep -q '^kvserve:num_requests_running 0' && break
  read -rt 0.1 <> <(:) || true
done
t0=$(date +%s%N)
kill -TERM $SERVER
for _ in $(seq 1 100); do kill -0 $SERVER 2>/dev/null || break; read -rt 0.1 <> <(:) || true; done
if kill -0 $SERVER 2>/dev/null; then fail "SIGTERM: still running after 10 s"; kill -9 $SERVER; else
  wait $SERVER; rc=$?
  if [ $rc -eq 0 ]; then ok "SIGTERM with hostile clients open: exit 0 in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
  else fail "SIGTERM: exit $rc"; fi
fi
kill -9 $HOLDER 2>/dev/null; wait $HOLDER 2>/dev/null
exit $failures
