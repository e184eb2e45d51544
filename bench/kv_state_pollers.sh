#!/usr/bin/env bash
# What the live KV dashboard's endpoint costs the streams it watches: `kvserve serve` with a
# large pool (-c 1000000: ~255k blocks of stories260K), 4 streamed completions of TOKENS tokens
# each (ignore_eos), with 0 and then POLLERS threads polling GET /v1/kv/state in a loop. Prints
# one table row per poller count: the wall time of the streams, the p99 gap between streamed
# chunks, and the p50 latency of a poll. llama.cpp has no such endpoint: no peer figure.
#   usage: bench/kv_state_pollers.sh [-b KVSERVE] [-p POLLERS] [-n TOKENS] [-m MODEL]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/kvserve
POLLERS=50
TOKENS=2000
MODEL=${KVSERVE_TEST_MODELS:-../shared/models}/stories260K.gguf
while getopts "b:p:n:m:" o; do
  case $o in b) BIN=$OPTARG ;; p) POLLERS=$OPTARG ;; n) TOKENS=$OPTARG ;; m) MODEL=$OPTARG ;; *) exit 2 ;; esac
done
source bench/server_lib.sh
PORT=$(free_port)
"$BIN" serve -m "$MODEL" -t 1 -np 4 -c 1000000 --port "$PORT" >"$TMP/server.log" 2>&1 &
SERVER=$!
wait_ready "$PORT" || { tail -5 "$TMP/server.log" >&2; exit 1; }
echo "| build | pollers | $((4 * TOKENS)) streamed tokens | inter-token gap p99 | poll latency p50 |"
echo "|---|---|---|---|---|"
for pollers in 0 "$POLLERS"; do
  python3 - "$PORT" "$pollers" "$TOKENS" "$BIN" <<'PY'
import http.client, json, statistics, sys, threading, time
port, pollers, tokens, binary = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
stop = threading.Event()
poll_ms, gaps, lock = [], [], threading.Lock()

def poll():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.is_set():
        t0 = time.perf_counter()
        conn.request("GET", "/v1/kv/state")
        conn.getresponse().read()
        with lock:
            poll_ms.append(1e3 * (time.perf_counter() - t0))

def stream():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True,
                       "temperature": 0, "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    last, mine = None, []
    for line in r:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        now = time.perf_counter()
        if last is not None:
            mine.append(1e3 * (now - last))
        last = now
    with lock:
        gaps.extend(mine)

threads = [threading.Thread(target=poll, daemon=True) for _ in range(pollers)]
for t in threads:
    t.start()
t0 = time.perf_counter()
streams = [threading.Thread(target=stream) for _ in range(4)]
for t in streams:
    t.start()
for t in streams:
    t.join()
wall = time.perf_counter() - t0
stop.set()
p99 = statistics.quantiles(gaps, n=100)[98] if len(gaps) > 1 else float("nan")
p50 = "%.0f ms" % statistics.median(poll_ms) if poll_ms else "-"
print("| %s | %d | %.2f s | %.1f ms | %s |" % (binary, pollers, wall, p99, p50))
PY
done
