#!/usr/bin/env bash
# The engine thread's CPU per generated token, two builds side by side (issue #41 acceptance 2):
# each build's server (-np 16, 2 threads) under `bench serve` at concurrency 16, sampled by
# `perf record` (task-clock); the engine thread is the one whose stacks run AsyncEngine::Loop.
# Its samples (all, and those outside the forward pass: the work of the loop itself), and the
# whole process's, over the output tokens give microseconds per token.
# A small model (default stories260K) keeps the forward pass's share of that thread small, so
# that the front-end work the thread does per token is what differs.
#   usage: bench/engine_thread_cpu.sh A_BIN B_BIN [MODEL.gguf] [ROUNDS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { echo "usage: $0 A_BIN B_BIN [MODEL.gguf] [ROUNDS]" >&2; exit 2; }
A=$1 B=$2 MODEL=${3:-${KVSERVE_TEST_MODELS:-../shared/models}/stories260K.gguf} ROUNDS=${4:-3}
PROMPT=64 GEN=192 FREQ=4000
. bench/server_lib.sh
for round in $(seq 1 "$ROUNDS"); do
  for tag in A B; do
    bin=$A; [ $tag = B ] && bin=$B
    start_ab_server "$bin" "$MODEL" $((PROMPT + GEN + 16))
    perf record -q -F $FREQ -e task-clock -g -p "$SERVER" -o "$TMP/perf.data" 2>/dev/null &
    PERF=$!
    sleep 0.5  # perf attaches
    build/kvserve bench serve --url "http://127.0.0.1:$PORT" --concurrency 16 --requests 64 \
      --prompt-tokens $PROMPT --gen-tokens $GEN --seed $((3000 + round)) --json \
      >"$TMP/serve.json"
    kill -INT "$PERF"; wait "$PERF" || true
    kill -TERM "$SERVER"; wait "$SERVER" || true; SERVER=
    perf script -i "$TMP/perf.data" -F tid,ip,sym 2>/dev/null | python3 -c '
import collections, json, re, sys
# Release builds keep no frame pointers, so stacks are partial: a sample counts as the forward
# pass when its innermost function is a kernel, the forward pass or the pool (its spin and
# yields), and as the work of the loop itself (scheduling, sampling, events, allocation) otherwise.
FORWARD = re.compile(r"matmul_internal|attention_internal|ops_internal|ThreadPool|ForwardPass|"
                     r"StoreKey|StoreValue|RmsNorm|AddInPlace|MergePartitions|F32ToF16|expf|Rope|"
                     r"SwiGlu|Softmax|AttendPartition|KvHeadBlockBytes|sincos|sched_yield|MatMul|"
                     r"__schedule|Quantize|Dequant|Embed")
samples, outside, engine_tids = collections.Counter(), collections.Counter(), set()
tid, leaf, total = None, None, 0
def close():
    if tid is not None and leaf is not None and not FORWARD.search(leaf): outside[tid] += 1
for line in sys.stdin:
    s = line.strip()
    if not s:
        close(); tid = None; continue
    if tid is None:
        tid, leaf = int(s.split()[0]), None; samples[tid] += 1; total += 1
    else:
        if leaf is None: leaf = s
        if "AsyncEngine::Loop" in s: engine_tids.add(tid)
close()
r = json.load(open(sys.argv[1])); tokens, errors, tps = r["output_tokens"], r["errors"], r["output_tps"]
us = 1e6 / int(sys.argv[2]) / tokens
eng = sum(samples[t] for t in engine_tids); eng_out = sum(outside[t] for t in engine_tids)
print(f"round {sys.argv[3]} {sys.argv[4]}: {tokens} tokens, errors {errors}, output t/s {tps:.0f}; "
      f"engine thread {eng * us:.1f} us/token, {eng_out * us:.1f} of it the loop itself; "
      f"whole process {total * us:.1f} us/token")
' "$TMP/serve.json" $FREQ "$round" "$tag"
  done
done
