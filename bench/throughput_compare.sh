#!/usr/bin/env bash
# Aggregate throughput of kvserve next to llama.cpp on the same GGUF, 2 threads, one workload:
# NPL requests at once, each PROMPT random prompt tokens then GEN generated tokens (EOS ignored).
#   kvserve:    `kvserve bench throughput --requests N --concurrency N` (the engine, -np N)
#   llama.cpp:  llama-batched-bench -npl N (bench/peer_batched.sh), and llama-server -np SERVER_NP
#               with SERVER_NP concurrent requests (bench/peer_server.sh)
# Prints a markdown table: aggregate decode t/s (all sequences decoding together: kvserve's
# decode_tps, batched-bench's S_TG), the ratio, and prefill/overall figures.
#   usage: bench/throughput_compare.sh MODEL.gguf [NPL_LIST=1,4,16,64] [PROMPT=128] [GEN=128] [SERVER_NP=16]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 1 ]] || { echo "usage: $0 MODEL.gguf [NPL_LIST] [PROMPT] [GEN] [SERVER_NP]" >&2; exit 2; }
MODEL=$1 NPL=${2:-1,4,16,64} PROMPT=${3:-128} GEN=${4:-128} SERVER_NP=${5:-16}
THREADS=${THREADS:-2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for n in ${NPL//,/ }; do
  build/kvserve bench throughput -m "$MODEL" --requests "$n" --concurrency "$n" \
    --prompt-tokens "$PROMPT" --gen-tokens "$GEN" -t "$THREADS" --json >>"$TMP/ours.jsonl"
done
THREADS=$THREADS bench/peer_batched.sh "$MODEL" "$NPL" "$PROMPT" "$GEN" >"$TMP/batched.jsonl"
THREADS=$THREADS bench/peer_server.sh "$MODEL" "$SERVER_NP" "$SERVER_NP" "$PROMPT" "$GEN" >"$TMP/server.jsonl"
build/kvserve bench throughput -m "$MODEL" --requests "$SERVER_NP" --concurrency "$SERVER_NP" \
  --prompt-tokens "$PROMPT" --gen-tokens "$GEN" -t "$THREADS" --json >"$TMP/ours_server.jsonl"
python3 - "$MODEL" "$TMP" <<'PY'
import json, os, sys
model, tmp = os.path.basename(sys.argv[1])[:-5], sys.argv[2]
load = lambda f: [json.loads(l) for l in open(os.path.join(tmp, f)) if l.strip()]
ours = {r["concurrency"]: r for r in load("ours.jsonl")}
peer = {r["npl"]: r for r in load("batched.jsonl")}
print(f"model {model}, {next(iter(ours.values()))['prompt_tokens']} prompt + "
      f"{next(iter(ours.values()))['gen_tokens']} generated tokens per sequence\n")
print("| sequences | kvserve decode t/s | llama-batched-bench S_TG | ratio | kvserve total t/s | llama.cpp S_total | kvserve mean TTFT s |")
print("|---|---|---|---|---|---|---|")
for n in sorted(ours):
    o, p = ours[n], peer[n]
    print(f"| {n} | {o['decode_tps']:.1f} | {p['s_tg']:.1f} | {o['decode_tps'] / p['s_tg']:.2f} | "
          f"{o['total_tps']:.1f} | {p['s_total']:.1f} | {o['mean_ttft_s']:.2f} |")
s, o = load("server.jsonl")[0], load("ours_server.jsonl")[0]
print(f"\nserving {s['np']} concurrent requests: kvserve output {o['output_tps']:.1f} t/s, total "
      f"{o['total_tps']:.1f} t/s, wall {o['wall_s']:.2f} s; llama-server -np {s['np']} output "
      f"{s['output_tps']:.1f} t/s, total {s['total_tps']:.1f} t/s, wall {s['wall_s']:.2f} s "
      f"(ratio {o['output_tps'] / s['output_tps']:.2f})")
PY
