#!/usr/bin/env bash
# Two kvserve builds (A = before a change, B = after) on `kvserve bench throughput`: N requests
# at once, PROMPT random prompt tokens and GEN generated tokens each, for each N of NPL_LIST, in
# interleaved rounds (A B, then B A, ...). Prints aggregate decode and total t/s of both and the
# median of the per-round B/A ratios. (bench/throughput_compare.sh puts llama.cpp beside one
# build.)
#   usage: bench/throughput_ab.sh [-R ROUNDS] A_BIN B_BIN MODEL.gguf [NPL_LIST=1,4,16,64] [PROMPT=128] [GEN=128]
#   env:   A_FLAGS, B_FLAGS: more flags for A's or B's runs (one build against itself with and
#          without a feature: B_FLAGS="--spec-type self" bench/throughput_ab.sh build/kvserve
#          build/kvserve MODEL)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=2
while getopts "R:" o; do case $o in R) ROUNDS=$OPTARG ;; *) exit 2 ;; esac; done
shift $((OPTIND - 1))
[[ $# -ge 3 ]] || { echo "usage: $0 [-R ROUNDS] A_BIN B_BIN MODEL.gguf [NPL_LIST] [PROMPT] [GEN]" >&2; exit 2; }
A=$1 B=$2 MODEL=$3 NPL=${4:-1,4,16,64} PROMPT=${5:-128} GEN=${6:-128}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for ((i = 0; i < ROUNDS; i++)); do
  for n in ${NPL//,/ }; do
    if ((i % 2 == 0)); then order="A B"; else order="B A"; fi
    for w in $order; do
      bin=$A flags=${A_FLAGS:-}
      [ "$w" = B ] && bin=$B flags=${B_FLAGS:-}
      echo "round $i: $w, $n sequences" >&2
      r=$("$bin" bench throughput -m "$MODEL" --requests "$n" --concurrency "$n" \
        --prompt-tokens "$PROMPT" --gen-tokens "$GEN" -t 2 --json $flags 2>/dev/null)
      echo "{\"n\": $n, \"round\": $i, \"which\": \"$w\", \"r\": $r}" >>"$TMP/runs.jsonl"
    done
  done
done
python3 - "$TMP" "$(basename "$MODEL" .gguf)" <<'PY'
import json, os, statistics, sys
runs = [json.loads(l) for l in open(os.path.join(sys.argv[1], "runs.jsonl"))]
print("model %s" % sys.argv[2])
print()
print("| sequences | A decode t/s | B decode t/s | B/A | A total t/s | B total t/s | B/A |")
print("|---|---|---|---|---|---|---|")
med = statistics.median
for n in dict.fromkeys(r["n"] for r in runs):
    rs = [r for r in runs if r["n"] == n]
    rounds = sorted({r["round"] for r in rs})
    get = lambda w, k: [next(r["r"][k] for r in rs if r["round"] == i and r["which"] == w) for i in rounds]
    ratio = lambda k: med([b / a for a, b in zip(get("A", k), get("B", k))])
    print("| %d | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f |" % (
        n, med(get("A", "decode_tps")), med(get("B", "decode_tps")), ratio("decode_tps"),
        med(get("A", "total_tps")), med(get("B", "total_tps")), ratio("total_tps")))
PY
