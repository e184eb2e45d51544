#!/usr/bin/env bash
# Perplexity of kvserve next to llama-perplexity on the same GGUF, text and context.
# Prints a markdown table row per model.  Needs the peer (../shared/peer/build-llama-cpp.sh)
# and the bench models (../shared/peer/make-bench-models.sh).
# llama-perplexity runs with -fa on, as every peer run of these scripts (its default, auto,
# resolves to on for the CPU backend, so the figures are those of a run without the flag). Its
# load mode does not change the result, so it keeps the default.
# -n CHUNKS scores only the first CHUNKS windows in both (--chunks), for large models.
#   usage: bench/ppl_compare.sh [-c CTX] [-f TEXT] [-n CHUNKS] MODEL.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
CTX=128
TEXT=bench/data/stories-sample.txt
CHUNKS=()
while getopts "c:f:n:" o; do
  case $o in c) CTX=$OPTARG ;; f) TEXT=$OPTARG ;; n) CHUNKS=(--chunks "$OPTARG") ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
echo "| model | kvserve PPL | llama.cpp PPL | difference |"
echo "|---|---|---|---|"
for m in "$@"; do
  ours=$(build/kvserve perplexity -m "$m" -f "$TEXT" -c "$CTX" "${CHUNKS[@]}" -t 2 --json 2>/dev/null |
         python3 -c 'import json,sys; print("%.4f" % json.load(sys.stdin)["ppl"])' || echo "error")
  peer=$("$PEER/llama-perplexity" -m "$m" -f "$TEXT" -c "$CTX" "${CHUNKS[@]}" -t 2 -fa on 2>&1 |
         sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
  diff=$(python3 -c "a,b='$ours','$peer'
try: print('%+.3f%%' % (100*(float(a)/float(b)-1)))
except Exception: print('n/a')")
  echo "| $(basename "$m" .gguf) | $ours | ${peer:-error} | $diff |"
done
