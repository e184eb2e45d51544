#!/usr/bin/env bash
# Decode speed by KV cache type at several context depths: kvserve bench speed next to
# llama-bench (flash attention on, which quantized V needs there) for the types both have.
# llama-bench runs in both load modes, -lm mmap (its default) and -lm none (weights read into
# memory; kvserve reads them into huge pages), and each round keeps its better figure.
# This machine's speed drifts by 20% over minutes, so the measurements are interleaved: each
# round measures every type on both engines, and the table gives the median over the rounds
# (with the lowest and highest in brackets).
#   usage: bench/kv_speed.sh [-d "0 1024 4096"] [-n TOKENS] [-r ROUNDS] [-t THREADS] MODEL.gguf
#   env:   KV_TYPES ("f16 bf16 ..."), PEER_FA ("on"; "on,off": both, the better kept)
set -euo pipefail
cd "$(dirname "$0")/.."
DEPTHS="0 1024 4096"
NGEN=32
ROUNDS=3
THREADS=2
while getopts "d:n:r:t:" o; do
  case $o in d) DEPTHS=$OPTARG ;; n) NGEN=$OPTARG ;; r) ROUNDS=$OPTARG ;; t) THREADS=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
MODEL=$1
BIN=${KVSERVE_BIN:-build/kvserve}
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
TYPES=${KV_TYPES:-"f16 bf16 q8_0 int8 fp8 q4_0 turbo4 turbo3"}
PEER_FA=${PEER_FA:-on}  # llama-bench -fa settings, each run, the best kept: "on,off" for both
PEER_TYPES=" f16 bf16 q8_0 q4_0 "
RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT

for round in $(seq "$ROUNDS"); do
  echo "round $round/$ROUNDS" >&2
  for t in $TYPES; do
    for d in $DEPTHS; do
      "$BIN" bench speed -m "$MODEL" -t "$THREADS" -p 0 -n "$NGEN" -r 1 -d "$d" \
        -ctk "$t" -ctv "$t" --json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin); print("kvserve", sys.argv[1], sys.argv[2], j["tg_tps"])' \
          "$t" "$d" >>"$RESULTS" || echo "kvserve $t $d error" >&2
    done
    if [[ $PEER_TYPES == *" $t "* ]] && [ -x "$PEER/llama-bench" ]; then
      # One call per flash-attention setting: -fa off refuses quantized V, and a refused
      # combination must not lose the other's figures.
      for fa in ${PEER_FA//,/ }; do
        "$PEER/llama-bench" -m "$MODEL" -t "$THREADS" -fa "$fa" -lm mmap,none -ctk "$t" -ctv "$t" -p 0 \
          -n "$NGEN" -r 1 -d "$(echo $DEPTHS | tr ' ' ',')" -o json 2>/dev/null || true
      done | python3 -c '
import json, sys
best = {}  # depth: t/s of the better load mode
text = sys.stdin.read()
rows, dec, i = [], json.JSONDecoder(), 0
while (i := text.find("[", i)) >= 0:  # one JSON array per call; a refused call prints other text
    try:
        part, i = dec.raw_decode(text, i)
        rows += [r for r in part if isinstance(r, dict)] if isinstance(part, list) else []
    except json.JSONDecodeError:
        i += 1
for r in rows:
    if r["n_gen"] > 0:
        d = r.get("n_depth", 0)
        best[d] = max(best.get(d, 0), r["avg_ts"])
for d, v in best.items():
    print("llama.cpp", sys.argv[1], d, v)' "$t" >>"$RESULTS" ||
        echo "llama.cpp $t error" >&2
    fi
  done
done

PEER_FA=$PEER_FA python3 - "$RESULTS" "$MODEL" "$THREADS" "$ROUNDS" "$NGEN" "$DEPTHS" "$TYPES" <<'EOF'
import os, statistics, sys
path, model, threads, rounds, ngen, depths, types = sys.argv[1:]
runs = {}
for line in open(path):
    engine, t, d, v = line.split()
    runs.setdefault((engine, t, int(d)), []).append(float(v))
def cell(engine, t, d):
    v = runs.get((engine, t, d))
    if not v:
        return "n/a"
    return "%.2f (%.2f–%.2f)" % (statistics.median(v), min(v), max(v))
depths = [int(d) for d in depths.split()]
print("%s, %s threads, tg%s, median of %s interleaved rounds (min–max), tokens/s; llama.cpp: "
      "llama-bench -fa %s, the best of those and of -lm mmap and -lm none in each round" %
      (os.path.basename(model)[:-5], threads, ngen, rounds, os.environ.get("PEER_FA", "on")))
print()
print("| K/V |" + "".join(" kvserve @ d%d | llama.cpp @ d%d |" % (d, d) for d in depths))
print("|---|" + "---|---|" * len(depths))
for t in types.split():
    print("| %s/%s |" % (t, t) + "".join(" %s | %s |" % (cell("kvserve", t, d), cell("llama.cpp", t, d))
                                      for d in depths))
EOF
