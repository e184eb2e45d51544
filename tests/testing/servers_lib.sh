# Sourced by the shell tests that start servers of their own (deploy_test, multi_replica_test):
# a temporary directory, the ids of the processes started (killed by id at exit), ok/FAIL lines
# with a failure count, a free loopback port, and polling with a deadline instead of sleeps.
TMP=$(mktemp -d)
PIDS=()  # every process the test starts in the background, stopped by id at exit
reaped() {  # PID: waited for already, not to be signalled at exit (its id may be reused)
  local keep=() pid
  for pid in "${PIDS[@]}"; do [ "$pid" = "$1" ] || keep+=("$pid"); done
  PIDS=("${keep[@]}")
}
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null  # reaped quietly
  done
  rm -rf "$TMP"
}
trap cleanup EXIT
failures=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; failures=$((failures + 1)); }
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
# poll SECONDS CMD...: runs CMD every 50 ms until it succeeds; fails after SECONDS.
poll() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    [ $SECONDS -ge $deadline ] && return 1
    read -rt 0.05 <> <(:) || true
  done
}
