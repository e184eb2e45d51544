#!/usr/bin/env bash
# The cold tiers' block codecs (issue #23): for each model, `kvserve kv codec-bench` (every
# codec's ratio vs f16, encode/decode MB/s, and the perplexity change when the first half of
# each chunk's KV goes through the codec and the second half is scored on it), and, as the
# peer's reference from the same run, llama.cpp's own KV quantization (q8_0, q4_0 pool types,
# its whole cache quantized; llama.cpp stores and ships KV, --slot-save-path, as the pool's
# bytes: no codec of its own) against its f32 cache on the same text and context.
# Prints a markdown table per model; the raw JSON goes to OUT (default /tmp/kv_codec).
#   usage: bench/kv_codec.sh [-c CTX] [-f TEXT] [-k CALIBRATION] [-t THREADS] [-x CHUNKS] MODEL...
set -euo pipefail
cd "$(dirname "$0")/.."
CTX=256
TEXT=bench/data/stories-sample.txt
CAL=bench/data/tc_calibration.txt
THREADS=2
CHUNKS=-1
OUT=${OUT:-/tmp/kv_codec}
BIN=${KVSERVE_BIN:-build/kvserve}
CODECS=${CODECS:-raw,zstd-q8_0,zstd-q4_0,zstd-turbo4,zstd-turbo3,tc:4,tc:3,tc:2,tc:1.5,tc:1,tc:1,sink=4,tc:0.75,tc:0.5}
while getopts "c:f:k:t:x:" o; do
  case $o in
    c) CTX=$OPTARG ;; f) TEXT=$OPTARG ;; k) CAL=$OPTARG ;; t) THREADS=$OPTARG ;;
    x) CHUNKS=$OPTARG ;; *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
mkdir -p "$OUT"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

peer_field() {  # peer_field LOG PATTERN: the first number after PATTERN
  sed -n "s/^$2 *: *\([-0-9.e+]*\).*/\1/p" "$1" | head -1
}

for m in "$@"; do
  name=$(basename "$m" .gguf)
  json="$OUT/$name-c$CTX.json"
  echo "### $name (-c $CTX, $(basename "$TEXT"), basis fitted on $(basename "$CAL"))"
  echo
  "$BIN" kv codec-bench -m "$m" -f "$TEXT" -c "$CTX" -t "$THREADS" --chunks "$CHUNKS" \
    --kv-calibration "$CAL" --kv-calibration-tokens 4096 --codecs "$CODECS" --json >"$json"
  python3 - "$json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
print("%d chunks of %d, %d threads; calibration %d tokens" % (j["n_chunks"], j["n_ctx"], j["threads"], j["calibration_tokens"]))
print()
print("| codec | bits/el | ratio vs f16 | encode MB/s | decode MB/s | ΔPPL | KL | top-1 |")
print("|---|---|---|---|---|---|---|---|")
for c in j["codecs"]:
    print("| %s | %.2f | %.2f× | %.0f | %.0f | %+.3f%% ± %.3f | %.2e | %.1f%% |" % (
        c["name"], c["bits_per_element"], c["ratio_vs_f16"], c["encode_mb_s"], c["decode_mb_s"],
        c["delta_ppl_pct"], c["delta_ppl_stderr_pct"], c["kl_mean"], c["top1_agree_pct"]))
EOF
  echo
  if [ -x "$PEER/llama-perplexity" ]; then
    chunk_args=()
    [ "$CHUNKS" -gt 0 ] && chunk_args=(--chunks "$CHUNKS")
    if "$PEER/llama-perplexity" -m "$m" -f "$TEXT" -c "$CTX" -t "$THREADS" -fa on -ctk f32 \
      -ctv f32 "${chunk_args[@]}" --kl-divergence-base "$TMP/base.kld" >"$TMP/base.log" 2>&1; then
      echo "llama.cpp $("$PEER/llama-cli" --version 2>&1 | head -1 | sed "s/version: //") KV types against its f32 cache (whole cache quantized):"
      echo
      echo "| llama.cpp -ctk/-ctv | ΔPPL | KL | top-1 |"
      echo "|---|---|---|---|"
      for t in q8_0 q4_0; do
        if "$PEER/llama-perplexity" -m "$m" -c "$CTX" -t "$THREADS" -fa on -ctk "$t" -ctv "$t" \
          "${chunk_args[@]}" --kl-divergence-base "$TMP/base.kld" --kl-divergence >"$TMP/p.log" 2>&1; then
          python3 -c "
q, b, kl, top = '$(peer_field "$TMP/p.log" 'Mean PPL(Q)')', '$(peer_field "$TMP/p.log" 'Mean PPL(base)')', '$(peer_field "$TMP/p.log" 'Mean    KLD')', '$(peer_field "$TMP/p.log" 'Same top p')'
print('| $t | %+.3f%% | %s | %s |' % (100 * (float(q) / float(b) - 1), '%.2e' % float(kl) if kl else '0',
      '%.1f%%' % float(top) if top else '100%'))"
        else
          echo "| $t | refused: $(tail -1 "$TMP/p.log" | cut -c1-60) | | |"
        fi
      done
    else
      echo "llama.cpp f32 base run failed: $(tail -1 "$TMP/base.log" | cut -c1-100)"
    fi
    echo
  fi
done
