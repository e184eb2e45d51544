#!/usr/bin/env bash
# Builds the kvserve binary of a git ref (a commit, a branch, HEAD~3) into DIR, from a
# temporary worktree, for the A/B scripts (bench/outputs_ab.sh, speed_ab.sh, throughput_ab.sh).
# Release flags as scripts/build.sh; prints DIR/kvserve.
#   usage: bench/build_ref.sh REF DIR
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 REF DIR" >&2; exit 2; }
REF=$1
# DIR as the caller meant it (relative to where they stand), before moving to the repository.
DIR=$(realpath -m "$2")
cd "$(dirname "$0")/.."
commit=$(git rev-parse --verify -q "$REF^{commit}") || { echo "$0: no commit '$REF'" >&2; exit 2; }
SRC=$DIR/src
if [[ ! -e $SRC ]]; then
  mkdir -p "$DIR"
  git worktree add --detach "$SRC" "$commit" >&2
elif [[ $(git -C "$SRC" rev-parse --show-toplevel 2>/dev/null) != "$SRC" ||
        $(git -C "$SRC" rev-parse --git-common-dir 2>/dev/null) != "$(realpath "$(git rev-parse --git-common-dir)")" ||
        $SRC == "$(git rev-parse --show-toplevel)" ]]; then
  # Never check out anything in a directory this script did not make (the repository's own
  # checkout, say, for DIR '.'): only a worktree of this repository at DIR/src is reused.
  echo "$0: $SRC exists and is not a worktree this script made; choose another DIR" >&2
  exit 2
else
  git -C "$SRC" checkout --detach -q "$commit"
fi
cmake -S "$SRC" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
cmake --build "$DIR/build" --target kvserve >&2
ln -sf build/kvserve "$DIR/kvserve"
echo "$DIR/kvserve"
