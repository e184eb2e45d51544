#!/usr/bin/env bash
# Regenerates the evidence (issue #24): runs the side-by-side suites against llama.cpp, keeps
# every raw JSON result under docs/report/data/DATE/, and renders docs/report/README.md with its
# plots (bench/report_render.py, python3-matplotlib). A progress line per stage, with the time
# estimated up front. --quick: one model per suite, short runs (about 15 minutes here).
#   usage: bench/report.sh [--quick]
#   needs: build/kvserve (scripts/build.sh), the peer (../shared/peer/build-llama-cpp.sh) and
#          its bench models (../shared/peer/make-bench-models.sh) in ~/.cache/kvserve-models.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() {
  cat <<EOF
usage: bench/report.sh [--quick]
Runs kvserve beside llama.cpp (speed, serving, prefix cache, KV fidelity, cold-tier codecs),
keeps the raw JSON under docs/report/data/DATE/ and renders docs/report/README.md with plots.
  --quick     one model per suite, short runs (about 15 minutes on a 2-core Zen 5 VM; the full
              run adds llama-1b-f16, qwen2/qwen3 models and concurrency 64; not yet timed)
  -h, --help  this text
Needs: the peer built by ../shared/peer/build-llama-cpp.sh (KVS_PEER_DIR, default
~/.cache/kvserve-peer); bench models in KVS_BENCH_MODELS (default ~/.cache/kvserve-models, made
when missing); ../shared/models (KVSERVE_TEST_MODELS). Installs python3-matplotlib if missing.
Time it on a quiet machine: nothing else running.
EOF
}
QUICK=0
[ $# -le 1 ] || { usage >&2; exit 2; }
case "${1:-}" in
  --quick) QUICK=1 ;;
  -h | --help) usage; exit 0 ;;
  "") ;;
  *) echo "bench/report.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
esac
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
BM=${KVS_BENCH_MODELS:-$HOME/.cache/kvserve-models}
SHARED=${KVSERVE_TEST_MODELS:-../shared/models}
# A fresh clone: kvserve is built first (a no-op when it is up to date; not in the estimate).
scripts/build.sh release kvserve >/dev/null
[ -x "$PEER/llama-bench" ] || { echo "build the peer first: ../shared/peer/build-llama-cpp.sh" >&2; exit 1; }
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || {
  echo "installing python3-matplotlib" >&2
  apt-get install -y -qq python3-matplotlib >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq python3-matplotlib >/dev/null; }
}
SPEED_MODELS=("$BM/llama-1b-q4_0.gguf" "$BM/llama-1b-q8_0.gguf")
SERVE_MODEL="$BM/llama-1b-q4_0.gguf"
FIDELITY_MODEL="$SHARED/stories-hd64-3M.gguf"
CONC=1,4,16 NP=16 PROMPT=128 GEN=64 PREFIX=1000 CONVERSATIONS=4 TURNS=4
if [ $QUICK = 0 ]; then
  SPEED_MODELS+=("$BM/llama-1b-f16.gguf" "$BM/qwen2-0.5b-q8_0.gguf" "$BM/qwen3-0.6b-q8_0.gguf")
  CONC=1,4,16,64 GEN=128 PREFIX=2000 CONVERSATIONS=8 TURNS=6
fi
for m in "${SPEED_MODELS[@]}" "$SERVE_MODEL"; do  # the peer's random-weight bench models
  if [ ! -f "$m" ]; then
    preset=$(basename "$m" .gguf); preset=${preset%-*}
    echo "making the bench model $preset (../shared/peer/make-bench-models.sh)" >&2
    bash ../shared/peer/make-bench-models.sh "$BM" "$preset" >/dev/null
  fi
