#!/usr/bin/env bash
# Issue #22's cross-replica figure: two kvserve replicas share one redis-server on loopback. One
# long prompt (PROMPT random token ids, default 2000) goes to replica A (cold: computed, and its
# blocks written behind to Redis), then to replica B (its RAM has nothing: the blocks come from
# Redis), and a second prompt of other tokens to B (B cold, for the same server's cold TTFT).
# TTFT is the request's wall time with max_tokens 1 (the prefill's logits). Also: the bytes B
# read from Redis per loaded token, and the greedy token of A and B (must agree). Each round
# uses new prompts (another seed) on the same servers; Redis starts empty.
#   usage: bench/kv_redis_ttft.sh MODEL.gguf [ROUNDS=3] [PROMPT=2000] [KV_TYPE=f16]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [ROUNDS] [PROMPT] [KV_TYPE]" >&2; exit 2; }
MODEL=$1 ROUNDS=${2:-3} PROMPT=${3:-2000} KV=${4:-f16}
CTX=$(( (PROMPT + 16 + 255) / 256 * 256 ))
. bench/server_lib.sh
command -v redis-server >/dev/null || { echo "redis-server not found (scripts/setup.sh)" >&2; exit 1; }
RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 --save '' --appendonly no --maxmemory 4gb \
  --maxmemory-policy allkeys-lru >"$TMP/redis.log" 2>&1 &
REDIS=$!
trap 'kill $REDIS $A $B 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 1 100); do redis-cli -p "$RPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
start() {  # $1 log -> pid in SERVER, port in PORT
  PORT=$(free_port)
  build/kvserve serve -m "$MODEL" --port "$PORT" -np 1 -c "$CTX" -t 2 -ctk "$KV" -ctv "$KV" \
    --kv-redis "redis://127.0.0.1:$RPORT" 2>>"$TMP/$1.log" &
  SERVER=$!
  wait_ready "$PORT"
}
start a; A=$SERVER APORT=$PORT
start b; B=$SERVER BPORT=$PORT
SERVER=
body() {  # $1 seed -> a request body of PROMPT random token ids
  python3 -c "import random, json; random.seed($1); print(json.dumps({'prompt': [1] + [random.randrange(100, 30000) for _ in range($PROMPT - 1)], 'max_tokens': 1, 'temperature': 0}))"
}
ask() {  # $1 port, $2 body file, $3 reply file -> wall seconds
  curl -s -o "$3" -w '%{time_total}' "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' -d @"$2"
}
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="kvserve:$2" '$1 == m {print $2}'; }
WARM='{"prompt": [1, 450, 4996, 17354, 1701, 29916, 432], "max_tokens": 1}'
for p in $APORT $BPORT; do curl -s "http://127.0.0.1:$p/v1/completions" -d "$WARM" >/dev/null; done
for round in $(seq 1 "$ROUNDS"); do
  body $((100 + round)) >"$TMP/shared.json"; body $((200 + round)) >"$TMP/other.json"
  a=$(ask "$APORT" "$TMP/shared.json" "$TMP/a.json")
  # Write-behind: wait (bounded) until A's blocks are all in Redis before B asks.
  want=$(( (PROMPT - 1) / 16 ))
  for _ in $(seq 1 200); do
    [ "$(metric "$APORT" kv_redis_blocks_written_total)" -ge $(( want * round )) ] 2>/dev/null && break
    sleep 0.05
  done
  r0=$(metric "$BPORT" kv_redis_bytes_read_total); s0=$(metric "$BPORT" kv_redis_read_seconds_total)
  b=$(ask "$BPORT" "$TMP/shared.json" "$TMP/b.json")
  r1=$(metric "$BPORT" kv_redis_bytes_read_total); s1=$(metric "$BPORT" kv_redis_read_seconds_total)
  c=$(ask "$BPORT" "$TMP/other.json" "$TMP/c.json")
  python3 - "$round" "$a" "$b" "$c" "$r0" "$r1" "$TMP/a.json" "$TMP/b.json" "$s0" "$s1" <<'PY'
import json, sys
r, a, b, c, r0, r1, fa, fb, s0, s1 = sys.argv[1:]
load = float(s1) - float(s0)
a, b, c = float(a), float(b), float(c)
ra, rb = json.load(open(fa)), json.load(open(fb))
rt = rb["usage"]["prompt_tokens_details"].get("redis_tokens", 0)
read = float(r1) - float(r0)
same = ra["choices"][0]["text"] == rb["choices"][0]["text"]
print(f"round {r}: A cold {a*1000:7.0f} ms | B from Redis {b*1000:6.0f} ms ({c/b:5.1f}x B's cold "
      f"{c*1000:7.0f} ms; {a/b:5.1f}x A's) | {rt} tokens from Redis, {read/max(rt,1)/1024:.1f} KiB/token "
      f"read, loader {load*1000:.0f} ms ({read/max(load,1e-9)/1e9:.2f} GB/s) | same token: {same}", flush=True)
PY
done
echo "redis: $(redis-cli -p "$RPORT" info memory | grep -E '^used_memory_human' | tr -d '\r'), $(redis-cli -p "$RPORT" dbsize) keys"
