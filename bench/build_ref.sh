#!/usr/bin/env bash
# Builds the kvserve binary of a git ref (a commit, a branch, HEAD~3) into DIR, from a
# temporary worktree, for the A/B scripts (bench/outputs_ab.sh, speed_ab.sh, throughput_ab.sh).
# Release flags as scripts/build.sh; prints DIR/kvserve.
#   usage: bench/build_ref.sh REF DIR
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 2 ]] || { echo "usage: $0 REF DIR" >&2; exit 2; }
REF=$1
DIR=$(mkdir -p "$2" && cd "$2" && pwd)
commit=$(git rev-parse --verify "$REF^{commit}") || { echo "$0: no commit '$REF'" >&2; exit 2; }
SRC=$DIR/src
if [[ ! -d $SRC ]]; then
  git worktree add --detach "$SRC" "$commit" >&2
else
  git -C "$SRC" checkout --detach -q "$commit"
fi
cmake -S "$SRC" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$DIR/build" --target kvserve >&2
ln -sf build/kvserve "$DIR/kvserve"
echo "$DIR/kvserve"
