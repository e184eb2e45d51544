#!/usr/bin/env bash
# The default build on a CPU with AVX2, FMA and F16C but no AVX-512: Debian's qemu-user with
# -cpu max emulates one. The binary must pick the avx2 level there (no SIGILL), print the golden
# greedy output of stories260K, and give the perplexity of stories-hd64-3M requantized to Q4_K_M
# with a q8_0 KV cache (-c 128, 4 chunks) within 0.1% of the scalar level's (run natively).
#   usage: qemu_x86_test.sh KVSERVE REQUANTIZE MODELS_DIR TEXT
set -euo pipefail
unset KVSERVE_ISA  # the emulated CPU's own choice is what is tested
kvserve=$1 requantize=$2 models=${KVSERVE_TEST_MODELS:-$3} text=$4
qemu=$(command -v qemu-x86_64 || true)
if [ -z "$qemu" ]; then echo "skipped: no qemu-x86_64 (Debian's qemu-user; scripts/setup.sh installs it)"; exit 77; fi
[ "$(uname -m)" = x86_64 ] || { echo "skipped: not an x86-64 build"; exit 77; }
run=("$qemu" -cpu max)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

isa=$("${run[@]}" "$kvserve" inspect "$models/stories260K.gguf" --json 2>/dev/null |
      sed -n 's/^ *"isa": "\(.*\)",*$/\1/p')
echo "qemu -cpu max: isa $isa"
[ "$isa" = avx2 ] || { echo "expected isa avx2 under qemu -cpu max, got '$isa'"; exit 1; }
"${run[@]}" "$kvserve" --version

expected=$(awk '/^text:/{f=1;next} f' "$models/stories260K.greedy256.expected.txt")
got=$("${run[@]}" "$kvserve" generate -m "$models/stories260K.gguf" -p "" -n 256 --temp 0 2>/dev/null)
if [ "$got" != "$expected" ]; then
  echo "golden output differs under qemu:"; diff <(echo "$expected") <(echo "$got") | head -5; exit 1
fi
echo "golden output: same"

"$requantize" "$models/stories-hd64-3M.gguf" "$tmp/q4_k_m.gguf" q4_k_m
ppl() {
  "$@" "$kvserve" perplexity -m "$tmp/q4_k_m.gguf" -f "$text" -c 128 --chunks 4 -ctk q8_0 \
    -ctv q8_0 --json 2>/dev/null | sed -n 's/.*"ppl":\([0-9.e+-]*\).*/\1/p'
}
emulated=$(ppl "${run[@]}")
scalar=$(KVSERVE_ISA=scalar ppl env)
awk -v a="$emulated" -v b="$scalar" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d;
  printf "perplexity: %s under qemu (avx2), %s at scalar (%.4f%%)\n", a, b, 100 * d;
  exit !(a > 0 && d <= 0.001) }'
