#!/usr/bin/env bash
# deploy/ where it can run here (issue #22). Docker and Kubernetes cannot: their files are only
# parsed. What runs for real, on free loopback ports:
#  - `haproxy -c` on deploy/haproxy.cfg and deploy/k8s/haproxy.cfg;
#  - redis-server with deploy/redis.conf (port, bind and dir overridden): it answers, asks for
#    the password it was started with, has the cache settings (allkeys-lru, no persistence),
#    and the ACL its comments suggest lets kvserve's commands through on its keys only;
#  - HAProxy with deploy/haproxy.cfg in front of two kvserve replicas of stories260K: one
#    X-Session-Id always reaches one replica (the replica's own request counter agrees with
#    HAProxy's X-Kvserve-Replica header), requests without it are spread over both, a killed
#    replica is taken out by the health check and every request then succeeds on the other,
#    and the restarted replica gets its sessions back.
# Exits 77 (skipped) without haproxy, or without the model after the checks that need neither.
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
DEPLOY=$HERE/../deploy
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
if ! command -v haproxy >/dev/null; then
  echo "skipping: haproxy not found (scripts/setup.sh installs it)"
  exit 77
fi
. "$HERE/testing/servers_lib.sh"

# --- The configurations -----------------------------------------------------------------------
LB_PORT=$(free_port) STATS_PORT=$(free_port) R1_PORT=$(free_port) R2_PORT=$(free_port)
export KVSERVE_LB_BIND=127.0.0.1:$LB_PORT HAPROXY_STATS_BIND=127.0.0.1:$STATS_PORT
export KVSERVE_1=127.0.0.1:$R1_PORT KVSERVE_2=127.0.0.1:$R2_PORT
haproxy -c -f "$DEPLOY/haproxy.cfg" >"$TMP/check" 2>&1 &&
  pass "haproxy -c deploy/haproxy.cfg" || fail "haproxy -c deploy/haproxy.cfg: $(cat "$TMP/check")"
# The Kubernetes variant resolves through the cluster's DNS at run time (init-addr none), so it
# checks anywhere.
haproxy -c -f "$DEPLOY/k8s/haproxy.cfg" >"$TMP/check" 2>&1 &&
  pass "haproxy -c deploy/k8s/haproxy.cfg" || fail "haproxy -c deploy/k8s/haproxy.cfg: $(cat "$TMP/check")"

if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
  REDIS_PORT=$(free_port)
  head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/redis_password"
  # As deploy/README.md starts it, with the address and directory of this test.
  redis-server "$DEPLOY/redis.conf" --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$TMP" \
    --requirepass "$(cat "$TMP/redis_password")" >"$TMP/redis.log" 2>&1 &
  PIDS+=("$!")
  rcli() { redis-cli -p "$REDIS_PORT" --no-auth-warning -a "$(cat "$TMP/redis_password")" "$@" 2>&1; }
  redis_up() { [ "$(rcli ping)" = PONG ]; }
  if poll 10 redis_up; then
    pass "redis-server deploy/redis.conf: PONG"
    [[ $(redis-cli -p "$REDIS_PORT" ping 2>&1) == *NOAUTH* ]] &&
      pass "redis: no password, no access" || fail "redis answered without the password"
    got=$(rcli config get maxmemory-policy | tail -1)/$(rcli config get save | tail -1)/$(rcli config get appendonly | tail -1)/$(rcli config get protected-mode | tail -1)/$(rcli config get maxmemory | tail -1)
    [ "$got" = "allkeys-lru//no/yes/4294967296" ] &&
      pass "redis: allkeys-lru, no snapshots, no AOF, protected mode, maxmemory 4gb" ||
      fail "redis settings: $got"
    # The ACL redis.conf suggests (a comment there) lets kvserve's commands through, and no other.
    acl=$(sed -n 's/^#   user kvserve on >PASSWORD //p' "$DEPLOY/redis.conf")
    # shellcheck disable=SC2086  # the rules are words
    rcli acl setuser kvserve on '>userpw' $acl >/dev/null
    ucli() { redis-cli -p "$REDIS_PORT" --no-auth-warning --user kvserve --pass userpw "$@" 2>&1; }
    got=$(ucli set 'kvserve:{ab12}' v EX 60)/$(ucli get 'kvserve:{ab12}')/$(ucli del 'kvserve:{ab12}')/$(ucli ping)
    [ -n "$acl" ] && [ "$got" = "OK/v/1/PONG" ] && [[ $(ucli set other v) == *NOPERM* ]] &&
      [[ $(ucli flushall) == *NOPERM* ]] && pass "redis: the suggested ACL ($acl) allows kvserve's keys only" ||
      fail "redis ACL '$acl': $got"
    rcli shutdown nosave >/dev/null
  else
    fail "redis-server deploy/redis.conf did not answer: $(tail -5 "$TMP/redis.log")"
  fi
