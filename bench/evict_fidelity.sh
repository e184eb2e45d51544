#!/usr/bin/env bash
# Token eviction fidelity (issue #19): for each budget and policy, the change in perplexity, the
# mean KL divergence and the top-1 agreement against the same model with its whole context (f32
# KV), each chunk scored from a cache evicted as generation evicts it (`perplexity --kv-budget`:
# the first half prefilled and evicted, the second half decoded token by token, evicting as it
# goes). kv kept is the mean share of a scored token's context still cached.
# llama.cpp has no token eviction; its context shift (llama-cli/llama-server when the context is
# full: keep --keep tokens, drop half of the rest) is the streaming policy with a sink of --keep
# and a budget that halves, and llama-perplexity never shifts, so it has no column here.
#   usage: bench/evict_fidelity.sh [-c CTX] [-f TEXT] [-b "12.5% 25% 50%"] MODEL.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
CTX=256
TEXT=bench/data/stories-sample.txt
BUDGETS="12.5% 25% 50%"
POLICIES=${POLICIES:-"streaming h2o snapkv keydiff tri"}
BIN=${KVSERVE_BIN:-build/kvserve}
while getopts "c:f:b:" o; do
  case $o in c) CTX=$OPTARG ;; f) TEXT=$OPTARG ;; b) BUDGETS=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
for m in "$@"; do
  echo "### $(basename "$m" .gguf) (-c $CTX, $(basename "$TEXT"), f32 KV, --kv-sink 4 --kv-window 32)"
  echo
  echo "| budget | policy | kv kept | ΔPPL | KL | top-1 |"
  echo "|---|---|---|---|---|---|"
  for b in $BUDGETS; do
    for p in $POLICIES; do
      "$BIN" perplexity -m "$m" -f "$TEXT" -c "$CTX" --kv-budget "$b" --evict-policy "$p" \
        --kl-base --json 2>/dev/null |
        python3 -c "
import json, sys
j = json.load(sys.stdin)
print('| %s | %s | %.1f%% | %+.2f%% ± %.2f | %.4f ± %.4f | %.1f%% |' % ('$b', '$p', j['kv_kept_pct'],
      j['delta_ppl_pct'], j['delta_ppl_stderr_pct'], j['kl_mean'], j['kl_stderr'], j['top1_agree_pct']))"
    done
  done
  echo
done
