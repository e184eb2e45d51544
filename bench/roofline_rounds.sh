#!/usr/bin/env bash
# How close prefill and batched decode come to the compute roofline, in interleaved rounds on one
# binary (the VM drifts ±20% in minutes, so each round measures the peak beside the rates):
# per round `kvserve bench compute` (the int8 peak), `bench speed -p 512 -n 0` on Q4_0 and Q8_0
# (prefill), and `bench throughput` with 64 and 16 sequences on Q4_0; then llama-batched-bench
# (bench/peer_batched.sh) at 16 and 64 sequences in both load modes. Prints one JSON line per
# measurement; BENCHMARKS.md's "Acceptance 2 and 4, same sitting" table is its output.
#   usage: bench/roofline_rounds.sh [-R ROUNDS] [-t THREADS] [-b KVSERVE] MODELS_DIR
#   MODELS_DIR holds llama-1b-q4_0.gguf and llama-1b-q8_0.gguf (../shared/peer/make-bench-models.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
THREADS=2
BIN=build/kvserve
while getopts "R:t:b:" o; do
  case $o in R) ROUNDS=$OPTARG ;; t) THREADS=$OPTARG ;; b) BIN=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[[ $# -eq 1 ]] || { echo "usage: $0 [-R ROUNDS] [-t THREADS] [-b KVSERVE] MODELS_DIR" >&2; exit 2; }
Q4=$1/llama-1b-q4_0.gguf
Q8=$1/llama-1b-q8_0.gguf
for m in "$Q4" "$Q8"; do [[ -f $m ]] || { echo "$0: missing $m" >&2; exit 2; }; done
line() { python3 -c 'import json,sys; print(json.dumps({"round": int(sys.argv[1]), "what": sys.argv[2], "r": json.load(sys.stdin)}))' "$@"; }
for ((r = 1; r <= ROUNDS; r++)); do
  echo "round $r of $ROUNDS" >&2
  "$BIN" bench compute -t "$THREADS" --json 2>/dev/null | line "$r" compute
  for m in "$Q4" "$Q8"; do
    "$BIN" bench speed -m "$m" -p 512 -n 0 -r 2 -t "$THREADS" --json 2>/dev/null | line "$r" "pp512 $(basename "$m" .gguf)"
  done
  for n in 64 16; do
    "$BIN" bench throughput -m "$Q4" --requests "$n" --concurrency "$n" -t "$THREADS" --json 2>/dev/null |
      line "$r" "throughput $n"
  done
done
for mode in mmap none; do
  LOAD_MODE=$mode THREADS=$THREADS bash bench/peer_batched.sh "$Q4" 16,64 128 128
done
