#!/usr/bin/env bash
# kvserve serve next to llama-server on the same GGUF, measured by the same load generator
# (`kvserve bench serve`: streamed /v1/completions, PROMPT random prompt tokens, GEN generated
# tokens with EOS ignored, a fixed seed per concurrency so no prompt repeats across runs, and
# "cache_prompt": false so that llama-server does not reuse a slot's KV). Both servers: -np NP, 2 threads, room for NP full
# sequences. For each concurrency C: max(8, C) requests (64 at C = 64), all offered at once.
# llama-server runs with flash attention on, once per load mode of PEER_LOAD_MODES (default
# "mmap none": its default file mapping, and the weights read into memory, as kvserve reads them
# into huge pages); the ratio rows are against the better of them at each C.
#   usage: bench/serve_compare.sh MODEL.gguf [CONCURRENCY_LIST=1,4,16,64] [NP=16] [PROMPT=128] [GEN=128]
#   env:   THREADS (2), PEER_LOAD_MODES ("mmap none")
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [CONCURRENCY_LIST] [NP] [PROMPT] [GEN]" >&2; exit 2; }
MODEL=$1 CLIST=${2:-1,4,16,64} NP=${3:-16} PROMPT=${4:-128} GEN=${5:-128}
THREADS=${THREADS:-2}
. bench/server_lib.sh
run_load() {  # $1 engine label, $2 port
  for c in ${CLIST//,/ }; do
    n=$(( c > 8 ? c : 8 )); [ "$c" -eq 16 ] && n=32
    build/kvserve bench serve --url "http://127.0.0.1:$2" --concurrency "$c" --requests "$n" \
      --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --seed "$((1000 + c))" --json | sed "s/^{/{\"engine\":\"$1\",/" >>"$TMP/results.jsonl" || true
  done
}
CTX=$(( PROMPT + GEN + 16 ))
PORT=$(free_port)
build/kvserve serve -m "$MODEL" --port "$PORT" -np "$NP" -c "$CTX" -t "$THREADS" 2>"$TMP/kvserve.log" &
SERVER=$!
wait_ready "$PORT"
run_load kvserve "$PORT"
kill -TERM "$SERVER"; wait "$SERVER" || true
for lm in ${PEER_LOAD_MODES:-mmap none}; do
  PORT=$(free_port)
  LD_LIBRARY_PATH="$PEER:${LD_LIBRARY_PATH:-}" "$PEER/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$PORT" \
    -np "$NP" -c $(( NP * CTX )) -t "$THREADS" -b 2048 -ub 512 -cram 0 -fa on -lm "$lm" >"$TMP/llama.log" 2>&1 &
  SERVER=$!
  wait_ready "$PORT"
  run_load "llama-server -lm $lm" "$PORT"
  kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
done
python3 - "$TMP/results.jsonl" "$(basename "$MODEL" .gguf)" "$NP" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["engine"], r["concurrency"]): r for r in rows}
engines = list(dict.fromkeys(r["engine"] for r in rows))  # kvserve, then llama-server per load mode
print(f"model {sys.argv[2]}, both servers -np {sys.argv[3]}, {rows[0]['prompt_tokens']} prompt + {rows[0]['gen_tokens']} "
      f"generated tokens; llama-server -fa on, ratios against its better load mode at each C\n")
print("| C | requests | engine | errors | output t/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms |")
print("|---|---|---|---|---|---|---|---|---|")
for c in sorted({r["concurrency"] for r in rows}):
    for e in engines:
        r = by.get((e, c))
        if r: print(f"| {c} | {r['requests']} | {e} | {r['errors']} | {r['output_tps']:.1f} | {r['ttft_ms']['p50']:.0f} | "
                    f"{r['ttft_ms']['p99']:.0f} | {r['tpot_ms']['p50']:.1f} | {r['itl_ms']['p99']:.1f} |")
    a = by.get(("kvserve", c))
    peers = [by[(e, c)] for e in engines if e != "kvserve" and (e, c) in by]
    if a and peers:
        b = max(peers, key=lambda r: r["output_tps"])  # throughput and TTFT ratios against the same run
        if b["output_tps"] > 0:
            print(f"| {c} | | ratio vs {b['engine']} | | {a['output_tps'] / b['output_tps']:.2f}x | | "
                  f"{b['ttft_ms']['p99'] / max(a['ttft_ms']['p99'], 1e-9):.2f}x lower | | |")
PY
