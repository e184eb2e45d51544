#!/usr/bin/env bash
# Prefix caching through the server, kvserve with the cache on and off next to llama-server
# (cache_prompt on, -np 16), same model, same load generator (`kvserve bench serve`):
#   (a) shared-prefix: a PREFIX-token shared system prompt (random ids), then 32 different
#       32-token questions, 32 generated tokens each; the first request alone (cold), the
#       other 31 at concurrency 4 (warm).
#   (b) multi-turn: CONVERSATIONS (8) conversations of TURNS (6) turns at once, each turn resending the whole history
#       as token ids plus a 32-token user turn, 48 generated tokens per turn (the reply's ids
#       from return_token_ids; llama-server sends none, so its replies are resent as stand-in
#       ids and only the history before each reply can hit its cache).
# llama-server runs with flash attention on, once per load mode of PEER_LOAD_MODES (default
# "mmap none": its default file mapping, and the weights read into memory, as kvserve reads them
# into huge pages); the closing ratio is against the better of them.
#   usage: bench/prefix_compare.sh MODEL.gguf [PREFIX=2000]
#   env:   THREADS (2), PEER_LOAD_MODES ("mmap none")
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [PREFIX]" >&2; exit 2; }
MODEL=$1 PREFIX=${2:-2000}
THREADS=${THREADS:-2} NP=16 CTX=2560
CONVERSATIONS=${CONVERSATIONS:-8} TURNS=${TURNS:-6}  # the multi-turn workload (bench/report.sh --quick: fewer)
. bench/server_lib.sh
load() {  # $1 label, $2 port
  build/kvserve bench serve --url "http://127.0.0.1:$2" --workload shared-prefix --prefix-tokens "$PREFIX" \
    --requests 32 --concurrency 4 --prompt-tokens 32 --gen-tokens 32 --json | sed "s/^{/{\"engine\":\"$1\",/" >>"$TMP/r.jsonl"
  build/kvserve bench serve --url "http://127.0.0.1:$2" --workload multi-turn --conversations "$CONVERSATIONS" --turns "$TURNS" \
    --prompt-tokens 32 --gen-tokens 48 --json | sed "s/^{/{\"engine\":\"$1\",/" >>"$TMP/r.jsonl"
}
for mode in on off; do
  PORT=$(free_port)
  flags=(); [ $mode = off ] && flags=(--no-prefix-cache)
  build/kvserve serve -m "$MODEL" --port "$PORT" -np $NP -c $CTX -t "$THREADS" "${flags[@]}" 2>"$TMP/kvserve.log" &
  SERVER=$!; wait_ready "$PORT"; load "kvserve-cache-$mode" "$PORT"
  kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
done
for lm in ${PEER_LOAD_MODES:-mmap none}; do
  PORT=$(free_port)
  LD_LIBRARY_PATH="$PEER:${LD_LIBRARY_PATH:-}" "$PEER/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$PORT" \
    -np $NP -c $((NP * CTX)) -t "$THREADS" -b 2048 -ub 512 -fa on -lm "$lm" >"$TMP/llama.log" 2>&1 &
  SERVER=$!; wait_ready "$PORT"; load "llama-server -lm $lm" "$PORT"
  kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
done
python3 - "$TMP/r.jsonl" "$(basename "$MODEL" .gguf)" "$PREFIX" "$CONVERSATIONS" "$TURNS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"model {sys.argv[2]}\n\n(a) shared prefix of {sys.argv[3]} tokens, 32 questions of 32 tokens, 32 generated\n")
print("| engine | errors | cold TTFT ms | warm TTFT p50 ms | warm TTFT p99 ms | cold / warm | output t/s (warm phase) |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    if r["workload"] == "shared-prefix":
        print(f"| {r['engine']} | {r['errors']} | {r['ttft_cold_ms']:.0f} | {r['ttft_ms']['p50']:.0f} | {r['ttft_ms']['p99']:.0f} | "
              f"{r['cold_over_warm_ttft']:.1f}x | {r['output_tps']:.1f} |")
print(f"\n(b) multi-turn: {sys.argv[4]} conversations x {sys.argv[5]} turns, history resent each turn, 48 generated per turn\n")
print("| engine | errors | requests | wall s | output t/s | total t/s | TTFT p50 ms | TTFT p99 ms |")
print("|---|---|---|---|---|---|---|---|")
mt = {r["engine"]: r for r in rows if r["workload"] == "multi-turn"}
for e, r in mt.items():
    print(f"| {e} | {r['errors']} | {r['requests']} | {r['wall_s']:.1f} | {r['output_tps']:.1f} | {r['total_tps']:.1f} | "
          f"{r['ttft_ms']['p50']:.0f} | {r['ttft_ms']['p99']:.0f} |")
peers = [r for e, r in mt.items() if e.startswith("llama-server")]
if "kvserve-cache-on" in mt and peers:
    b = max(peers, key=lambda r: r["output_tps"])
    print(f"\nmulti-turn output throughput, kvserve (cache on) / {b['engine']} (llama-server -fa on, its better load mode): "
          f"{mt['kvserve-cache-on']['output_tps'] / b['output_tps']:.2f}x")
PY
