#!/usr/bin/env bash
# Stall-free batching's step-time target (--max-step-ms) swept on kvserve serve, with issue #5's
# load (`kvserve bench serve`: streamed /v1/completions, PROMPT random prompt tokens, GEN
# generated with EOS ignored, all requests offered at once: max(8, C), 32 at C = 16). Rounds go
# through the targets in turn (the VM's speed drifts), each on a fresh server.
#   usage: bench/step_target_sweep.sh MODEL.gguf [TARGETS_MS=0,100,150,250] [CONCURRENCY_LIST=16,64] [ROUNDS=1] [NP=16] [PROMPT=128] [GEN=128]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [TARGETS_MS] [CONCURRENCY_LIST] [ROUNDS] [NP] [PROMPT] [GEN]" >&2; exit 2; }
MODEL=$1 TARGETS=${2:-0,100,150,250} CLIST=${3:-16,64} ROUNDS=${4:-1} NP=${5:-16} PROMPT=${6:-128} GEN=${7:-128}
. bench/server_lib.sh
CTX=$(( PROMPT + GEN + 16 ))
for round in $(seq 1 "$ROUNDS"); do
  for ms in ${TARGETS//,/ }; do
    PORT=$(free_port)
    build/kvserve serve -m "$MODEL" --port "$PORT" -np "$NP" -c "$CTX" -t 2 --max-step-ms "$ms" \
      2>"$TMP/kvserve.log" &
    SERVER=$!
    wait_ready "$PORT"
    for c in ${CLIST//,/ }; do
      n=$(( c > 8 ? c : 8 )); [ "$c" -eq 16 ] && n=32
      build/kvserve bench serve --url "http://127.0.0.1:$PORT" --concurrency "$c" --requests "$n" \
        --prompt-tokens "$PROMPT" --gen-tokens "$GEN" --seed "$((1000 + c))" --json |
        sed "s/^{/{\"max_step_ms\":$ms,\"round\":$round,/" >>"$TMP/results.jsonl"
    done
    kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
  done
done
python3 - "$TMP/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| --max-step-ms | C | round | errors | output t/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p99 ms |")
print("|---|---|---|---|---|---|---|---|---|")
for r in sorted(rows, key=lambda r: (r["concurrency"], r["max_step_ms"], r["round"])):
    print(f"| {r['max_step_ms']} | {r['concurrency']} | {r['round']} | {r['errors']} | {r['output_tps']:.1f} | "
          f"{r['ttft_ms']['p50']:.0f} | {r['ttft_ms']['p99']:.0f} | {r['tpot_ms']['p50']:.1f} | {r['itl_ms']['p99']:.1f} |")
PY
