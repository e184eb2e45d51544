# Shared by the server comparisons (source it): a temp dir, the server's pid in SERVER (killed
# on exit), a free loopback port, and waiting until a server's /health says ok.
PEER=${KVS_PEER_DIR:-$HOME/.cache/kvserve-peer}/bin
TMP=$(mktemp -d)
SERVER=
# KEEP_DATA=DIR (bench/report.sh): the raw JSON results are copied there before the temp dir goes.
cleanup() {
  [ -n "$SERVER" ] && kill "$SERVER" 2>/dev/null; wait 2>/dev/null
  if [ -n "${KEEP_DATA:-}" ]; then mkdir -p "$KEEP_DATA"; cp "$TMP"/*.json* "$KEEP_DATA"/ 2>/dev/null; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_ready() {  # $1 port
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$SERVER" 2>/dev/null || { echo "server died" >&2; return 1; }
    sleep 0.2
  done
  return 1
}
# The A/B scripts' server: $1 binary, $2 model, $3 context; -np 16 and 2 threads, on a free port
# (PORT), its pid in SERVER, returning once it is ready.
start_ab_server() {
  PORT=$(free_port)
  "$1" serve -m "$2" --port "$PORT" -np 16 -c "$3" -t 2 2>/dev/null &
  SERVER=$!
  wait_ready "$PORT"
}
