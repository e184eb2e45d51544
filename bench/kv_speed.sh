#!/usr/bin/env bash
# Decode speed by KV cache type at several context depths: kvserve bench speed next to
# llama-bench (flash attention on, which quantized V needs there) for the types both have.
# Prints a markdown table: one row per type, tokens/s at each depth.
#   usage: bench/kv_speed.sh [-d "0 1024 4096"] [-n TOKENS] [-r REPS] [-t THREADS] MODEL.gguf
set -euo pipefail
cd "$(dirname "$0")/.."
DEPTHS="0 1024 4096"
NGEN=32
REPS=3
THREADS=2
while getopts "d:n:r:t:" o; do
  case $o in d) DEPTHS=$OPTARG ;; n) NGEN=$OPTARG ;; r) REPS=$OPTARG ;; t) THREADS=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
MODEL=$1
BIN=${KVSERVE_BIN:-build/kvserve}
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
TYPES=${KV_TYPES:-"f16 bf16 q8_0 int8 fp8 q4_0 turbo4 turbo3"}
PEER_TYPES=" f16 bf16 q8_0 q4_0 "

header="| K/V |"
rule="|---|"
for d in $DEPTHS; do
  header+=" kvserve tg$NGEN @ d$d | llama.cpp tg$NGEN @ d$d |"
  rule+="---|---|"
done
echo "$(basename "$MODEL" .gguf), $THREADS threads, $REPS repetitions, tokens/s (mean ± sd)"
echo
echo "$header"
echo "$rule"
for t in $TYPES; do
  row="| $t/$t |"
  peer_json=""
  if [[ $PEER_TYPES == *" $t "* ]] && [ -x "$PEER/llama-bench" ]; then
    peer_json=$("$PEER/llama-bench" -m "$MODEL" -t "$THREADS" -fa on -ctk "$t" -ctv "$t" -p 0 \
      -n "$NGEN" -r "$REPS" -d "$(echo $DEPTHS | tr ' ' ',')" -o json 2>/dev/null || true)
  fi
  for d in $DEPTHS; do
    ours=$("$BIN" bench speed -m "$MODEL" -t "$THREADS" -p 0 -n "$NGEN" -r "$REPS" -d "$d" \
      -ctk "$t" -ctv "$t" --json 2>/dev/null |
      python3 -c 'import json,sys; j=json.load(sys.stdin); print("%.2f ± %.2f" % (j["tg_tps"], j["tg_tps_stddev"]))' ||
      echo error)
    peer="n/a"
    if [ -n "$peer_json" ]; then
      peer=$(python3 -c '
import json, sys
for r in json.loads(sys.argv[1]):
    if r.get("n_depth", 0) == int(sys.argv[2]) and r["n_gen"] > 0:
        print("%.2f ± %.2f" % (r["avg_ts"], r["stddev_ts"]))
        break
else:
    print("error")' "$peer_json" "$d")
    fi
    row+=" $ours | $peer |"
  done
  echo "$row"
done
