#!/usr/bin/env bash
# Issue #22's multi-turn figure: HAProxy (deploy/haproxy.cfg) in front of two kvserve replicas,
# `bench serve --workload multi-turn` (CONVERSATIONS chats x TURNS turns, each turn resending the
# whole history) through it, in four setups, interleaved over ROUNDS rounds:
#   hash+redis  X-Session-Id hashed onto one replica, replicas share a redis-server
#   hash        X-Session-Id hashed, no Redis
#   rr+redis    round robin (no session header), replicas share Redis
#   rr          round robin, no Redis (a plain load balancer in front of plain replicas)
# Reported per setup: the prefix hit rate (cached over prompt tokens, as the replicas' usage
# says), TTFT mean / p50 / p99, tokens the replicas loaded from Redis, and how the chats split
# over the replicas. Both replicas share this machine's cores, so the figures are hit rates and
# TTFT, not throughput scaling. Replicas and Redis restart empty for every setup and round.
#   usage: bench/kv_multi_turn.sh MODEL.gguf [ROUNDS=1] [USER_TOKENS=64] [GEN=32] [THREADS=1]
# Environment: SETUPS="hash+redis rr" runs only those; KEEP=DIR keeps each run's bench JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [ROUNDS] [USER_TOKENS] [GEN] [THREADS]" >&2; exit 2; }
MODEL=$1 ROUNDS=${2:-1} USER=${3:-64} GEN=${4:-32} THREADS=${5:-1}
CONVERSATIONS=8 TURNS=6
CTX=$(( ((USER + GEN) * TURNS + 64 + 255) / 256 * 256 ))
. bench/server_lib.sh
for tool in redis-server redis-cli haproxy; do
  command -v $tool >/dev/null || { echo "$tool not found (scripts/setup.sh installs it)" >&2; exit 1; }
done
PIDS=()
stop_all() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}
trap 'stop_all; rm -rf "$TMP"' EXIT
metric() { curl -s "http://127.0.0.1:$1/metrics" | awk -v m="kvserve:$2" '$1 == m {print $2}'; }

run_setup() {  # $1 setup name, $2 round -> one JSON line on stdout
  local name=$1 round=$2 redis_flag=() header=() cfg=deploy/haproxy.cfg
  local rport p1 p2 lb stats
  rport=$(free_port) p1=$(free_port) p2=$(free_port) lb=$(free_port) stats=$(free_port)
  if [[ $name == *redis ]]; then
    redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --maxmemory 2gb \
      --maxmemory-policy allkeys-lru >"$TMP/redis.log" 2>&1 &
    PIDS+=($!)
    for _ in $(seq 1 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
    redis_flag=(--kv-redis "redis://127.0.0.1:$rport")
  fi
  if [[ $name == hash* ]]; then
    header=(--session-header X-Session-Id)
  else
    sed 's/balance leastconn/balance roundrobin/' deploy/haproxy.cfg >"$TMP/rr.cfg"
    cfg=$TMP/rr.cfg
  fi
  for port in $p1 $p2; do
    build/kvserve serve -m "$MODEL" --port "$port" -np 4 -c "$CTX" -t "$THREADS" \
      "${redis_flag[@]}" 2>>"$TMP/$name.replica.log" &
    PIDS+=($!)
    SERVER=$!
    wait_ready "$port"
  done
  SERVER=
  KVSERVE_LB_BIND=127.0.0.1:$lb HAPROXY_STATS_BIND=127.0.0.1:$stats \
    KVSERVE_1=127.0.0.1:$p1 KVSERVE_2=127.0.0.1:$p2 haproxy -f "$cfg" >"$TMP/haproxy.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$lb/health" >/dev/null && break; sleep 0.1; done
  build/kvserve bench serve --url "http://127.0.0.1:$lb" --workload multi-turn \
    --conversations $CONVERSATIONS --turns $TURNS --prompt-tokens "$USER" --gen-tokens "$GEN" \
    --seed $((round + 7)) "${header[@]}" --json >"$TMP/bench.json"
  local r1 r2 q1 q2 e1 e2
  r1=$(metric "$p1" kv_redis_hits_total) r2=$(metric "$p2" kv_redis_hits_total)
  q1=$(metric "$p1" request_success_total) q2=$(metric "$p2" request_success_total)
  e1=$(metric "$p1" num_preemptions_total) e2=$(metric "$p2" num_preemptions_total)
  if [ -n "${KEEP:-}" ]; then
    cp "$TMP/bench.json" "$KEEP/$name.$round.json"
    curl -s "http://127.0.0.1:$p1/metrics" >"$KEEP/$name.$round.metrics1"
    curl -s "http://127.0.0.1:$p2/metrics" >"$KEEP/$name.$round.metrics2"
    cp "$TMP/$name.replica.log" "$KEEP/$name.$round.log"
  fi
  python3 - "$name" "$round" "$TMP/bench.json" "${r1:-0}" "${r2:-0}" "${q1:-0}" "${q2:-0}" \
    "${e1:-0}" "${e2:-0}" <<'PY'
import json, sys
name, rnd, path, r1, r2, q1, q2, e1, e2 = sys.argv[1:]
b = json.load(open(path))
print(json.dumps({"setup": name, "round": int(rnd), "errors": b["errors"],
                  "prefix_hit_rate": round(b["prefix_hit_rate"], 4),
                  "ttft_mean_ms": round(b["ttft_ms"]["mean"], 1),
                  "ttft_p50_ms": round(b["ttft_ms"]["p50"], 1),
                  "ttft_p99_ms": round(b["ttft_ms"]["p99"], 1),
                  "after_first_turn_ttft_mean_ms": round(b["after_first_turn"]["ttft_ms"]["mean"], 1),
                  "redis_blocks_loaded": int(float(r1)) + int(float(r2)),
                  "requests_per_replica": [int(float(q1)), int(float(q2))],
                  "preemptions": int(float(e1)) + int(float(e2)),
                  "wall_s": round(b["wall_s"], 1)}))
PY
  stop_all
}

echo "model $MODEL, $CONVERSATIONS chats x $TURNS turns, user turns of $USER tokens, $GEN generated," \
  "replicas -t $THREADS -np 4 -c $CTX, $ROUNDS round(s)" >&2
for round in $(seq 1 "$ROUNDS"); do
  for setup in ${SETUPS:-hash+redis rr hash rr+redis}; do
    echo "round $round: $setup" >&2
    run_setup "$setup" "$round"
  done
done