else
  echo "skipping the redis.conf check: redis-server or redis-cli not found (scripts/setup.sh installs them)"
fi

# Compose and Kubernetes files: they parse, and every kvserve flag they use exists, or is one of
# the Redis-tier and KV-event flags of issue #22 that this build may not have yet.
if python3 -c 'import yaml' 2>/dev/null; then
  "$BIN" serve --help >"$TMP/serve_help" 2>&1
  if python3 - "$DEPLOY" "$TMP/serve_help" >"$TMP/yaml" 2>&1 <<'PY'
import re, sys, yaml
deploy, help_text = sys.argv[1], open(sys.argv[2]).read()
pending = {"--kv-redis", "--kv-redis-password-file", "--kv-redis-ttl", "--kv-redis-timeout-ms", "--kv-events"}
known = set(re.findall(r"(--[a-z][a-z0-9-]*)", help_text)) | set(re.findall(r"(?<![\w-])(-[a-z]+)\b", help_text))
compose = yaml.safe_load(open(f"{deploy}/compose.yaml"))
assert {"redis", "kvserve1", "kvserve2", "haproxy"} <= set(compose["services"]), compose["services"].keys()
arg_lists = [compose["services"][s]["command"] for s in ("kvserve1", "kvserve2")]
docs = [d for d in yaml.safe_load_all(open(f"{deploy}/k8s/kvserve.yaml")) if d]
kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
for want in [("Deployment", "kvserve"), ("Service", "kvserve"), ("Deployment", "kvserve-redis"), ("Service", "kvserve-redis")]:
    assert want in kinds, (want, kinds)
