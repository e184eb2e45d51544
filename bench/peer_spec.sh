#!/usr/bin/env bash
# Speculative decoding in the peer, llama.cpp's llama-server, one sequence, greedy, for figures
# beside `kvserve bench spec`: starts llama-server (-fa on, -t/-tb/-td THREADS, -lm LOAD_MODE)
# with the given speculative flags, sends the prompt file once untimed (warm-up) and then REPS
# times to /completion (n_predict N, temperature 0, ignore_eos, cache_prompt true: the prompt is
# prefilled once, as in kvserve bench spec) and prints one JSON line with the median decode
# tokens/s (the server's timings.predicted_per_second) and the draft counts it reports:
#   {"engine":"llama.cpp","spec":"...","load_mode":..,"tg_tps":..,"draft_n":..,
#    "draft_n_accepted":..,"acceptance_rate":..,"n_predict":..}
#   usage: bench/peer_spec.sh MODEL.gguf PROMPT_FILE N [llama-server speculative flags...]
#   env:   THREADS (2), LOAD_MODE (mmap|none, default mmap), REPS (3), CTX (4096),
#          KVS_PEER_DIR (~/.cache/kvserve-peer)
set -euo pipefail
[[ $# -ge 3 ]] || { echo "usage: $0 MODEL.gguf PROMPT_FILE N [spec flags...]" >&2; exit 2; }
MODEL=$1 PROMPT_FILE=$2 N=$3
shift 3
THREADS=${THREADS:-2} LOAD_MODE=${LOAD_MODE:-mmap} REPS=${REPS:-3} CTX=${CTX:-4096}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/server_lib.sh"
export LD_LIBRARY_PATH=$PEER${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
PORT=$(free_port)
"$PEER/llama-server" -m "$MODEL" -t "$THREADS" -tb "$THREADS" -fa on -c "$CTX" -np 1 -lm "$LOAD_MODE" \
  --port "$PORT" --host 127.0.0.1 "$@" >"$TMP/server.log" 2>&1 &
SERVER=$!
wait_ready "$PORT" || { tail -20 "$TMP/server.log" >&2; exit 1; }
python3 - "$PORT" "$PROMPT_FILE" "$N" "$REPS" "$LOAD_MODE" "$*" <<'PY'
import json, statistics, sys, urllib.error, urllib.request
port, prompt_file, n, reps, load_mode, spec = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
prompt = open(prompt_file).read()
def run():
    body = json.dumps({"prompt": prompt, "n_predict": n, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": True}).encode()
    req = urllib.request.Request("http://127.0.0.1:%s/completion" % port, body,
                                 {"Content-Type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(req, timeout=3600))
    except urllib.error.HTTPError as e:
        sys.exit("llama-server: HTTP %d: %s" % (e.code, e.read().decode(errors="replace")[:500]))
run()  # warm-up: prefill, page-in
tps, drafted, accepted = [], 0, 0
for _ in range(reps):
    r = run()
    t = r["timings"]
    tps.append(t["predicted_per_second"])
    drafted += t.get("draft_n", 0)
    accepted += t.get("draft_n_accepted", 0)
print(json.dumps({"engine": "llama.cpp", "spec": spec or "none", "load_mode": load_mode,
                  "tg_tps": statistics.median(tps), "tg_tps_all": tps, "draft_n": drafted,
                  "draft_n_accepted": accepted,
                  "acceptance_rate": accepted / drafted if drafted else 0.0, "n_predict": n}))
PY
