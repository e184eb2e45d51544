#!/usr/bin/env bash
# Do two kvserve builds' servers answer the same? The front end (detokenization, stop strings,
# logprobs, usage, SSE chunking) is checked with this: each build serves stories260K, the same
# requests go to both (stop strings that end choices, n > 1, logprobs for completions and chat,
# streamed and not, include_usage, return_token_ids, a seeded sampled request), and the answers
# are compared byte for byte after the response id and the created time are blanked.
#   usage: bench/server_outputs_ab.sh A_BIN B_BIN
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -eq 2 ]] || { echo "usage: $0 A_BIN B_BIN" >&2; exit 2; }
A=$(realpath -m "$1") B=$(realpath -m "$2")
MODEL=${KVSERVE_TEST_MODELS:-../shared/models}/stories260K.gguf
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() {  # start BIN LETTER: serves on a free port, writes the port to $TMP/LETTER.port
  local port
  port=$(free_port)
  "$1" serve -m "$MODEL" --port "$port" -np 4 -c 512 -t 1 >"$TMP/$2.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.1
  done
  echo "$port" >"$TMP/$2.port"
}
start "$A" A
start "$B" B
# The requests, one JSON body per line: path<TAB>body.
cat >"$TMP/requests" <<'REQ'
/v1/completions	{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"stop":["girl","never-seen"],"n":2,"logprobs":2}
/v1/completions	{"prompt":"Once upon a time","max_tokens":40,"temperature":0,"stop":["girl"],"logprobs":3,"stream":true,"stream_options":{"include_usage":true}}
/v1/completions	{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"stop":[" the","."],"return_token_ids":true,"stream":true,"stream_options":{"include_usage":true}}
/v1/completions	{"prompt":"Once upon a time","max_tokens":60,"temperature":0,"stop":["a l"],"return_token_ids":true}
/v1/completions	{"prompt":"The cat","max_tokens":48,"temperature":0.9,"seed":7,"n":3,"stop":["ed "],"logprobs":1}
/v1/completions	{"prompt":"The cat","max_tokens":48,"temperature":0.9,"seed":7,"n":2,"stop":["ed "],"stream":true,"stream_options":{"include_usage":true}}
/v1/chat/completions	{"messages":[{"role":"user","content":"Hi"}],"max_tokens":30,"temperature":0,"logprobs":true,"top_logprobs":3,"stop":["was"]}
/v1/chat/completions	{"messages":[{"role":"user","content":"Hi"}],"max_tokens":30,"temperature":0,"logprobs":true,"top_logprobs":2,"stop":["was"],"stream":true,"stream_options":{"include_usage":true}}
/v1/chat/completions	{"messages":[{"role":"user","content":"Tell a story"}],"max_tokens":50,"temperature":0.7,"seed":3,"n":2,"stop":["\n"],"stream":true}
/v1/completions	{"prompt":"Lily","max_tokens":30,"temperature":0,"logprobs":5}
REQ
same=0 differ=0 i=0
while IFS=$'\t' read -r path body; do
  i=$((i + 1))
  for w in A B; do
    curl -s -N "http://127.0.0.1:$(cat "$TMP/$w.port")$path" -H 'Content-Type: application/json' \
      -d "$body" | sed -E 's/"id":"[a-z]*-[0-9]+"/"id":""/g; s/"created":[0-9]+/"created":0/g' \
      >"$TMP/$i.$w"
  done
  if [[ -s $TMP/$i.A ]] && cmp -s "$TMP/$i.A" "$TMP/$i.B"; then
    same=$((same + 1))
    echo "same   $i $path $(head -c 100 "$TMP/$i.A" | tr '\n' ' ')"
  else
    differ=$((differ + 1))
    echo "DIFFER $i $path"
    diff <(tr ',' '\n' <"$TMP/$i.A") <(tr ',' '\n' <"$TMP/$i.B") | head -20 || true
  fi
done <"$TMP/requests"
echo "$same same, $differ differ"
[[ $differ -eq 0 ]]
