#!/usr/bin/env bash
# Batched prefill/decode throughput of the peer engine, llama.cpp (llama-batched-bench), for
# side-by-side figures with kvserve. For each NPL (number of parallel sequences) it prefills
# NPL distinct random prompts of NPP tokens in one go, then decodes NTG steps of NPL tokens each.
# Prints one JSON line per NPL:
#   {"engine":"llama.cpp","tool":"llama-batched-bench","npl":N,"pp":NPP,"tg":NTG,
#    "s_pp":..,"s_tg":..,"s_total":..,"t_pp":..,"t_tg":..,"threads":..,"kv_unified":..,
#    "flash_attn":"on","load_mode":..}
# s_pp = NPL*NPP / prefill seconds, s_tg = NPL*NTG / decode seconds (aggregate decode rate over
# all sequences), s_total = all tokens / all seconds; t_pp, t_tg in seconds.
# KV: by default each sequence gets its own KV stream of NPP+NTG cells (llama.cpp's default with
# several sequences; -c NPL_MAX*(NPP+NTG) is split evenly, rounded up to 256 per stream).
# KVU=1 uses one KV buffer shared by all sequences (-kvu) instead. Flash attention is on (-fa on).
# LOAD_MODE is llama.cpp's -lm: mmap (its default; the file mapped, page-cache pages) or none (the
# weights read into memory); bench/throughput_compare.sh runs both and quotes the better.
#   usage: bench/peer_batched.sh MODEL.gguf [NPL_LIST=1,4,16,64] [NPP=128] [NTG=128]
#   env:   THREADS (2), KVU (0|1, default 0), LOAD_MODE (mmap|none, default mmap),
#          KVS_PEER_DIR (~/.cache/kvserve-peer)
set -euo pipefail

usage() { echo "usage: $0 MODEL.gguf [NPL_LIST=1,4,16,64] [NPP=128] [NTG=128]" >&2; exit 2; }
[[ $# -ge 1 && $# -le 4 ]] || usage
MODEL=$1
NPL=${2:-1,4,16,64}
NPP=${3:-128}
NTG=${4:-128}
THREADS=${THREADS:-2}
KVU=${KVU:-0}
LOAD_MODE=${LOAD_MODE:-mmap}
[[ -f $MODEL ]] || { echo "$0: no such model: $MODEL" >&2; exit 2; }
[[ $NPL =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || { echo "$0: NPL_LIST must be like 1,4,16" >&2; usage; }
[[ $NPP =~ ^[1-9][0-9]*$ && $NTG =~ ^[1-9][0-9]*$ ]] || { echo "$0: NPP and NTG must be positive" >&2; usage; }
[[ $THREADS =~ ^[1-9][0-9]*$ ]] || { echo "$0: THREADS must be positive" >&2; exit 2; }
[[ $KVU == 0 || $KVU == 1 ]] || { echo "$0: KVU must be 0 or 1" >&2; exit 2; }
[[ $LOAD_MODE =~ ^(mmap|none|mlock|mmap\+mlock|dio|auto)$ ]] || { echo "$0: LOAD_MODE must be mmap or none" >&2; exit 2; }

PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
BIN=$PEER/llama-batched-bench
[[ -x $BIN ]] || { echo "$0: $BIN not found (set KVS_PEER_DIR)" >&2; exit 1; }
export LD_LIBRARY_PATH=$PEER${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

NPL_MAX=$(tr ',' '\n' <<<"$NPL" | sort -n | tail -1)
CTX=$((NPL_MAX * (NPP + NTG)))
if [[ $KVU == 1 ]]; then KV_FLAG=-kvu; else KV_FLAG=-no-kvu; fi

# ggml's threads spin at barriers: another busy process on the cores slows them many times over
python3 - "$0" <<'PY' || true
import sys, time
def cpu():
    v = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return v[3] + v[4], sum(v)  # idle + iowait, total
i0, t0 = cpu(); time.sleep(0.5); i1, t1 = cpu()
busy = 1 - (i1 - i0) / max(t1 - t0, 1)
if busy > 0.2:
    print("%s: warning: the CPUs were %.0f%% busy before the run; its figures are not comparable"
          % (sys.argv[1], 100 * busy), file=sys.stderr)
PY

TMP=$(mktemp -d)
BENCH_PID=
cleanup() {
  if [[ -n $BENCH_PID ]]; then kill "$BENCH_PID" 2>/dev/null || true; wait "$BENCH_PID" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# the jsonl rows go to stdout, the logs to stderr; in the background so that a signal to this
# script reaches the traps at once (wait is interruptible)
"$BIN" -m "$MODEL" -c "$CTX" -b 2048 -ub 512 -npp "$NPP" -ntg "$NTG" -npl "$NPL" -t "$THREADS" \
  $KV_FLAG -fa on -lm "$LOAD_MODE" --output-format jsonl >"$TMP/out" 2>"$TMP/err" &
BENCH_PID=$!
if ! wait "$BENCH_PID"; then
  BENCH_PID=
  echo "$0: llama-batched-bench failed; last lines of its log:" >&2
  tail -n 30 "$TMP/err" >&2
  exit 1
fi
BENCH_PID=

python3 - "$TMP/out" "$NPL" "$NPP" "$NTG" "$THREADS" "$KVU" "$LOAD_MODE" <<'PY'
import json, re, sys
out, npl_list, npp, ntg, threads, kvu = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "1"
load_mode = sys.argv[7]
rows = []
for line in open(out, errors="replace"):
    line = line.strip()
    if line.startswith("{"):                       # --output-format jsonl
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "speed_tg" in r:
            rows.append(dict(pl=int(r["pl"]), pp=int(r["pp"]), tg=int(r["tg"]), t_pp=r["t_pp"], s_pp=r["speed_pp"],
                             t_tg=r["t_tg"], s_tg=r["speed_tg"], s=r["speed"]))
    elif re.match(r"^\|\s*\d", line):              # markdown table (md output), in case jsonl is gone
        c = [x.strip() for x in line.strip("|").split("|")]
        if len(c) == 10:
            rows.append(dict(pp=int(c[0]), tg=int(c[1]), pl=int(c[2]), t_pp=float(c[4]), s_pp=float(c[5]),
                             t_tg=float(c[6]), s_tg=float(c[7]), s=float(c[9])))
want = [int(x) for x in npl_list.split(",")]
seen = set()
for r in rows:
    if r["pp"] != npp or r["tg"] != ntg:
        continue
    seen.add(r["pl"])
    print(json.dumps({"engine": "llama.cpp", "tool": "llama-batched-bench", "npl": r["pl"], "pp": npp, "tg": ntg,
                      "s_pp": round(r["s_pp"], 2), "s_tg": round(r["s_tg"], 2), "s_total": round(r["s"], 2),
                      "t_pp": round(r["t_pp"], 4), "t_tg": round(r["t_tg"], 4),
                      "threads": threads, "kv_unified": kvu, "flash_attn": "on", "load_mode": load_mode}))
missing = [n for n in want if n not in seen]
if missing:
    # llama-batched-bench silently skips a row whose npl*(npp+ntg) exceeds its context
    sys.exit("peer_batched.sh: no result for npl %s (skipped or failed)" % ",".join(map(str, missing)))
PY
