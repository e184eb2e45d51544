#!/usr/bin/env bash
# The kernels at one instruction-set level: KVSERVE_ISA=LEVEL for the kernel tests, the golden
# greedy output of stories260K, and the perplexity of stories-hd64-3M requantized to Q4_K_M and
# Q5_K_M with a q8_0 KV cache (-c 128, 4 chunks), which must be within 0.1% of the scalar
# level's. Exits 77 (skipped) where this CPU lacks the level.
#   usage: isa_level_test.sh LEVEL KVSERVE KERNELS_TEST REQUANTIZE MODELS_DIR TEXT [RUNNER...]
# RUNNER (e.g. qemu-x86_64 -cpu max) runs the programs under an emulator instead.
set -euo pipefail
level=$1 kvserve=$2 kernels_test=$3 requantize=$4 models=${KVSERVE_TEST_MODELS:-$5} text=$6
shift 6
runner=("$@")
if ! msg=$(KVSERVE_ISA=$level "${runner[@]}" "$kvserve" --version 2>&1 >/dev/null); then
  # Only the refusal of a level this CPU or build lacks is a skip; anything else (a crash) fails.
  case "$msg" in
    *"this CPU lacks"* | *"this build has no"*) echo "skipped: $msg"; exit 77 ;;
    *) echo "kvserve --version failed at $level: $msg"; exit 1 ;;
  esac
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0

echo "== kernel tests at $level"
KVSERVE_ISA=$level "${runner[@]}" "$kernels_test" --gtest_brief=1 || fail=1

stories=$models/stories260K.gguf
if [ -f "$stories" ]; then
  echo "== golden greedy output of stories260K at $level"
  expected=$(awk '/^text:/{f=1;next} f' "$models/stories260K.greedy256.expected.txt")
  got=$(KVSERVE_ISA=$level "${runner[@]}" "$kvserve" generate -m "$stories" -p "" -n 256 \
        --temp 0 2>/dev/null)
  if [ "$got" = "$expected" ]; then echo "golden output: same"; else
    echo "golden output differs at $level:"; diff <(echo "$expected") <(echo "$got") | head -5
    fail=1
  fi
else
  echo "no $stories: golden check skipped"
fi

hd64=$models/stories-hd64-3M.gguf
if [ -f "$hd64" ]; then
  for mix in q4_k_m q5_k_m q4_0; do
    "$requantize" "$hd64" "$tmp/$mix.gguf" "$mix" || { echo "requantize $mix failed"; exit 1; }
    ppl() {
      KVSERVE_ISA=$1 "${@:2}" "$kvserve" perplexity -m "$tmp/$mix.gguf" -f "$text" -c 128 \
        --chunks 4 -ctk q8_0 -ctv q8_0 --json 2>/dev/null |
        sed -n 's/.*"ppl":\([0-9.e+-]*\).*/\1/p'
    }
    here=$(ppl "$level" "${runner[@]}")
    scalar=$(ppl scalar)
    if awk -v m="$mix" -v a="$here" -v b="$scalar" 'BEGIN { d = (a - b) / b; if (d < 0) d = -d;
        printf "%s: perplexity %s at this level, %s at scalar (%.4f%%)\n", m, a, b, 100 * d;
        exit !(a > 0 && d <= 0.001) }'; then :; else
      echo "perplexity of $mix at $level is not within 0.1% of scalar's"; fail=1
    fi
  done
else
  echo "no $hd64: perplexity check skipped"
fi
exit $fail
