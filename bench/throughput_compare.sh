#!/usr/bin/env bash
# Aggregate throughput of kvserve next to llama.cpp on the same GGUF, 2 threads, one workload:
# NPL requests at once, each PROMPT random prompt tokens then GEN generated tokens (EOS ignored).
#   kvserve:    `kvserve bench throughput --requests N --concurrency N` (the engine, -np N)
#   llama.cpp:  llama-batched-bench -npl N (bench/peer_batched.sh), and llama-server -np SERVER_NP
#               with SERVER_NP concurrent requests (bench/peer_server.sh)
# Prints a markdown table: aggregate decode t/s (all sequences decoding together: kvserve's
# decode_tps, batched-bench's S_TG), the ratio, and prefill/overall figures.
# llama.cpp runs with flash attention on and in each load mode of PEER_LOAD_MODES (default
# "mmap none": its default file mapping, and the weights read into memory, as kvserve reads
# them into huge pages); each figure quoted is the better mode's, named in brackets.
#   usage: bench/throughput_compare.sh MODEL.gguf [NPL_LIST=1,4,16,64] [PROMPT=128] [GEN=128] [SERVER_NP=16]
#   env:   THREADS (2), PEER_LOAD_MODES ("mmap none")
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
for lm in ${PEER_LOAD_MODES:-mmap none}; do
  THREADS=$THREADS LOAD_MODE=$lm bench/peer_batched.sh "$MODEL" "$NPL" "$PROMPT" "$GEN" >>"$TMP/batched.jsonl"
  THREADS=$THREADS LOAD_MODE=$lm bench/peer_server.sh "$MODEL" "$SERVER_NP" "$SERVER_NP" "$PROMPT" "$GEN" >>"$TMP/server.jsonl"
done
build/kvserve bench throughput -m "$MODEL" --requests "$SERVER_NP" --concurrency "$SERVER_NP" \
  --prompt-tokens "$PROMPT" --gen-tokens "$GEN" -t "$THREADS" --json >"$TMP/ours_server.jsonl"
python3 - "$MODEL" "$TMP" <<'PY'
import json, os, sys
model, tmp = os.path.basename(sys.argv[1])[:-5], sys.argv[2]
load = lambda f: [json.loads(l) for l in open(os.path.join(tmp, f)) if l.strip()]
ours = {r["concurrency"]: r for r in load("ours.jsonl")}
peer = {}  # npl -> that npl's rows, one per load mode
for r in load("batched.jsonl"):
    peer.setdefault(r["npl"], []).append(r)
best = lambda rows, key: max(rows, key=lambda r: r[key])
print(f"model {model}, {next(iter(ours.values()))['prompt_tokens']} prompt + "
      f"{next(iter(ours.values()))['gen_tokens']} generated tokens per sequence; llama.cpp -fa on, "
      f"the better of -lm {' / '.join(sorted({r['load_mode'] for rs in peer.values() for r in rs}))} per figure\n")
print("| sequences | kvserve decode t/s | llama-batched-bench S_TG | ratio | kvserve total t/s | llama.cpp S_total | kvserve mean TTFT s |")
print("|---|---|---|---|---|---|---|")
for n in sorted(ours):
    o, tg, tot = ours[n], best(peer[n], "s_tg"), best(peer[n], "s_total")
    print(f"| {n} | {o['decode_tps']:.1f} | {tg['s_tg']:.1f} ({tg['load_mode']}) | {o['decode_tps'] / tg['s_tg']:.2f} | "
          f"{o['total_tps']:.1f} | {tot['s_total']:.1f} ({tot['load_mode']}) | {o['mean_ttft_s']:.2f} |")
servers, o = load("server.jsonl"), load("ours_server.jsonl")[0]
s = best(servers, "output_tps")
print(f"\nserving {s['np']} concurrent requests: kvserve output {o['output_tps']:.1f} t/s, total "
      f"{o['total_tps']:.1f} t/s, wall {o['wall_s']:.2f} s; llama-server -np {s['np']} -lm {s['load_mode']} output "
      f"{s['output_tps']:.1f} t/s, total {s['total_tps']:.1f} t/s, wall {s['wall_s']:.2f} s "
      f"(ratio {o['output_tps'] / s['output_tps']:.2f})")
if len(servers) > 1:
    print("llama-server output t/s by load mode: " + ", ".join(f"-lm {r['load_mode']} {r['output_tps']:.1f}" for r in servers))
PY
