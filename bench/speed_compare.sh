#!/usr/bin/env bash
# Prefill and decode speed of kvserve next to llama-bench on the same GGUF, 2 threads.
# Prints a markdown table: pp512 and tg128 for both, the ratios, and decode's share of the
# bandwidth roofline (weight bytes per token x tokens/s / measured read bandwidth).
#   usage: bench/speed_compare.sh [-r REPS] [-t THREADS] MODEL.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=3
THREADS=2
while getopts "r:t:" o; do case $o in r) REPS=$OPTARG ;; t) THREADS=$OPTARG ;; *) exit 2 ;; esac; done
shift $((OPTIND - 1))
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
BW=$(build/kvserve bench bandwidth -t "$THREADS" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["read_gbps"])')
echo "read bandwidth with $THREADS threads: $BW GB/s (kvserve bench bandwidth)"
echo
echo "| model | kvserve pp512 | llama.cpp pp512 | ratio | kvserve tg128 | llama.cpp tg128 | ratio | GB/token | kvserve roofline | llama.cpp roofline |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for m in "$@"; do
  ours=$(build/kvserve bench speed -m "$m" -p 512 -n 128 -t "$THREADS" -r "$REPS" --json 2>/dev/null)
  peer=$("$PEER/llama-bench" -m "$m" -t "$THREADS" -p 512 -n 128 -r "$REPS" -o json 2>/dev/null)
  python3 - "$m" "$BW" "$ours" "$peer" <<'PY'
import json, os, sys
name, bw, ours, peer = os.path.basename(sys.argv[1])[:-5], float(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
pp = next(r for r in peer if r["n_prompt"] > 0 and r["n_gen"] == 0)
tg = next(r for r in peer if r["n_gen"] > 0 and r["n_prompt"] == 0)
gb = ours["weight_bytes_per_token"] / 1e9
f = lambda m, s: "%.1f ± %.1f" % (m, s)
print("| %s | %s | %s | %.2f | %s | %s | %.2f | %.3f | %.0f%% | %.0f%% |" % (
    name, f(ours["pp_tps"], ours["pp_tps_stddev"]), f(pp["avg_ts"], pp["stddev_ts"]), ours["pp_tps"] / pp["avg_ts"],
    f(ours["tg_tps"], ours["tg_tps_stddev"]), f(tg["avg_ts"], tg["stddev_ts"]), ours["tg_tps"] / tg["avg_ts"],
    gb, 100 * ours["tg_tps"] * gb / bw, 100 * tg["avg_ts"] * gb / bw))
PY
done
