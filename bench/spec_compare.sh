#!/usr/bin/env bash
# Speculative decoding, one sequence, greedy, 2 threads: kvserve (`bench spec`: speculative and
# plain decoding interleaved in one engine) next to llama.cpp's llama-server (bench/peer_spec.sh:
# plain, and its own speculation with the same draft and prompt) on the same GGUFs. Rounds go
# kvserve, llama.cpp, kvserve, ... per configuration; llama.cpp runs with -fa on in both load
# modes (-lm mmap and none; the better is quoted). Prints a markdown table.
#   usage: bench/spec_compare.sh TARGET.gguf DRAFT.gguf [N=128] [KS="2 4 8"]
#   env:   REPS (3), THREADS (2), TYPES ("self draft ngram"), OUT (keep the JSON lines there)
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { echo "usage: $0 TARGET.gguf DRAFT.gguf [N] [KS]" >&2; exit 2; }
TARGET=$1 DRAFT=$2 N=${3:-128} KS=${4:-"2 4 8"}
REPS=${REPS:-3} THREADS=${THREADS:-2} TYPES=${TYPES:-"self draft ngram"}
OUT=${OUT:-$(mktemp)}
STORY=bench/data/spec_story.txt
REPEAT=bench/data/repeat_passage.txt
: >"$OUT"
ours() {  # $1 type, $2 K ("" = adaptive), $3 prompt file, rest: more flags
  local type=$1 k=$2 prompt=$3
  shift 3
  local kflags=(--draft-max 4)
  [[ -n $k ]] && kflags=(--draft-max "$k" --draft-min "$k")
  build/kvserve bench spec -m "$TARGET" --spec-type "$type" "${kflags[@]}" -n "$N" -r "$REPS" \
    -t "$THREADS" --prompt-file "$prompt" --json "$@" 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); d["engine"]="kvserve"; d["k"]=sys.argv[1]; print(json.dumps(d))' "${k:-adaptive}" >>"$OUT"
}
peer() {  # $1 label, $2 prompt file, rest: llama-server flags
  local label=$1 prompt=$2
  shift 2
  for lm in mmap none; do
    LOAD_MODE=$lm REPS=$REPS THREADS=$THREADS bench/peer_spec.sh "$TARGET" "$prompt" "$N" "$@" 2>/dev/null |
      python3 -c 'import json,sys
t = sys.stdin.read().strip()
if not t: sys.exit("llama-server run failed: " + sys.argv[1])
d = json.loads(t); d["label"] = sys.argv[1]; print(json.dumps(d))' "$label" >>"$OUT" || true
  done
}
peer none "$STORY"
peer none-repeat "$REPEAT"
for type in $TYPES; do
  for k in "" $KS; do
    case $type in
      self) ours self "$k" "$STORY" ;;
      draft)
        ours draft "$k" "$STORY" -md "$DRAFT"
        [[ -n $k ]] && peer "draft-simple k=$k" "$STORY" --spec-type draft-simple -md "$DRAFT" \
          --spec-draft-n-max "$k" -td "$THREADS" -tbd "$THREADS"
        ;;
      ngram)
        ours ngram "$k" "$REPEAT"
        [[ -n $k ]] && peer "ngram-simple k=$k" "$REPEAT" --spec-type ngram-simple --spec-draft-n-max "$k" \
          --spec-ngram-simple-size-m "$k"
        ;;
    esac
  done
done
python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
peer = {}
for r in rows:
    if r.get("engine") == "llama.cpp":
        best = peer.get(r["label"])
        if best is None or r["tg_tps"] > best["tg_tps"]:
            peer[r["label"]] = r
print("| drafter | k | kvserve acceptance | mean accepted / verification | kvserve tg t/s | kvserve plain t/s | speedup | llama.cpp spec t/s (acceptance, -lm) | llama.cpp plain t/s | kvserve spec / llama.cpp spec |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if r.get("engine") != "kvserve":
        continue
    t, k = r["spec_type"], r["k"]
    label = {"draft": "draft-simple k=%s" % k, "ngram": "ngram-simple k=%s" % k}.get(t)
    base = peer.get("none-repeat" if t == "ngram" else "none")
    p = peer.get(label) if label else None
    ps = "%.2f (%.2f, %s)" % (p["tg_tps"], p["acceptance_rate"], p["load_mode"]) if p else "—"
    ratio = "%.2fx" % (r["tg_tps"] / p["tg_tps"]) if p else "—"
    print("| %s | %s | %.3f | %.2f | %.2f | %.2f | %.3fx | %s | %.2f (%s) | %s |" % (
        t, k, r["acceptance_rate"], r["mean_accepted_tokens"], r["tg_tps"], r["tg_tps_baseline"],
        r["speedup"], ps, base["tg_tps"] if base else 0, base["load_mode"] if base else "-", ratio))
PY
echo "raw: $OUT" >&2
