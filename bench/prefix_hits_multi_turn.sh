#!/usr/bin/env bash
# Prefix hits of multi-turn chats on kvserve (issue #42 acceptance 3): for each MODEL a server
# (-np 8 -c 4096, 2 threads) under `bench serve --workload multi-turn` (8 chats x 6 turns, 600
# new prompt tokens and 32 generated a turn, each turn resending the whole history). Prints the
# hit rate after the first turn (cached over prompt tokens, from the server's usage) and the later
# turns' TTFT. Give a sliding-window model and its full-attention twin (the same file with a
# window wider than the context) to compare the two rules.
#   usage: bench/prefix_hits_multi_turn.sh MODEL.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf..." >&2; exit 2; }
. bench/server_lib.sh
for MODEL in "$@"; do
  PORT=$(free_port)
  build/kvserve serve -m "$MODEL" --port "$PORT" -np 8 -c 4096 -t 2 2>"$TMP/server.log" &
  SERVER=$!
  wait_ready "$PORT"
  build/kvserve bench serve --url "http://127.0.0.1:$PORT" --workload multi-turn --conversations 8 \
    --turns 6 --prompt-tokens 600 --gen-tokens 32 --json >"$TMP/mt.json"
  kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
  python3 - "$TMP/mt.json" "$(basename "$MODEL" .gguf)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); later = r["after_first_turn"]
print(f"{sys.argv[2]}: errors {r['errors']}, prefix hit rate after the first turn "
      f"{later['prefix_hit_rate']:.3f} (all turns {r['prefix_hit_rate']:.3f}), later turns' TTFT "
      f"p50 {later['ttft_ms']['p50']:.0f} ms, p99 {later['ttft_ms']['p99']:.0f} ms")
PY
done
