#!/usr/bin/env bash
# Two kvserve binaries' servers (e.g. before and after a change) under the same load generator,
# interleaved rounds (A, B, A, B) so that the VM's drift hits both alike. Each server: -np 16,
# 2 threads; per concurrency C: max(8, C) requests (32 at 16) of PROMPT random prompt tokens and
# GEN generated tokens, streamed.
#   usage: bench/serve_ab.sh A_BIN B_BIN MODEL.gguf [CONCURRENCY_LIST=1,4,16] [ROUNDS=2]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 3 ]] || { echo "usage: $0 A_BIN B_BIN MODEL.gguf [CONCURRENCY_LIST] [ROUNDS]" >&2; exit 2; }
A=$1 B=$2 MODEL=$3 CLIST=${4:-1,4,16} ROUNDS=${5:-2} PROMPT=128 GEN=128
. bench/server_lib.sh
for round in $(seq 1 "$ROUNDS"); do
  for tag in A B; do
    bin=$A; [ $tag = B ] && bin=$B
    start_ab_server "$bin" "$MODEL" $((PROMPT + GEN + 16))
    for c in ${CLIST//,/ }; do
      n=$(( c > 8 ? c : 8 )); [ "$c" -eq 16 ] && n=32
      build/kvserve bench serve --url "http://127.0.0.1:$PORT" --concurrency "$c" --requests "$n" \
        --prompt-tokens $PROMPT --gen-tokens $GEN --seed $((2000 + c + 100 * round)) --json |
        python3 -c "import json,sys; r=json.load(sys.stdin); print(f'round $round $tag C=$c errors {r[\"errors\"]} output t/s {r[\"output_tps\"]:.1f} TTFT p50 {r[\"ttft_ms\"][\"p50\"]:.0f} p99 {r[\"ttft_ms\"][\"p99\"]:.0f} ms, TPOT p50 {r[\"tpot_ms\"][\"p50\"]:.1f} ms')"
    done
    kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
  done
done
