#!/usr/bin/env bash
# Issue #20's reload-vs-recompute figure: one long prompt (PROMPT random token ids, default 4000)
# served with max_tokens 1 by kvserve with a disk tier, (a) cold, (b) from the RAM prefix cache,
# (c) from disk after POST /reset_prefix_cache dropped the RAM copies, (d) from disk after a
# restart (SIGTERM, then a new server on the same --kv-disk); then by llama-server on the same
# prompt: (a) cold, (b) its slot's cached prompt, (c) after /slots/0?action=save, erase and
# restore (its slot file). TTFT is the request's wall time (one token: the prefill's logits).
# Rounds alternate kvserve and the peer (the VM drifts); each KV type runs in turn.
#   usage: bench/kv_disk_ttft.sh MODEL.gguf [KV_TYPES=f16,q8_0] [ROUNDS=2] [PROMPT=4000] [CODEC=raw]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [KV_TYPES] [ROUNDS] [PROMPT] [CODEC]" >&2; exit 2; }
MODEL=$1 TYPES=${2:-f16,q8_0} ROUNDS=${3:-2} PROMPT=${4:-4000} CODEC=${5:-raw}
CTX=$(( (PROMPT + 16 + 255) / 256 * 256 ))
. bench/server_lib.sh
python3 -c "import random, json; random.seed(20); print(json.dumps([1] + [random.randrange(100, 30000) for _ in range($PROMPT - 1)]))" >"$TMP/prompt.json"
ask() {  # $1 url path, $2 json body -> wall seconds
  curl -s -o "$TMP/reply" -w '%{time_total}' "http://127.0.0.1:$PORT$1" -H 'Content-Type: application/json' -d "$2"
}
kv_request() { python3 -c "import json; print(json.dumps({'prompt': json.load(open('$TMP/prompt.json')), 'max_tokens': 1, 'temperature': 0}))" >"$TMP/kv_body.json"; }
peer_request() { python3 -c "import json; print(json.dumps({'prompt': json.load(open('$TMP/prompt.json')), 'n_predict': 1, 'temperature': 0, 'cache_prompt': True}))" >"$TMP/peer_body.json"; }
kv_request; peer_request
# A warm-up request of other tokens before any timing (weights paged in, threads started).
WARM='{"prompt": [1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203], "max_tokens": 1, "n_predict": 1}' 
metric() { curl -s "http://127.0.0.1:$PORT/metrics" | awk -v m="kvserve:$1" '$1 == m {print $2}'; }
ms() { python3 -c "print(f'{$1 * 1000:.0f}')"; }

start_kvserve() {  # $1 type, $2 disk dir
  PORT=$(free_port)
  build/kvserve serve -m "$MODEL" --port "$PORT" -np 1 -c "$CTX" -t 2 -ctk "$1" -ctv "$1" \
    --kv-disk "$2" --kv-disk-codec "$CODEC" 2>>"$TMP/kvserve.log" &
  SERVER=$!
  wait_ready "$PORT"
}
stop_server() { kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=; }

for round in $(seq 1 "$ROUNDS"); do
  for t in ${TYPES//,/ }; do
    disk="$TMP/disk-$t-$round"
    start_kvserve "$t" "$disk"
    ask /v1/completions "$WARM" >/dev/null
    a=$(ask /v1/completions @"$TMP/kv_body.json")
    b=$(ask /v1/completions @"$TMP/kv_body.json")
    curl -s -X POST -d '' "http://127.0.0.1:$PORT/reset_prefix_cache" >/dev/null
    r0=$(metric kv_disk_bytes_read_total); s0=$(metric kv_disk_read_seconds_total)
    c=$(ask /v1/completions @"$TMP/kv_body.json")
    disk_tokens=$(python3 -c "import json; print(json.load(open('$TMP/reply'))['usage']['prompt_tokens_details']['disk_tokens'])")
    r1=$(metric kv_disk_bytes_read_total); s1=$(metric kv_disk_read_seconds_total)
    usage=$(metric kv_disk_usage_bytes); payload=$(metric kv_disk_payload_bytes_written_total); written=$(metric kv_disk_bytes_written_total)
    echo "  $t $CODEC: $payload KV bytes in $written bytes of files (ratio $(python3 -c "print(round(float('$payload')/float('$written'), 3))"))"
    stop_server
    start_kvserve "$t" "$disk"
    ask /v1/completions "$WARM" >/dev/null
    d=$(ask /v1/completions @"$TMP/kv_body.json")
    stop_server
    python3 - "$round" "$t" "$a" "$b" "$c" "$d" "$r0" "$r1" "$s0" "$s1" "$disk_tokens" "$usage" <<'PY'
import sys
r, t, a, b, c, d, r0, r1, s0, s1, dt, usage = sys.argv[1:]
a, b, c, d = map(float, (a, b, c, d))
read = float(r1) - float(r0); secs = float(s1) - float(s0)
print(f"round {r} kvserve {t:5}: TTFT cold {a*1000:8.0f} ms | RAM {b*1000:6.0f} ms | disk {c*1000:6.0f} ms "
      f"({a/c:5.1f}x) | restart {d*1000:6.0f} ms ({a/d:5.1f}x) | {dt} tokens from disk, "
      f"{read/max(int(dt),1)/1024:.1f} KiB/token read, {read/max(secs,1e-9)/1e9:.2f} GB/s in the loader, "
      f"store {float(usage)/2**20:.0f} MiB", flush=True)
PY
    # The peer, same prompt, context, threads and KV type; flash attention on (its quantized V needs it).
    PORT=$(free_port)
    slots="$TMP/slots-$t-$round"; mkdir -p "$slots"
    "$PEER/llama-server" -m "$MODEL" --port "$PORT" -np 1 -c "$CTX" -t 2 -fa on -ctk "$t" -ctv "$t" \
      --slot-save-path "$slots/" 2>>"$TMP/peer.log" &
    SERVER=$!
    wait_ready "$PORT"
    ask /completion "$WARM" >/dev/null
    pa=$(ask /completion @"$TMP/peer_body.json")
    pb=$(ask /completion @"$TMP/peer_body.json")
    save=$(ask "/slots/0?action=save" '{"filename": "prompt.bin"}')
    save_ms=$(python3 -c "import json; print(json.load(open('$TMP/reply'))['timings']['save_ms'])")
    ask "/slots/0?action=erase" '{}' >/dev/null
    restore=$(ask "/slots/0?action=restore" '{"filename": "prompt.bin"}')
    restore_ms=$(python3 -c "import json; print(json.load(open('$TMP/reply'))['timings']['restore_ms'])")
    pc=$(ask /completion @"$TMP/peer_body.json")
    file_bytes=$(stat -c %s "$slots/prompt.bin")
    stop_server
    python3 - "$round" "$t" "$pa" "$pb" "$restore" "$restore_ms" "$pc" "$file_bytes" "$PROMPT" "$save_ms" <<'PY'
import sys
r, t, a, b, restore, restore_ms, c, fb, n, save_ms = sys.argv[1:]
a, b, restore, c = map(float, (a, b, restore, c))
print(f"round {r} llama.cpp {t:5}: TTFT cold {a*1000:8.0f} ms | RAM {b*1000:6.0f} ms | restore {float(restore_ms):6.0f} ms "
      f"(call {restore*1000:.0f} ms) + request {c*1000:6.0f} ms = {(restore+c)*1000:6.0f} ms ({a/(restore+c):5.1f}x) | "
      f"slot file {float(fb)/int(n)/1024:.1f} KiB/token, saved in {float(save_ms):.0f} ms", flush=True)
PY
  done
done
