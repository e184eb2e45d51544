#!/usr/bin/env bash
# Serving throughput of the peer engine, llama.cpp (llama-server, continuous batching), for
# side-by-side figures with kvserve. Starts llama-server with NP slots, then
# bench/load_client.py sends REQUESTS /completion requests, at most NP in flight, each a
# distinct random prompt of PROMPT_TOKENS token ids generating exactly GEN_TOKENS tokens
# (ignore_eos, temperature 0, cache_prompt false). Prints one JSON line:
#   {"engine":"llama.cpp","tool":"llama-server","np":..,"requests":..,"prompt_tokens":..,
#    "gen_tokens":..,"generated_total":..,"wall_s":..,"output_tps":..,"total_tps":..,
#    "ttft_ms":..,"tpot_ms":..,"latency_ms":..,"short":..,"flash_attn":"on","load_mode":..}
# output_tps = generated tokens / wall, total_tps = (prompt + generated tokens) / wall;
# ttft_ms and tpot_ms are server-side means per request (see load_client.py).
# KV: -c NP*(PROMPT+GEN+16), split into one KV stream per slot (-no-kvu, also llama-server's
# default when -np is given), so every slot holds PROMPT+GEN+16 tokens (rounded up to 256).
# KVU=1 uses one KV buffer shared by all slots (-kvu) instead. The RAM prompt cache is off
# (-cram 0): the prompts are never reused and saving a finished slot to it costs time. Flash
# attention is on (-fa on). LOAD_MODE is llama.cpp's -lm: mmap (its default; the file mapped,
# page-cache pages) or none (the weights read into memory); bench/throughput_compare.sh runs both.
#   usage: bench/peer_server.sh MODEL.gguf NP [REQUESTS=NP] [PROMPT_TOKENS=128] [GEN_TOKENS=128]
#   env:   THREADS (2), KVU (0|1, default 0), LOAD_MODE (mmap|none, default mmap),
#          KVS_PEER_DIR (~/.cache/kvserve-peer),
#          READY_TIMEOUT (seconds to wait for /health, 300), SERVER_LOG (keep the server log there)
set -euo pipefail

usage() { echo "usage: $0 MODEL.gguf NP [REQUESTS=NP] [PROMPT_TOKENS=128] [GEN_TOKENS=128]" >&2; exit 2; }
[[ $# -ge 2 && $# -le 5 ]] || usage
MODEL=$1
NP=$2
REQUESTS=${3:-$NP}
PROMPT=${4:-128}
GEN=${5:-128}
THREADS=${THREADS:-2}
KVU=${KVU:-0}
LOAD_MODE=${LOAD_MODE:-mmap}
READY_TIMEOUT=${READY_TIMEOUT:-300}
[[ -f $MODEL ]] || { echo "$0: no such model: $MODEL" >&2; exit 2; }
for v in NP REQUESTS PROMPT GEN THREADS READY_TIMEOUT; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "$0: $v must be a positive integer, got '${!v}'" >&2; usage; }
done
[[ $KVU == 0 || $KVU == 1 ]] || { echo "$0: KVU must be 0 or 1" >&2; exit 2; }
[[ $LOAD_MODE =~ ^(mmap|none|mlock|mmap\+mlock|dio|auto)$ ]] || { echo "$0: LOAD_MODE must be mmap or none" >&2; exit 2; }

HERE=$(cd "$(dirname "$0")" && pwd)
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
BIN=$PEER/llama-server
[[ -x $BIN ]] || { echo "$0: $BIN not found (set KVS_PEER_DIR)" >&2; exit 1; }
export LD_LIBRARY_PATH=$PEER${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

CTX=$((NP * (PROMPT + GEN + 16)))
if [[ $KVU == 1 ]]; then KV_FLAG=-kvu; else KV_FLAG=-no-kvu; fi
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT

# ggml's threads spin at barriers: another busy process on the cores slows them many times over
python3 - "$0" <<'PY' || true
import sys, time
def cpu():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return v[3] + v[4], sum(v)  # idle + iowait, total
i0, t0 = cpu(); time.sleep(0.5); i1, t1 = cpu()
busy = 1 - (i1 - i0) / max(t1 - t0, 1)
if busy > 0.2:
    print("%s: warning: the CPUs were %.0f%% busy before the run; its figures are not comparable"
          % (sys.argv[1], 100 * busy), file=sys.stderr)
PY

TMP=$(mktemp -d)
LOG=${SERVER_LOG:-$TMP/server.log}
SERVER_PID=
CLIENT_PID=
cleanup() {
  if [[ -n $CLIENT_PID ]]; then kill "$CLIENT_PID" 2>/dev/null || true; fi
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() {
  echo "$0: $1; last lines of the server log:" >&2
  tail -n 30 "$LOG" >&2
  exit 1
}

"$BIN" -m "$MODEL" -np "$NP" -c "$CTX" -t "$THREADS" -b 2048 -ub 512 $KV_FLAG -cram 0 -fa on -lm "$LOAD_MODE" \
  --host 127.0.0.1 --port "$PORT" >"$LOG" 2>&1 &
SERVER_PID=$!

deadline=$((SECONDS + READY_TIMEOUT))
until python3 - "$URL/health" <<'PY' 2>/dev/null
import sys, urllib.request
op = urllib.request.build_opener(urllib.request.ProxyHandler({}))
sys.exit(0 if op.open(sys.argv[1], timeout=2).status == 200 else 1)
PY
do
  kill -0 "$SERVER_PID" 2>/dev/null || fail "llama-server exited before it was ready"
  ((SECONDS < deadline)) || fail "llama-server not ready after ${READY_TIMEOUT}s"
  sleep 0.5
done

# in the background so that a signal to this script reaches the traps at once (wait is interruptible)
python3 "$HERE/load_client.py" --url "$URL" --endpoint /completion --concurrency "$NP" --requests "$REQUESTS" \
  --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --engine llama.cpp --tool llama-server \
  --field flash_attn=on --field load_mode="$LOAD_MODE" &
CLIENT_PID=$!
wait "$CLIENT_PID" || fail "the load client failed"
CLIENT_PID=
