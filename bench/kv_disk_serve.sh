#!/usr/bin/env bash
# Issue #20's serving figures for the disk tier, kvserve against itself with the tier off and on
# (write-through), in interleaved rounds (off, on, off, on) so that the VM's drift hits both:
#   smooth   -np 16, C = 16, 32 requests of 128 random prompt tokens and 128 generated: output
#            t/s and ITL p99 (every block a request commits is queued for the disk as it goes).
#   capacity --workload shared-prefix --prefixes N (default 40) of PREFIX tokens (2000) taken in
#            turn, two passes (2N requests, 32 generated tokens each, C = 1), with a RAM pool
#            holding POOL_PREFIXES (8) prefixes: hit rate and mean TTFT. Off, the second pass
#            finds its prefix evicted; on, it loads it from disk.
#   usage: bench/kv_disk_serve.sh MODEL.gguf [smooth|capacity|both] [ROUNDS=2] [PREFIXES=40] [PREFIX=2000]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [smooth|capacity|both] [ROUNDS] [PREFIXES] [PREFIX]" >&2; exit 2; }
MODEL=$1 WHAT=${2:-both} ROUNDS=${3:-2} PREFIXES=${4:-40} PREFIX=${5:-2000} POOL_PREFIXES=8
. bench/server_lib.sh
serve() {  # $1 tag (off|on), then serve flags
  local tag=$1; shift
  PORT=$(free_port)
  local disk=()
  [ "$tag" = on ] && disk=(--kv-disk "$TMP/disk-$RANDOM")
  build/kvserve serve -m "$MODEL" --port "$PORT" -t 2 "${disk[@]}" "$@" 2>>"$TMP/server.log" &
  SERVER=$!
  wait_ready "$PORT"
}
stop() { kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=; }
for round in $(seq 1 "$ROUNDS"); do
  for tag in off on; do
    if [ "$WHAT" != capacity ]; then
      serve $tag -np 16 -c 272
      build/kvserve bench serve --url "http://127.0.0.1:$PORT" --concurrency 16 --requests 32 \
        --prompt-tokens 128 --gen-tokens 128 --seed $((3000 + round)) --json |
        python3 -c "import json,sys; r=json.load(sys.stdin); print(f'round $round smooth tier $tag: errors {r[\"errors\"]} output t/s {r[\"output_tps\"]:.1f} ITL p50 {r[\"itl_ms\"][\"p50\"]:.1f} p99 {r[\"itl_ms\"][\"p99\"]:.1f} ms, TTFT p50 {r[\"ttft_ms\"][\"p50\"]:.0f} ms', flush=True)"
      curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^kvserve:kv_disk_(bytes_written|dropped)_total' | tr '\n' ' ' || true; echo
      stop
    fi
    if [ "$WHAT" != smooth ]; then
      # A RAM pool of POOL_PREFIXES prefixes and their requests' tails (f16 KV).
      bpt=$(build/kvserve inspect "$MODEL" --json 2>/dev/null |
        python3 -c "import json,sys; print(int(json.load(sys.stdin)['kv_format']['bytes_per_token']))")
      serve $tag -np 1 -c $((PREFIX + 64)) --kv-memory $(( (PREFIX + 64) * POOL_PREFIXES * bpt ))
      build/kvserve bench serve --url "http://127.0.0.1:$PORT" --workload shared-prefix \
        --prefixes "$PREFIXES" --prefix-tokens "$PREFIX" --requests $((2 * PREFIXES)) \
        --concurrency 1 --prompt-tokens 16 --gen-tokens 32 --seed $((4000 + round)) --json |
        python3 -c "import json,sys; r=json.load(sys.stdin); print(f'round $round capacity tier $tag: {r[\"prefixes\"]} prefixes x $PREFIX tokens, pool for $POOL_PREFIXES: errors {r[\"errors\"]} hit rate {r[\"prefix_hit_rate\"]:.3f} TTFT mean {r[\"ttft_ms\"][\"mean\"]:.0f} p50 {r[\"ttft_ms\"][\"p50\"]:.0f} ms', flush=True)"
      curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^kvserve:kv_disk_(hits|misses|bytes_read)_total' | tr '\n' ' ' || true; echo
      stop
    fi
  done
done
