#!/usr/bin/env bash
# Prefill and decode speed of kvserve next to llama-bench on the same GGUF, 2 threads.
# Prints a markdown table: pp512 and tg128 for both, the ratios, and decode's share of the
# bandwidth roofline (weight bytes per token x tokens/s / measured read bandwidth).
#
# Both engines get their best footing: llama-bench runs with flash attention on (-fa on) and in
# both of its load modes, -lm mmap (its default: the file mapped, page-cache pages) and -lm none
# (the weights read into memory); the main table quotes the better of the two per test, with
# the mode that won, and a second table gives both. kvserve reads the weights into transparent
# huge pages, so the roofline is the read bandwidth of huge-page memory
# (`kvserve bench bandwidth --pages huge`); the 4 KiB-page figure is printed for reference.
# kvserve runs at the instruction-set level KVSERVE_ISA names (default: the CPU's best); -b
# bin-avx2 takes the peer built without AVX-512 (build-llama-cpp.sh --isa avx2) to compare with
# KVSERVE_ISA=avx2.
# -d DEPTH runs both tests after DEPTH tokens of context (llama-bench -d, kvserve bench speed -d).
#   usage: bench/speed_compare.sh [-r REPS] [-t THREADS] [-p PROMPT] [-n GEN] [-d DEPTH]
#          [-b PEER_BIN_DIR] MODEL.gguf...
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=3
THREADS=2
PP=512
TG=128
DEPTH=0
BIN=bin
while getopts "r:t:p:n:d:b:" o; do
  case $o in r) REPS=$OPTARG ;; t) THREADS=$OPTARG ;; p) PP=$OPTARG ;; n) TG=$OPTARG ;; d) DEPTH=$OPTARG ;;
    b) BIN=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[[ $# -ge 1 ]] || { echo "usage: $0 [-r REPS] [-t THREADS] [-p PROMPT] [-n GEN] [-d DEPTH] [-b PEER_BIN_DIR] MODEL.gguf..." >&2; exit 2; }
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/$BIN
[ -x "$PEER/llama-bench" ] || { echo "no $PEER/llama-bench (../shared/peer/build-llama-cpp.sh)" >&2; exit 1; }
ISA=$(build/kvserve --version | sed -n 's/.*kernels: \([a-z0-9]*\).*/\1/p')
TMP=$(mktemp -d)
# KEEP_DATA=DIR (bench/report.sh): the raw JSON results are copied there before the temp dir goes.
trap '[ -n "${KEEP_DATA:-}" ] && mkdir -p "$KEEP_DATA" && cp "$TMP"/*.json* "$KEEP_DATA"/; rm -rf "$TMP"' EXIT
for pages in huge small; do
  build/kvserve bench bandwidth -t "$THREADS" --pages $pages --json >"$TMP/bw_$pages.json"
done
for m in "$@"; do
  build/kvserve bench speed -m "$m" -p "$PP" -n "$TG" -d "$DEPTH" -t "$THREADS" -r "$REPS" --json 2>/dev/null >>"$TMP/ours.jsonl"
  # One llama-bench run, both load modes (it reloads the model for each).
  "$PEER/llama-bench" -m "$m" -t "$THREADS" -p "$PP" -n "$TG" -d "$DEPTH" -r "$REPS" -fa on -lm mmap,none -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >>"$TMP/peer.jsonl"
done
DEPTH=$DEPTH python3 - "$TMP" "$PP" "$TG" "$ISA" "$BIN" "$@" <<'PY'
import json, os, sys
tmp, pp_n, tg_n, isa, peer_bin, models = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:]
bw = {p: json.load(open(os.path.join(tmp, "bw_%s.json" % p))) for p in ("huge", "small")}
ours = [json.loads(l) for l in open(os.path.join(tmp, "ours.jsonl"))]
peers = [json.loads(l) for l in open(os.path.join(tmp, "peer.jsonl"))]
share = lambda b: "unknown" if b.get("huge_page_pct") is None else "%.0f%% in huge pages" % b["huge_page_pct"]
h, s = bw["huge"]["read_gbps"], bw["small"]["read_gbps"]
print("read bandwidth with %d threads (kvserve bench bandwidth, THP policy %s): huge pages %.1f GB/s "
      "(%s; the roofline below), 4 KiB pages %.1f GB/s (for reference)"
      % (bw["huge"]["threads"], bw["huge"]["thp_policy"], h, share(bw["huge"]), s))
if bw["huge"].get("huge_page_pct") is not None and bw["huge"]["huge_page_pct"] < 90:
    print("warning: the kernel gave few huge pages; the 'huge' figure is not a huge-page one")
print()
print("kvserve kernels at the %s level; llama.cpp: %s/llama-bench -fa on, the better of -lm mmap and -lm none "
      "per test (the mode that won in brackets); depth %s" % (isa, peer_bin, os.environ.get("DEPTH", "0")))
print()
print("| model | kvserve pp%s | llama.cpp pp%s | ratio | kvserve tg%s | llama.cpp tg%s | ratio | GB/token "
      "| kvserve roofline | llama.cpp roofline |" % (pp_n, pp_n, tg_n, tg_n))
print("|---|---|---|---|---|---|---|---|---|---|")
f = lambda m, s: "%.1f ± %.1f" % (m, s)
modes = []
for path, o, peer in zip(models, ours, peers):
    name = os.path.basename(path)[:-5]
    test = lambda r: "pp" if r["n_prompt"] > 0 and r["n_gen"] == 0 else "tg" if r["n_gen"] > 0 and r["n_prompt"] == 0 else None
    by = {(test(r), r["load_mode"]): r for r in peer if test(r)}
    best = {t: max((r for (tt, _), r in by.items() if tt == t), key=lambda r: r["avg_ts"]) for t in ("pp", "tg")}
    modes.append((name, by))
    pp, tg = best["pp"], best["tg"]
    gb = o["weight_bytes_per_token"] / 1e9
    print("| %s | %s | %s (%s) | %.2f | %s | %s (%s) | %.2f | %.3f | %.0f%% | %.0f%% |" % (
        name, f(o["pp_tps"], o["pp_tps_stddev"]), f(pp["avg_ts"], pp["stddev_ts"]), pp["load_mode"],
        o["pp_tps"] / pp["avg_ts"], f(o["tg_tps"], o["tg_tps_stddev"]), f(tg["avg_ts"], tg["stddev_ts"]),
        tg["load_mode"], o["tg_tps"] / tg["avg_ts"], gb, 100 * o["tg_tps"] * gb / h, 100 * tg["avg_ts"] * gb / h))
print()
print("llama.cpp by load mode (llama-bench -fa on)")
print()
print("| model | pp%s -lm mmap | pp%s -lm none | tg%s -lm mmap | tg%s -lm none |" % (pp_n, pp_n, tg_n, tg_n))
print("|---|---|---|---|---|")
for name, by in modes:
    cell = lambda t, lm: f(by[(t, lm)]["avg_ts"], by[(t, lm)]["stddev_ts"]) if (t, lm) in by else "n/a"
    print("| %s | %s | %s | %s | %s |" % (name, cell("pp", "mmap"), cell("pp", "none"), cell("tg", "mmap"), cell("tg", "none")))
PY
