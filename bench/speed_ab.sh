#!/usr/bin/env bash
# Two kvserve builds (A = before a change, B = after) side by side with llama-bench on the same
# GGUFs, 2 threads: pp512 and tg128. A and B run in interleaved rounds (A B, then B A, ...) so
# that this VM's drift (±20% over minutes) falls on both alike; the B/A columns are the median
# of the per-round ratios. llama-bench runs once per model, -fa on, both load modes (-lm
# mmap,none), and the better mode is quoted. Roofline: weight bytes per token x tokens/s over
# the huge-page read bandwidth (kvserve's weights live in huge pages).
#   usage: bench/speed_ab.sh [-R ROUNDS] [-r REPS] [-t THREADS] A_BIN B_BIN MODEL.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
REPS=2
THREADS=2
while getopts "R:r:t:" o; do
  case $o in R) ROUNDS=$OPTARG ;; r) REPS=$OPTARG ;; t) THREADS=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[[ $# -ge 3 ]] || { echo "usage: $0 [-R ROUNDS] [-r REPS] [-t THREADS] A_BIN B_BIN MODEL.gguf..." >&2; exit 2; }
A=$1 B=$2; shift 2
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$B" bench bandwidth -t "$THREADS" --pages huge --json >"$TMP/bw.json"
speed() { "$1" bench speed -m "$2" -p 512 -n 128 -t "$THREADS" -r "$REPS" --json 2>/dev/null; }
for m in "$@"; do
  name=$(basename "$m" .gguf)
  echo "$name: $ROUNDS rounds of A and B, then llama-bench" >&2
  for ((i = 0; i < ROUNDS; i++)); do
    if ((i % 2 == 0)); then order="A B"; else order="B A"; fi
    for w in $order; do
      bin=$A; [ "$w" = B ] && bin=$B
      echo "{\"model\": \"$name\", \"round\": $i, \"which\": \"$w\", \"r\": $(speed "$bin" "$m")}" >>"$TMP/ours.jsonl"
    done
  done
  "$PEER/llama-bench" -m "$m" -t "$THREADS" -p 512 -n 128 -r "$REPS" -fa on -lm mmap,none -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.dumps({"model": sys.argv[1], "rows": json.load(sys.stdin)}))' "$name" >>"$TMP/peer.jsonl"
done
python3 - "$TMP" <<'PY'
import json, os, statistics, sys
tmp = sys.argv[1]
bw = json.load(open(os.path.join(tmp, "bw.json")))["read_gbps"]
ours = [json.loads(l) for l in open(os.path.join(tmp, "ours.jsonl"))]
peers = {p["model"]: p["rows"] for p in map(json.loads, open(os.path.join(tmp, "peer.jsonl")))}
print("huge-page read bandwidth (kvserve bench bandwidth): %.1f GB/s" % bw)
print()
print("| model | A pp512 | B pp512 | B/A | A tg128 | B tg128 | B/A | llama.cpp pp512 | llama.cpp tg128 | B/llama.cpp pp | B/llama.cpp tg | GB/token | B roofline | llama.cpp roofline |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in dict.fromkeys(o["model"] for o in ours):
    runs = [o for o in ours if o["model"] == name]
    rounds = sorted({o["round"] for o in runs})
    get = lambda w, k: [next(o["r"][k] for o in runs if o["round"] == i and o["which"] == w) for i in rounds]
    med = statistics.median
    ratio = lambda k: med([b / a for a, b in zip(get("A", k), get("B", k))])
    test = lambda r: "pp" if r["n_prompt"] > 0 and r["n_gen"] == 0 else "tg" if r["n_gen"] > 0 and r["n_prompt"] == 0 else None
    best = {t: max((r for r in peers[name] if test(r) == t), key=lambda r: r["avg_ts"]) for t in ("pp", "tg")}
    gb = runs[0]["r"]["weight_bytes_per_token"] / 1e9
    b_pp, b_tg = med(get("B", "pp_tps")), med(get("B", "tg_tps"))
    print("| %s | %.1f | %.1f | %.3f | %.1f | %.1f | %.3f | %.1f (%s) | %.1f (%s) | %.2f | %.2f | %.3f | %.0f%% | %.0f%% |" % (
        name, med(get("A", "pp_tps")), b_pp, ratio("pp_tps"), med(get("A", "tg_tps")), b_tg, ratio("tg_tps"),
        best["pp"]["avg_ts"], best["pp"]["load_mode"], best["tg"]["avg_ts"], best["tg"]["load_mode"],
        b_pp / best["pp"]["avg_ts"], b_tg / best["tg"]["avg_ts"], gb, 100 * b_tg * gb / bw, 100 * best["tg"]["avg_ts"] * gb / bw))
PY
