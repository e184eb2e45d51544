#!/usr/bin/env bash
# The main job: install dependencies, build, and generate a story with the default model.
# Extra arguments go to `kvserve generate` (e.g. -p "Once upon a time" -n 64).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh release kvserve
if [ -z "${KVSERVE_MODEL:-}" ] && [ ! -f ../shared/models/stories260K.gguf ]; then
  cache="$HOME/.cache/kvserve/models/stories260K.gguf"
  if [ ! -f "$cache" ]; then
    echo "downloading the default model (stories260K.gguf, 1.2 MB) into $(dirname "$cache")" >&2
    mkdir -p "$(dirname "$cache")"
    curl -fL --retry 2 -o "$cache.part" \
      https://huggingface.co/ggml-org/models/resolve/main/tinyllamas/stories260K.gguf && mv "$cache.part" "$cache" || {
      rm -f "$cache.part"
      echo "error: could not download the default model; set KVSERVE_MODEL=/path/to/model.gguf" >&2
      exit 1
    }
  fi
fi
exec build/kvserve generate -n 200 "$@"