done
[ -f "$FIDELITY_MODEL" ] || { echo "missing $FIDELITY_MODEL (set KVSERVE_TEST_MODELS)" >&2; exit 1; }
DATE=$(date -u +%Y-%m-%d)
DATA=docs/report/data/$DATE
rm -rf "$DATA" && mkdir -p "$DATA"
# Minutes per stage on the 2-core VM (quick / full).
STAGES=(speed serve prefix fidelity codec render)
if [ $QUICK = 1 ]; then EST=(2 4 5 1 1 1); else EST=(5 12 10 2 2 1); fi
total=0; for e in "${EST[@]}"; do total=$((total + e)); done
echo "bench/report.sh: ${#STAGES[@]} stages, about $total minutes; data in $DATA" >&2
T0=$(date +%s)
stage() {  # $1 index
  echo "[$(($1 + 1))/${#STAGES[@]}] ${STAGES[$1]} (about ${EST[$1]} min; $(( ($(date +%s) - T0) / 60 )) min so far)" >&2
}
{
  echo "date: $(date -u +'%Y-%m-%d %H:%M UTC')"
  echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, $(grep -o 'avx512[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "kvserve: $(git rev-parse --short HEAD)"
  echo "peer: llama.cpp $("$PEER/llama-cli" --version 2>&1 | head -1 | sed 's/version: //')"
  echo "quick: $QUICK"
} >"$DATA/run.txt"

stage 0
KEEP_DATA="$DATA/speed" bash bench/speed_compare.sh -r 2 "${SPEED_MODELS[@]}" >"$DATA/speed.md"
echo "bench/speed_compare.sh -r 2 ${SPEED_MODELS[*]}" >"$DATA/speed/command.txt"

stage 1
KEEP_DATA="$DATA/serve" bash bench/serve_compare.sh "$SERVE_MODEL" "$CONC" "$NP" "$PROMPT" "$GEN" >"$DATA/serve.md"
echo "bench/serve_compare.sh $SERVE_MODEL $CONC $NP $PROMPT $GEN" >"$DATA/serve/command.txt"

stage 2
KEEP_DATA="$DATA/prefix" CONVERSATIONS=$CONVERSATIONS TURNS=$TURNS \
  bash bench/prefix_compare.sh "$SERVE_MODEL" "$PREFIX" >"$DATA/prefix.md"
echo "CONVERSATIONS=$CONVERSATIONS TURNS=$TURNS bench/prefix_compare.sh $SERVE_MODEL $PREFIX" >"$DATA/prefix/command.txt"

stage 3
# KV fidelity: each KV type against an f32 cache on the same text (kvserve perplexity --kl-base;
# llama-perplexity --kl-divergence for the types it has, flash attention on).
mkdir -p "$DATA/fidelity"
TEXT=bench/data/stories-sample.txt
for t in f16 bf16 q8_0 int8 fp8 q4_0 turbo4 turbo3; do
  build/kvserve perplexity -m "$FIDELITY_MODEL" -f "$TEXT" -c 256 -t 2 -ctk "$t" -ctv "$t" --kl-base --json \
    2>/dev/null >"$DATA/fidelity/kvserve-$t.json"
done
"$PEER/llama-perplexity" -m "$FIDELITY_MODEL" -f "$TEXT" -c 256 -t 2 -fa on -ctk f32 -ctv f32 \
  --kl-divergence-base "$DATA/fidelity/base.kld" >"$DATA/fidelity/peer-base.log" 2>&1
for t in f16 q8_0 q4_0; do
  "$PEER/llama-perplexity" -m "$FIDELITY_MODEL" -c 256 -t 2 -fa on -ctk "$t" -ctv "$t" \
    --kl-divergence-base "$DATA/fidelity/base.kld" --kl-divergence >"$DATA/fidelity/peer-$t.log" 2>&1 || true
done
rm -f "$DATA/fidelity/base.kld"
echo "kvserve perplexity -m $FIDELITY_MODEL -f $TEXT -c 256 -t 2 -ctk T -ctv T --kl-base --json; llama-perplexity ... -fa on -ctk T -ctv T --kl-divergence" >"$DATA/fidelity/command.txt"

stage 4
mkdir -p "$DATA/codec"
build/kvserve kv codec-bench -m "$FIDELITY_MODEL" -f "$TEXT" -c 256 -t 2 \
  --kv-calibration bench/data/tc_calibration.txt --kv-calibration-tokens 4096 --json \
  2>/dev/null >"$DATA/codec/stories-hd64-3M.json"
echo "kvserve kv codec-bench -m $FIDELITY_MODEL -f $TEXT -c 256 -t 2 --kv-calibration bench/data/tc_calibration.txt --kv-calibration-tokens 4096 --json" >"$DATA/codec/command.txt"

stage 5
/usr/bin/python3 bench/report_render.py "$DATA" docs/report
echo "bench/report.sh: done in $(( ($(date +%s) - T0) / 60 )) min: docs/report/README.md" >&2
