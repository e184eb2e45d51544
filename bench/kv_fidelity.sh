#!/usr/bin/env bash
# KV cache fidelity: for each K/V type pair, bits per element, change in perplexity, mean KL
# divergence and top-1 agreement against an f32 KV cache on the same text, for kvserve and,
# where it has the pair, llama.cpp (each engine against its own f32 cache; llama-perplexity's
# --kl-divergence-base / --kl-divergence, flash attention on, which quantized V needs there).
# Prints one markdown table per model; kvserve's figures with their standard errors (±).
# Use F16 (or F32) weight files: a quantized weight file rounds the activations to 8-bit codes
# before its integer dot products, and that staircase, not the KV type, then sets the KL floor.
#   usage: bench/kv_fidelity.sh [-c CTX] [-f TEXT] [-t THREADS] MODEL.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
CTX=512
TEXT=bench/data/stories-sample.txt
THREADS=2
BIN=${KVSERVE_BIN:-build/kvserve}
while getopts "c:f:t:" o; do
  case $o in c) CTX=$OPTARG ;; f) TEXT=$OPTARG ;; t) THREADS=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
# All same-type pairs, then q8_0 keys with each low-bit value type.
PAIRS="f16/f16 bf16/bf16 q8_0/q8_0 int8/int8 fp8/fp8 q4_0/q4_0 turbo4/turbo4 turbo3/turbo3
       q8_0/q4_0 q8_0/turbo4 q8_0/turbo3"
PEER_TYPES=" f16 bf16 q8_0 q4_0 "  # llama.cpp's KV types among ours
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

peer_field() {  # peer_field LOG PATTERN: the first number after PATTERN
  sed -n "s/^$2 *: *\([-0-9.e+]*\).*/\1/p" "$1" | head -1
}

for m in "$@"; do
  echo "### $(basename "$m" .gguf) (-c $CTX, $(basename "$TEXT"))"
  echo
  echo "| K/V | bits K/V | kvserve ΔPPL | kvserve KL | kvserve top-1 | llama.cpp ΔPPL | llama.cpp KL | llama.cpp top-1 |"
  echo "|---|---|---|---|---|---|---|---|"
  peer_ok=0
  if [ -x "$PEER/llama-perplexity" ] &&
    "$PEER/llama-perplexity" -m "$m" -f "$TEXT" -c "$CTX" -t "$THREADS" -fa on -ctk f32 -ctv f32 \
      --kl-divergence-base "$TMP/base.kld" >"$TMP/peer-base.log" 2>&1; then
    peer_ok=1
  fi
  for pair in $PAIRS; do
    k=${pair%/*} v=${pair#*/}
    ours=$("$BIN" perplexity -m "$m" -f "$TEXT" -c "$CTX" -t "$THREADS" -ctk "$k" -ctv "$v" \
      --kl-base --json 2>/dev/null | python3 -c '
import json, sys
j = json.load(sys.stdin)
print("%.2f/%.2f | %+.3f%% ± %.3f | %.2e ± %.1e | %.1f%%" % (j["bits_k"], j["bits_v"],
      j["delta_ppl_pct"], j["delta_ppl_stderr_pct"], j["kl_mean"], j["kl_stderr"],
      j["top1_agree_pct"]))' || echo "error | | |")
    peer="n/a | n/a | n/a"
    if [ $peer_ok = 1 ] && [[ $PEER_TYPES == *" $k "* ]] && [[ $PEER_TYPES == *" $v "* ]]; then
      if "$PEER/llama-perplexity" -m "$m" -c "$CTX" -t "$THREADS" -fa on -ctk "$k" -ctv "$v" \
        --kl-divergence-base "$TMP/base.kld" --kl-divergence >"$TMP/peer.log" 2>&1; then
        peer=$(python3 -c "
q, b, kl, top = '$(peer_field "$TMP/peer.log" 'Mean PPL(Q)')', '$(peer_field "$TMP/peer.log" 'Mean PPL(base)')', '$(peer_field "$TMP/peer.log" 'Mean    KLD')', '$(peer_field "$TMP/peer.log" 'Same top p')'
# llama-perplexity prints no KL summary when every chunk's divergence is exactly 0.
print('%+.3f%% | %s | %s' % (100 * (float(q) / float(b) - 1), '%.2e' % float(kl) if kl else '0 (no summary)',
      '%.1f%%' % float(top) if top else '100% (no summary)'))" 2>/dev/null ||
          echo "error | |")
      else
        peer="refused: $( (grep -m1 -E ' E ' "$TMP/peer.log" || tail -1 "$TMP/peer.log") |
          sed 's/^[0-9. ]*E *[a-z_]*: *//' | cut -c1-70) | |"
      fi
    fi
    echo "| $k/$v | $ours | $peer |"
  done
  if [ $peer_ok = 0 ]; then
    echo
    echo "llama.cpp f32 base run failed: $(grep -m1 -iE 'error|fail' "$TMP/peer-base.log" | cut -c1-100)"
  fi
  echo
done
