#!/usr/bin/env bash
# Random-weight GGUFs of the shapes kvserve adds (bench/make_gguf.py: gemma3-1b, gemma3-4b),
# quantized by the peer's llama-quantize, as the shared make-bench-models.sh does for the dense
# families. Writes $KVS_BENCH_MODELS/PRESET-<type>.gguf (default ~/.cache/kvserve-models) for
# q8_0, q4_0 and q4_k_m; the F16 intermediate is deleted unless --keep-f16.
# The vocabulary is the peer's ggml-vocab-llama-spm.gguf (SentencePiece, 32,000 tokens): Gemma's
# own 262K vocabulary is not available offline, and llama.cpp loads a gemma3 file with it.
# Needs the peer built (../shared/peer/build-llama-cpp.sh) and python3-numpy (installed if absent).
#   usage: bench/make-models.sh [--keep-f16] PRESET...
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}
OUT=${KVS_BENCH_MODELS:-$HOME/.cache/kvserve-models}
KEEP_F16=0
PRESETS=()
for arg in "$@"; do
  case $arg in
    --keep-f16) KEEP_F16=1 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    gemma3-1b|gemma3-4b) PRESETS+=("$arg") ;;
    *) echo "make-models.sh: unknown preset '$arg' (gemma3-1b, gemma3-4b)" >&2; exit 2 ;;
  esac
done
[ ${#PRESETS[@]} -gt 0 ] || { echo "usage: $0 [--keep-f16] PRESET... (gemma3-1b, gemma3-4b)" >&2; exit 2; }
[ -x "$PEER/bin/llama-quantize" ] || { echo "make-models.sh: build the peer first (../shared/peer/build-llama-cpp.sh)" >&2; exit 1; }
VOCAB="$PEER/llama.cpp/models/ggml-vocab-llama-spm.gguf"
[ -f "$VOCAB" ] || { echo "make-models.sh: $VOCAB is missing" >&2; exit 1; }
/usr/bin/python3 -c "import numpy, yaml" 2>/dev/null ||
  { apt-get update -qq && apt-get install -y -qq python3-numpy python3-yaml >/dev/null; }
mkdir -p "$OUT"
for p in "${PRESETS[@]}"; do
  f16="$OUT/$p-f16.gguf"
  todo=0
  for q in q8_0 q4_0 q4_k_m; do [ -f "$OUT/$p-$q.gguf" ] || todo=1; done
  if [ $todo = 1 ] || [ $KEEP_F16 = 1 ]; then
    [ -f "$f16" ] || { echo "writing $f16" >&2
      PYTHONPATH="$PEER/llama.cpp/gguf-py" /usr/bin/python3 "$HERE/make_gguf.py" "$p" "$f16.tmp" --vocab-from "$VOCAB"
      mv "$f16.tmp" "$f16"; }
  fi
  for q in Q8_0 Q4_0 Q4_K_M; do
    dst="$OUT/$p-$(echo $q | tr A-Z a-z).gguf"
    [ -f "$dst" ] && continue
    echo "quantizing $dst" >&2
    "$PEER/bin/llama-quantize" "$f16" "$dst.tmp" $q 2 >/dev/null 2>&1 ||
      { echo "make-models.sh: quantizing $p to $q failed" >&2; rm -f "$dst.tmp"; exit 1; }
    mv "$dst.tmp" "$dst"
  done
  [ $KEEP_F16 = 1 ] || rm -f "$f16"
done
ls -la "$OUT" | grep -E "$(IFS='|'; echo "${PRESETS[*]}")"