for d in docs:
    if d["kind"] != "Deployment" or d["metadata"]["name"] != "kvserve":
        continue
    c = d["spec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health", probe
    assert c["resources"]["requests"] and c["resources"]["limits"]
    arg_lists.append(c["args"])
missing = set()
for args in arg_lists:
    for a in args:
        if a.startswith("-") and a not in known and a not in pending:
            missing.add(a)
assert not missing, f"flags kvserve serve does not have: {sorted(missing)}"
not_yet = sorted(f for f in pending if f not in known)
print(f"not in this build yet: {' '.join(not_yet)}" if not_yet else "all flags present")
PY
  then pass "compose.yaml and k8s/kvserve.yaml parse; their kvserve flags exist ($(cat "$TMP/yaml"))"
  else fail "compose.yaml / k8s/kvserve.yaml: $(tail -3 "$TMP/yaml")"; fi
else
  echo "skipping the YAML checks: python3-yaml not found"
fi

if [ ! -f "$MODEL" ]; then
  echo "skipping the replicas behind HAProxy: $MODEL not found (set KVSERVE_TEST_MODELS)"
  [ $failures -eq 0 ] && exit 77 || exit 1
fi

# --- Two replicas behind HAProxy -------------------------------------------------------------
start_replica() {  # $1 port, $2 log: a tiny server; its pid in REPLICA
  "$BIN" serve -m "$MODEL" --port "$1" -np 2 -c 256 -t 1 >"$2" 2>&1 &
  REPLICA=$!
  PIDS+=("$REPLICA")
}
healthy() { curl -sf "http://127.0.0.1:$1/health" >/dev/null; }
start_replica "$R1_PORT" "$TMP/r1.log"
start_replica "$R2_PORT" "$TMP/r2.log"; R2=$REPLICA
poll 30 healthy "$R1_PORT" && poll 30 healthy "$R2_PORT" ||
  { fail "replicas did not start: $(tail -3 "$TMP/r1.log" "$TMP/r2.log")"; exit 1; }
haproxy -db -f "$DEPLOY/haproxy.cfg" >"$TMP/haproxy.log" 2>&1 &
PIDS+=("$!")
# hastat PROXY SERVER FIELD: a field of HAProxy's CSV stats (status: UP/DOWN, stot: requests).
hastat() {
  curl -sf "http://127.0.0.1:$STATS_PORT/stats;csv" | python3 -c '
import csv, sys
rows = list(csv.reader(l.lstrip("# ") for l in sys.stdin))
col = rows[0].index(sys.argv[3]) if rows else -1  # no rows: HAProxy is not listening yet
print(next((r[col] for r in rows[1:] if r[:2] == sys.argv[1:3]), ""))' "$1" "$2" "$3"
}
status_is() { [ "$(hastat kvserve_session "$1" status)" = "$2" ]; }
poll 30 status_is kvserve1 UP && poll 30 status_is kvserve2 UP ||
  { fail "HAProxy did not see both replicas UP: $(tail -5 "$TMP/haproxy.log")"; exit 1; }
pass "HAProxy up, both replicas UP by their /health"

# ask [SESSION]: one completion through HAProxy; prints "HTTP-STATUS REPLICA".
ask() {
  local h=()
  [ $# -gt 0 ] && h=(-H "X-Session-Id: $1")
  curl -s -o /dev/null -D "$TMP/head" -w '%{http_code}' "${h[@]}" -H 'Content-Type: application/json' \
    "http://127.0.0.1:$LB_PORT/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 4}' >"$TMP/code"
  echo "$(cat "$TMP/code") $(tr -d '\r' <"$TMP/head" | sed -n 's/^[Xx]-[Kk]vserve-[Rr]eplica: //p')"
}
served() {  # kvserve:request_success_total of the replica on port $1
  curl -sf "http://127.0.0.1:$1/metrics" | sed -n 's/^kvserve:request_success_total //p'
}

# Sessions stick: 8 sessions x 3 requests, interleaved.
declare -A home
sticky=1 sent=0 r1_before=$(served "$R1_PORT") r2_before=$(served "$R2_PORT") on1=0
for _ in 1 2 3; do
  for s in $(seq 1 8); do
    read -r code replica < <(ask "chat-$s")
    sent=$((sent + 1))
    [ "$code" = 200 ] || { fail "session chat-$s: HTTP $code"; sticky=0; }
    [ "$replica" = kvserve1 ] && on1=$((on1 + 1))
    if [ -z "${home[chat-$s]:-}" ]; then home[chat-$s]=$replica
    elif [ "${home[chat-$s]}" != "$replica" ]; then sticky=0; fi
  done
done
[ $sticky = 1 ] && pass "each X-Session-Id always reaches the same replica (8 sessions x 3)" ||
  fail "sessions moved: $(declare -p home)"
n1=0; for s in "${!home[@]}"; do [ "${home[$s]}" = kvserve1 ] && n1=$((n1 + 1)); done
[ $n1 -gt 0 ] && [ $n1 -lt 8 ] && pass "the 8 sessions are spread over both replicas ($n1 on kvserve1)" ||
  fail "all 8 sessions on one replica ($n1 on kvserve1)"
# The replicas' own counters agree with the header that named them.
d1=$(($(served "$R1_PORT") - r1_before)) d2=$(($(served "$R2_PORT") - r2_before))
[ $d1 = $on1 ] && [ $d2 = $((sent - on1)) ] &&
  pass "replica request counters match X-Kvserve-Replica ($d1 + $d2)" ||
  fail "counters: kvserve1 +$d1, kvserve2 +$d2; headers: $on1 on kvserve1 of $sent"
[ "$(hastat kvserve_session BACKEND stot)" = 24 ] && pass "those 24 went through the session backend" ||
  fail "session backend requests: $(hastat kvserve_session BACKEND stot)"

# No header (or an empty one): least connections, over both replicas.
declare -A count=([kvserve1]=0 [kvserve2]=0)
for _ in $(seq 1 8); do
  read -r code replica < <(ask)
  [ "$code" = 200 ] && [ -n "$replica" ] && count[$replica]=$((${count[$replica]:-0} + 1))
done
curl -s -o /dev/null -H 'X-Session-Id;' -H 'Content-Type: application/json' \
  "http://127.0.0.1:$LB_PORT/v1/completions" -d '{"prompt": "Once", "max_tokens": 2}'
[ ${count[kvserve1]} -ge 2 ] && [ ${count[kvserve2]} -ge 2 ] &&
  [ $((count[kvserve1] + count[kvserve2])) = 8 ] &&
  pass "without X-Session-Id: spread over both (${count[kvserve1]} + ${count[kvserve2]} of 8)" ||
  fail "without X-Session-Id: kvserve1 ${count[kvserve1]}, kvserve2 ${count[kvserve2]} of 8"
[ "$(hastat kvserve_least BACKEND stot)" = 9 ] && pass "those 8 and the empty header went by least connections" ||
  fail "least-connections backend requests: $(hastat kvserve_least BACKEND stot)"

# Replica 2 dies (SIGKILL: no goodbye). A request sent before the health check notices finds the
# connection refused and is retried on replica 1 (option redispatch); once the check has taken
# replica 2 out, every request, with or without a session, succeeds on replica 1.
victim=""
for s in "${!home[@]}"; do [ "${home[$s]}" = kvserve2 ] && victim=$s; done
kill -9 "$R2"; wait "$R2" 2>/dev/null
read -r code replica < <(ask "$victim")
[ "$code" = 200 ] && [ "$replica" = kvserve1 ] &&
  pass "right after the kill, $victim's request is retried on kvserve1" ||
  fail "right after the kill: HTTP $code from '$replica'"
poll 30 status_is kvserve2 DOWN && pass "the health check marks kvserve2 DOWN" ||
  fail "kvserve2 still $(hastat kvserve_session kvserve2 status)"
bad=0
for s in "${!home[@]}"; do
  read -r code replica < <(ask "$s"); [ "$code" = 200 ] && [ "$replica" = kvserve1 ] || bad=$((bad + 1))
  read -r code replica < <(ask); [ "$code" = 200 ] && [ "$replica" = kvserve1 ] || bad=$((bad + 1))
done
[ $bad = 0 ] && pass "with kvserve2 down: 16 of 16 requests succeed on kvserve1" ||
  fail "with kvserve2 down: $bad of 16 requests failed or went elsewhere"

# Back: the health check brings it in, and consistent hashing gives it its sessions again.
start_replica "$R2_PORT" "$TMP/r2b.log"
poll 30 status_is kvserve2 UP && pass "restarted kvserve2 is UP again" ||
  fail "restarted kvserve2: $(hastat kvserve_session kvserve2 status)"
read -r code replica < <(ask "$victim")
[ "$code" = 200 ] && [ "$replica" = kvserve2 ] && pass "$victim is back on kvserve2" ||
  fail "$victim after the restart: HTTP $code from '$replica'"
exit $failures
