#!/usr/bin/env bash
# Are two kvserve builds' outputs bit-identical? A refactor that must not change what kvserve
# computes is checked with this: the same commands run with build A (before) and build B
# (after), and every output compared byte for byte — the generated text and token ids of greedy
# and seeded sampling for every KV type, drafter, eviction policy and tier, batched decoding,
# and `perplexity --kl-base` (its JSON, to the last digit). Prints one line per case and a
# summary; exits 1 when any case differs (the differing outputs are kept and named).
#   usage: bench/outputs_ab.sh [-q] A_BIN B_BIN
#     -q   quick: fewer tokens and perplexity chunks
#   A_BIN of a git ref: bench/build_ref.sh REF DIR builds one (DIR/kvserve).
#   Models: $KVSERVE_TEST_MODELS (default ../shared/models): stories260K.gguf and
#   stories-hd64-3M.gguf (head_dim 64, which the rotated and transform-coded types need).
set -euo pipefail
cd "$(dirname "$0")/.."
N=96
CHUNKS=4
if [[ ${1:-} == -q ]]; then
  N=32
  CHUNKS=2
  shift
fi
[[ $# -eq 2 ]] || { echo "usage: $0 [-q] A_BIN B_BIN" >&2; exit 2; }
# The binaries as the caller named them (relative to where they stand), then the repository.
A=$(realpath -m "$1") B=$(realpath -m "$2")
for bin in "$A" "$B"; do
  [[ -f $bin && -x $bin ]] && "$bin" --version 2>/dev/null | grep -q kvserve ||
    { echo "$0: $bin is not a kvserve binary" >&2; exit 2; }
done
MODELS=${KVSERVE_TEST_MODELS:-../shared/models}
SMALL=$MODELS/stories260K.gguf
HD64=$MODELS/stories-hd64-3M.gguf
for m in "$SMALL" "$HD64"; do
  [[ -f $m ]] || { echo "$0: missing model $m (set KVSERVE_TEST_MODELS)" >&2; exit 2; }
done
TEXT=bench/data/stories-sample.txt
TMP=$(mktemp -d)
REDIS_PID=
cleanup() {
  [[ -n $REDIS_PID ]] && kill "$REDIS_PID" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
KEEP=${KVS_AB_KEEP:-/tmp/kvs-outputs-ab}
mkdir -p "$KEEP"
rm -f "$KEEP"/*.A "$KEEP"/*.B "$KEEP"/*.A.err "$KEEP"/*.B.err  # only what an earlier run kept

PROMPT="Once upon a time, there was a little girl named Lily. She loved to play outside with her"
pass=0
fail=0
# run NAME ARGS...: runs `BIN ARGS...` for A and B. generate's text (stdout) and token ids (the
# "ids:" line of stderr) or perplexity's JSON are what is compared; timings are not.
run() {
  local name=$1
  shift
  local w bin
  for w in A B; do
    bin=$A
    [[ $w == B ]] && bin=$B
    # Tiers: @W@ becomes the build's letter, so that each build has its own directory or Redis
    # namespace, written by a first run and read by the second.
    local args=("${@//@W@/$w}")
    if ! "$bin" "${args[@]}" >"$TMP/$w.out" 2>"$TMP/$w.err"; then
      echo "FAIL $name: build $w exited non-zero: $(tail -2 "$TMP/$w.err")"
      cp "$TMP/$w.err" "$KEEP/$name.$w.err"
      fail=$((fail + 1))
      return
    fi
    # Timings ("seconds" in perplexity's JSON) are not outputs.
    { sed -E 's/"[a-z_]*seconds":[-+0-9.e]+,?//g' "$TMP/$w.out"; grep '^ids:' "$TMP/$w.err" || true; } \
      >"$TMP/$w.cmp"
    # A case that printed nothing, or a disk load run that loaded nothing, compared nothing.
    # (generate logs no count of Redis loads: the redis pair shows only that outputs agree.)
    if [[ ! -s $TMP/$w.out ]] || { [[ $name == disk-*-load ]] && ! grep -Eq '[1-9][0-9]* loaded|loaded [1-9]' "$TMP/$w.err"; }; then
      echo "FAIL $name: build $w printed nothing or loaded no block: $(tail -2 "$TMP/$w.err")"
      cp "$TMP/$w.err" "$KEEP/$name.$w.err"
      fail=$((fail + 1))
      return
    fi
  done
  if cmp -s "$TMP/A.cmp" "$TMP/B.cmp"; then
    echo "same $name ($(wc -c <"$TMP/A.cmp") bytes)"
    pass=$((pass + 1))
  else
    echo "DIFF $name: kept in $KEEP/$name.{A,B}"
    cp "$TMP/A.cmp" "$KEEP/$name.A"
    cp "$TMP/B.cmp" "$KEEP/$name.B"
    fail=$((fail + 1))
  fi
}
gen() {
  local name=$1 model=$2
  shift 2
  run "$name" generate -m "$model" -p "$PROMPT" -n "$N" --show-ids --ignore-eos "$@"
}
greedy=(--temp 0)
seeded=(--temp 0.9 --top-k 40 --top-p 0.95 --min-p 0.02 --seed 1234 --repeat-penalty 1.1)

# KV types (K and V alike, and one mixed pair), greedy and seeded.
for t in f32 f16 bf16 q8_0 q4_0 int8 fp8 turbo4 turbo3; do
  gen "kv-$t-greedy" "$HD64" "${greedy[@]}" -ctk "$t" -ctv "$t"
  gen "kv-$t-seeded" "$HD64" "${seeded[@]}" -ctk "$t" -ctv "$t"
done
gen kv-q8_0-q4_0-greedy "$HD64" "${greedy[@]}" -ctk q8_0 -ctv q4_0
gen small-greedy "$SMALL" "${greedy[@]}"
gen small-seeded "$SMALL" "${seeded[@]}"
# Continuous batching: several sequences per step, chunked prefill.
gen batch4-seeded "$HD64" "${seeded[@]}" --parallel 4 --max-batch-tokens 24
gen batch4-greedy-q4_0 "$HD64" "${greedy[@]}" --parallel 4 -ctk q4_0 -ctv q4_0
# Drafters.
for s in greedy seeded; do
  declare -n opts=$s
  gen "spec-draft-$s" "$HD64" "${opts[@]}" --spec-type draft -md "$SMALL"
  gen "spec-ngram-$s" "$HD64" "${opts[@]}" --spec-type ngram
  gen "spec-self-$s" "$HD64" "${opts[@]}" --spec-type self
  gen "spec-self-window-$s" "$HD64" "${opts[@]}" --spec-type self --draft-window 32
done
unset -n opts
# Eviction policies (a budget well under the output, so they act).
for p in streaming keydiff h2o snapkv tri; do
  gen "evict-$p-greedy" "$HD64" "${greedy[@]}" --kv-budget 48 --evict-policy "$p"
  gen "evict-$p-seeded-q8_0" "$HD64" "${seeded[@]}" --kv-budget 48 --evict-policy "$p" -ctk q8_0 -ctv q8_0
done
# Tiers: a first run writes the disk tier, a second loads the prompt's blocks from it.
for codec in raw zstd tc:4; do
  c=${codec//:/}
  gen "disk-$c-write" "$HD64" "${greedy[@]}" --kv-disk "$TMP/@W@-disk-$c" --kv-disk-codec "$codec"
  gen "disk-$c-load" "$HD64" "${greedy[@]}" --kv-disk "$TMP/@W@-disk-$c" --kv-disk-codec "$codec"
done
if command -v redis-server >/dev/null; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$TMP/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  for w in write load; do
    # Each build its own namespace: B must not load what A wrote.
    run "redis-$w" generate -m "$HD64" -p "$PROMPT" -n "$N" --show-ids --ignore-eos \
      "${greedy[@]}" --kv-redis "redis://127.0.0.1:$port" --kv-redis-namespace "ab-@W@"
  done
else
  echo "skip redis: no redis-server"
fi
# Perplexity with its f32 baseline, to the last digit of the JSON.
for t in f16 q8_0 q4_0 turbo3; do
  run "ppl-$t" perplexity -m "$HD64" -f "$TEXT" -c 128 --chunks "$CHUNKS" --kl-base \
    -ctk "$t" -ctv "$t" --json
done
run ppl-evict-h2o perplexity -m "$HD64" -f "$TEXT" -c 128 --chunks "$CHUNKS" --kl-base \
  --kv-budget 64 --evict-policy h2o --json

echo "outputs A=$A B=$B: $pass same, $fail differ or failed"
((fail == 0))
