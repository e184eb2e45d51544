#!/usr/bin/env bash
# Two replicas sharing Redis behind HAProxy, followed by a KV-event subscriber (issue #22, item
# 5). On free loopback ports: redis-server (no persistence), two kvserve replicas of stories260K
# with --kv-redis, --kv-events and --kv-events-replay, HAProxy with deploy/haproxy.cfg, and
# tools/kv_events_subscriber.py following both replicas.
#  - A prompt of 2,000+ tokens sent with a session that lands on replica A is written to Redis;
#    the same prompt with a session that lands on replica B is served from Redis there (cached
#    tokens >= 1900, all of them from Redis) with A's greedy tokens.
#  - The index the subscriber rebuilt from each replica's events is that replica's
#    /v1/kv/lookup: the prompt's blocks are in it, a prompt that leaves the shared prefix stops
#    where lookup stops, its size is the blocks the replica computed or loaded, both replicas
#    hold the same hashes, the hex spellings of events, lookup and Redis's keys agree, and no
#    batch was lost.
#  - Redis killed with SIGKILL while 8 requests run costs none of them; restarted on its port,
#    both replicas reconnect (kv_redis_up 1) and share blocks through it again.
# Exits 77 (skipped) without redis-server, haproxy, a python3 with zmq and msgpack, or the model.
set -u
BIN=${KVSERVE_BIN:?set KVSERVE_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
DEPLOY=$HERE/../deploy
SUBSCRIBER=$HERE/../tools/kv_events_subscriber.py
MODELS=${KVSERVE_TEST_MODELS:-$HERE/../../shared/models}
MODEL="$MODELS/stories260K.gguf"
for tool in redis-server redis-cli haproxy curl; do
  if ! command -v "$tool" >/dev/null; then
    echo "skipping: $tool not found (scripts/setup.sh installs it)"
    exit 77
  fi
done
# Debian's python3-zmq and python3-msgpack are in /usr/bin/python3's path, which a pyenv or
# venv python3 first on PATH does not see.
PY=
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -c 'import zmq, msgpack' 2>/dev/null; then PY=$py; break; fi
done
if [ -z "$PY" ]; then
  echo "skipping: no python3 with the zmq and msgpack modules (apt install python3-zmq python3-msgpack)"
  exit 77
fi
if [ ! -f "$MODEL" ]; then
  echo "skipping: $MODEL not found (set KVSERVE_TEST_MODELS)"
  exit 77
fi
. "$HERE/testing/servers_lib.sh"
# jf FILE EXPR: a Python expression over the JSON in FILE (as j).
jf() { "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null; }
# metric PORT NAME: a kvserve:NAME value from the replica on PORT, as an integer.
metric() {
  curl -sf "http://127.0.0.1:$1/metrics" | sed -n "s/^kvserve:$2 //p" |
    "$PY" -c 'import sys; v=sys.stdin.read().strip(); print(int(float(v)) if v else -1)'
}

# --- Redis, two replicas, HAProxy, the subscriber ---------------------------------------------
LB_PORT=$(free_port) STATS_PORT=$(free_port) R1_PORT=$(free_port) R2_PORT=$(free_port)
REDIS_PORT=$(free_port)
EV1=tcp://127.0.0.1:$(free_port) RP1=tcp://127.0.0.1:$(free_port)
EV2=tcp://127.0.0.1:$(free_port) RP2=tcp://127.0.0.1:$(free_port)
export KVSERVE_LB_BIND=127.0.0.1:$LB_PORT HAPROXY_STATS_BIND=127.0.0.1:$STATS_PORT
export KVSERVE_1=127.0.0.1:$R1_PORT KVSERVE_2=127.0.0.1:$R2_PORT
rcli() { redis-cli -p "$REDIS_PORT" "$@" 2>&1; }
redis_up() { [ "$(rcli ping)" = PONG ]; }
start_redis() {  # a cache: no snapshots, no AOF; its pid in REDIS
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$TMP" --save '' --appendonly no \
    >>"$TMP/redis.log" 2>&1 &
  REDIS=$!
  PIDS+=("$REDIS")
  poll 10 redis_up || { fail "redis-server did not answer: $(tail -3 "$TMP/redis.log")"; exit 1; }
}
start_redis
start_replica() {  # $1 port, $2 events endpoint, $3 replay endpoint, $4 log
  "$BIN" serve -m "$MODEL" --port "$1" -np 4 -c 16384 -t 1 --kv-redis "redis://127.0.0.1:$REDIS_PORT" \
    --kv-events "$2" --kv-events-replay "$3" >"$4" 2>&1 &
  PIDS+=("$!")
}
healthy() { curl -sf "http://127.0.0.1:$1/health" >/dev/null; }
start_replica "$R1_PORT" "$EV1" "$RP1" "$TMP/r1.log"
start_replica "$R2_PORT" "$EV2" "$RP2" "$TMP/r2.log"
poll 30 healthy "$R1_PORT" && poll 30 healthy "$R2_PORT" ||
  { fail "replicas did not start: $(tail -3 "$TMP/r1.log" "$TMP/r2.log")"; exit 1; }
haproxy -db -f "$DEPLOY/haproxy.cfg" >"$TMP/haproxy.log" 2>&1 &
PIDS+=("$!")
hastat() {  # PROXY SERVER FIELD of HAProxy's CSV stats
  curl -sf "http://127.0.0.1:$STATS_PORT/stats;csv" | "$PY" -c '
import csv, sys
rows = list(csv.reader(l.lstrip("# ") for l in sys.stdin))
col = rows[0].index(sys.argv[3]) if rows else -1
print(next((r[col] for r in rows[1:] if r[:2] == sys.argv[1:3]), ""))' "$1" "$2" "$3"
}
status_is() { [ "$(hastat kvserve_session "$1" status)" = "$2" ]; }
poll 30 status_is kvserve1 UP && poll 30 status_is kvserve2 UP ||
  { fail "HAProxy did not see both replicas UP: $(tail -5 "$TMP/haproxy.log")"; exit 1; }
# Unbuffered, one JSON line per batch, the summary at SIGINT.
"$PY" -u "$SUBSCRIBER" -r "a=$EV1,$RP1" -r "b=$EV2,$RP2" --summary >"$TMP/events" 2>"$TMP/events.err" &
SUB=$!
PIDS+=("$SUB")
pass "redis-server, replicas A (kvserve1) and B (kvserve2) with --kv-redis and --kv-events, HAProxy, subscriber"

# Sessions for A and for B: HAProxy names the replica that answered (GET /health: no KV work).
replica_of() {
  curl -s -o /dev/null -D - -H "X-Session-Id: $1" "http://127.0.0.1:$LB_PORT/health" |
    tr -d '\r' | sed -n 's/^[Xx]-[Kk]vserve-[Rr]eplica: //p'
}
SA='' SB=''
for i in $(seq 1 64); do
  case $(replica_of "doc-$i") in
    kvserve1) [ -z "$SA" ] && SA=doc-$i ;;
    kvserve2) [ -z "$SB" ] && SB=doc-$i ;;
  esac
  [ -n "$SA" ] && [ -n "$SB" ] && break
done
[ -n "$SA" ] && [ -n "$SB" ] && pass "session $SA lands on A, $SB on B" ||
  { fail "no session for each replica (A: '$SA', B: '$SB')"; exit 1; }

# post SESSION BODY OUT: a completion through HAProxy ('-' for no session); the reply in OUT,
# prints "HTTP-STATUS REPLICA".
post() {
  local h=()
  [ "$1" != - ] && h=(-H "X-Session-Id: $1")
  local code
  code=$(curl -s --max-time 60 -o "$3" -D "$3.head" -w '%{http_code}' "${h[@]}" \
    -H 'Content-Type: application/json' "http://127.0.0.1:$LB_PORT/v1/completions" --data-binary "$2")
  echo "$code $(tr -d '\r' <"$3.head" | sed -n 's/^[Xx]-[Kk]vserve-[Rr]eplica: //p')"
}

# --- A computes a long prompt, B loads it from Redis -------------------------------------------
# Story text, repeated: 2,010 tokens of stories260K's vocabulary (attention makes a prefill
# cost the square of its length: keep it just over 2,000).
"$PY" - "$TMP" <<'PY'
import json, sys
tmp = sys.argv[1]
story = ("Once upon a time there was a little girl named Lily. She loved to play in the park "
         "with her dog Max. One day they found a big red ball under a tree. ")
more = ("Tom and his mom went to the store to buy some milk and bread. On the way home they "
        "saw a cat sitting on a wall in the sun. ")
prompt = "".join(story if i % 2 == 0 else more for i in range(39))
json.dump(prompt, open(f"{tmp}/prompt.json", "w"))
# The same first half, then text of its own: shares a prefix with the prompt, then leaves it.
json.dump(prompt[: len(prompt) // 2] + "The sky turned purple and a dragon sang to the moon. " * 8,
          open(f"{tmp}/fork.json", "w"))
PY
P=$(cat "$TMP/prompt.json")
BODY="{\"prompt\": $P, \"max_tokens\": 16, \"temperature\": 0, \"return_token_ids\": true}"
read -r code replica < <(post "$SA" "$BODY" "$TMP/a.json")
N=$(jf "$TMP/a.json" 'j["usage"]["prompt_tokens"]')
[ "$code" = 200 ] && [ "$replica" = kvserve1 ] && [ "${N:-0}" -ge 2000 ] &&
  [ "$(jf "$TMP/a.json" 'j["usage"]["prompt_tokens_details"]["cached_tokens"]')" = 0 ] &&
  pass "A computed the $N-token prompt (HTTP 200 from kvserve1, nothing cached)" ||
  { fail "A: HTTP $code from '$replica', $(head -c 300 "$TMP/a.json")"; exit 1; }
BS=16  # kvserve's default --block-size; /v1/kv/lookup says so below
written() { [ "$(metric "$R1_PORT" kv_redis_blocks_written_total)" -ge $((N / BS)) ] &&
  [ "$(rcli dbsize)" -ge $((N / BS)) ]; }
poll 20 written && pass "A's $((N / BS)) prompt blocks are in Redis (A wrote $(metric "$R1_PORT" kv_redis_blocks_written_total), dbsize $(rcli dbsize))" ||
  fail "A's blocks not in Redis: A wrote $(metric "$R1_PORT" kv_redis_blocks_written_total), dbsize $(rcli dbsize)"
read -r code replica < <(post "$SB" "$BODY" "$TMP/b.json")
cached=$(jf "$TMP/b.json" 'j["usage"]["prompt_tokens_details"]["cached_tokens"]')
from_redis=$(jf "$TMP/b.json" 'j["usage"]["prompt_tokens_details"].get("redis_tokens", "absent")')
[ "$code" = 200 ] && [ "$replica" = kvserve2 ] && [ "${cached:-0}" -ge 1900 ] &&
  [ "$from_redis" = "$cached" ] &&
  pass "B served it from Redis: cached_tokens $cached, redis_tokens $from_redis (HTTP 200 from kvserve2)" ||
  fail "B: HTTP $code from '$replica', cached_tokens $cached, redis_tokens $from_redis"
same=$(jf "$TMP/a.json" 'repr((j["choices"][0]["text"], j["choices"][0]["token_ids"]))')
[ -n "$same" ] && [ "$same" = "$(jf "$TMP/b.json" 'repr((j["choices"][0]["text"], j["choices"][0]["token_ids"]))')" ] &&
  pass "B's greedy text and token ids are A's ($(jf "$TMP/a.json" 'len(j["choices"][0]["token_ids"])') tokens)" ||
  fail "B's output differs: A $same, B $(jf "$TMP/b.json" 'repr((j["choices"][0]["text"], j["choices"][0]["token_ids"]))')"

# --- The subscriber's indexes against /v1/kv/lookup --------------------------------------------
# Each replica computed (A) or loaded and computed (B) the prompt and all but the last of its 16
# output tokens: the full blocks of those tokens are what it holds.
C=$(jf "$TMP/a.json" 'j["usage"]["completion_tokens"]')
HELD=$(((N + C - 1) / BS))
# indexed NAME: the blocks the subscriber's lines so far put in replica NAME's index.
indexed() {
  "$PY" - "$TMP/events" "$1" <<'PY'
import json, sys
index = set()
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("replica") != sys.argv[2] or "events" not in m:
        continue
    for e in m["events"]:
        if e["type"] == "BlockStored": index.update(e["block_hashes"])
        elif e["type"] == "BlockRemoved": index.difference_update(e["block_hashes"])
        else: index.clear()
print(len(index))
PY
}
caught_up() { [ "$(indexed a)" -ge "$HELD" ] && [ "$(indexed b)" -ge "$HELD" ]; }
poll 20 caught_up || fail "the subscriber saw $(indexed a) blocks of A, $(indexed b) of B; want $HELD each"
kill -INT "$SUB"
stopped() { ! kill -0 "$SUB" 2>/dev/null; }
poll 10 stopped && wait "$SUB" && reaped "$SUB" && tail -1 "$TMP/events" | grep -q '^{"summary"' &&
  pass "the subscriber stopped on SIGINT and printed its summary" ||
  fail "the subscriber: no summary ($(tail -c 300 "$TMP/events") $(tail -3 "$TMP/events.err"))"
tail -1 "$TMP/events" >"$TMP/summary.json"
lookup() {  # PORT BODY OUT
  curl -s -o "$3" -w '%{http_code}' "http://127.0.0.1:$1/v1/kv/lookup" \
    -H 'Content-Type: application/json' --data-binary "$2"
}
for port in "$R1_PORT" "$R2_PORT"; do
  [ "$(lookup "$port" "{\"prompt\": $P}" "$TMP/lookup-$port.json")" = 200 ] &&
    [ "$(lookup "$port" "{\"prompt\": $(cat "$TMP/fork.json")}" "$TMP/fork-$port.json")" = 200 ] ||
    fail "POST /v1/kv/lookup on $port: $(cat "$TMP/lookup-$port.json" "$TMP/fork-$port.json")"
done
rcli --scan --pattern 'kvserve:*' >"$TMP/keys"
"$PY" - "$TMP" "$R1_PORT" "$R2_PORT" "$N" "$BS" "$HELD" <<'PY' >"$TMP/checks"
import json, re, sys
tmp, ports, n, bs, held = sys.argv[1], {"a": sys.argv[2], "b": sys.argv[3]}, *map(int, sys.argv[4:])
def check(ok, what):
    print(("ok   - " if ok else "FAIL - ") + what)
summary = json.load(open(f"{tmp}/summary.json"))["summary"]
keys = set(open(f"{tmp}/keys").read().split())
hexes = re.compile(r"[0-9a-f]{32}$")
sets = {}
for name, port in ports.items():
    s = summary[name]
    got = set(s["blocks"])
    sets[name] = got
    look = json.load(open(f"{tmp}/lookup-{port}.json"))
    fork = json.load(open(f"{tmp}/fork-{port}.json"))
    hashes = look["block_hashes"]
    check(s["complete"] and s["lost"] == 0 and s["decode_errors"] == 0 and s["last_seq"] >= 1,
          f"{name}: the subscriber's summary is complete (seqs 0-{s['last_seq']}, "
          f"{s['live']} live, {s['replayed']} replayed, {s['lost']} lost)")
    check(look["prompt_tokens"] == n and look["block_size"] == bs and len(hashes) == n // bs
          and look["ram_tokens"] == n // bs * bs,
          f"{name}: lookup holds the prompt's {len(hashes)} full blocks in RAM "
          f"(prompt_tokens {look['prompt_tokens']}, block_size {look['block_size']}, "
          f"ram_tokens {look['ram_tokens']})")
    check(all(hexes.match(h) for h in hashes) and all(hexes.match(h) for h in got),
          f"{name}: lookup and the subscriber both spell hashes as 32 lowercase hex digits")
    k = look["ram_tokens"] // bs
    check(set(hashes[:k]) <= got, f"{name}: lookup's {k} RAM blocks are all in the subscriber's index")
    # The fork shares the prompt's first half: lookup and the index both stop where it leaves.
    fh, fk = fork["block_hashes"], fork["ram_tokens"] // bs
    check(0 < fk < len(fh) and fh[:fk] == hashes[:fk] and set(fh[:fk]) <= got and fh[fk] not in got
          and not (set(fh[fk:]) & got),
          f"{name}: a prompt sharing the first {fk} of its {len(fh)} blocks: lookup's ram_tokens "
          f"{fork['ram_tokens']}, its next block is not in the index, nor any after it")
    check(len(got) == held and len(got - set(hashes)) == held - n // bs,
          f"{name}: the index holds {len(got)} blocks, the {n // bs} of the prompt and "
          f"{len(got - set(hashes))} of prompt + output tokens (want {held})")
check(sets["a"] == sets["b"], "A and B hold the same block hashes")
a_hashes = json.load(open(f"{tmp}/lookup-{ports['a']}.json"))["block_hashes"]
check(all(f"kvserve:{{{h}}}" in keys for h in a_hashes),
      f"Redis has a key kvserve:{{HASH}} for each of the prompt's {len(a_hashes)} lookup hashes "
      f"({len(keys)} keys)")
PY
cat "$TMP/checks"
failures=$((failures + $(grep -c '^FAIL' "$TMP/checks")))
[ -s "$TMP/checks" ] || fail "the index checks did not run"

# --- Redis killed while requests run ---------------------------------------------------------
# 8 prompts of their own, 4 sent before the kill and 4 right after it, without a session (least
# connections spreads them), all ignore_eos. The first 4 generate 3,000 tokens each: stories260K
# decodes 4 sequences in ~0.4 ms a step here, so they run for a second or more after their first
# blocks reach Redis, while the kill waits only for that (160 tokens each was over before the
# kill on a loaded 2-core CI machine). The 4 after it generate 160 each.
for i in 1 2 3 4 5 6 7 8; do
  M=160; [ "$i" -le 4 ] && M=3000
  "$PY" -c '
import json, sys
i = int(sys.argv[1])
text = " ".join(f"Story {i} part {k}: the {w} went to the {p} and found a {t}." for k, (w, p, t) in
                enumerate([("cat", "river", "fish"), ("boy", "hill", "kite"), ("girl", "barn", "horse"),
                           ("bird", "garden", "worm"), ("dog", "beach", "shell")] * (1 + i % 2)))
print(json.dumps({"prompt": text, "max_tokens": int(sys.argv[2]), "temperature": 0, "ignore_eos": True}))' \
    "$i" "$M" >"$TMP/req$i.json"
done
before=$(rcli dbsize)
RQ=()
send() {  # the request i in the background: status and replica in $TMP/res$i
  post - "$(cat "$TMP/req$1.json")" "$TMP/out$1.json" >"$TMP/res$1.tmp" && mv "$TMP/res$1.tmp" "$TMP/res$1" &
  RQ+=("$!")
}
for i in 1 2 3 4; do send "$i"; done
# As soon as their first blocks are in Redis: redis-cli, quicker than a replica's /metrics.
grown() { [ "$(rcli dbsize)" -gt "$before" ]; }
poll 20 grown || fail "the first requests wrote nothing to Redis"
kill -9 "$REDIS"; wait "$REDIS" 2>/dev/null; reaped "$REDIS"
running=0; for i in 1 2 3 4; do [ -f "$TMP/res$i" ] || running=$((running + 1)); done
for i in 5 6 7 8; do send "$i"; done
for pid in "${RQ[@]}"; do wait "$pid"; done
[ "$running" -gt 0 ] && pass "redis-server killed (SIGKILL) with $running of the first 4 requests still running" ||
  fail "redis-server was killed after the first 4 requests had finished: not mid-run"
bad=0 after_kill=()
for i in 1 2 3 4 5 6 7 8; do
  read -r code replica <"$TMP/res$i" 2>/dev/null || code=none
  [ "$i" -gt 4 ] && after_kill+=("$replica")
  M=160; [ "$i" -le 4 ] && M=3000
  [ "$code" = 200 ] && [ "$(jf "$TMP/out$i.json" 'j["usage"]["completion_tokens"]')" = $M ] &&
    [ -n "$(jf "$TMP/out$i.json" 'j["choices"][0]["text"].strip()')" ] ||
    { bad=$((bad + 1)); echo "# request $i: HTTP $code from '$replica': $(head -c 200 "$TMP/out$i.json")"; }
done
[ $bad = 0 ] && pass "8 of 8 requests returned HTTP 200 with 3000 or 160 tokens across the kill (4 started after it)" ||
  fail "$bad of 8 requests failed across the Redis kill"
# A replica that was sent a request after the kill found Redis gone (at least one was).
[ ${#after_kill[@]} -gt 0 ] || fail "no request reached a replica after the kill"
for r in kvserve1:$R1_PORT kvserve2:$R2_PORT; do
  [[ " ${after_kill[*]} " == *" ${r%%:*} "* ]] || continue
  down() { [ "$(metric "${r#*:}" kv_redis_up)" = 0 ]; }
  poll 10 down && pass "${r%%:*} reports kv_redis_up 0 ($(metric "${r#*:}" kv_redis_errors_total) errors)" ||
    fail "${r%%:*}: kv_redis_up $(metric "${r#*:}" kv_redis_up) with Redis dead"
done

# Back on its port, empty: each replica reconnects at its next request past the backoff.
start_redis
k=0
# up_after_request SESSION PORT: a new small prompt to the replica, then whether it is up again.
up_after_request() {
  k=$((k + 1))
  read -r code _ < <(post "$1" "{\"prompt\": \"Probe $k: the little red hen found some wheat and asked her friends for help.\", \"max_tokens\": 2}" "$TMP/probe.json")
  [ "$code" = 200 ] || { bad=$((bad + 1)); echo "# probe $k: HTTP $code"; }
  [ "$(metric "$2" kv_redis_up)" = 1 ]
}
bad=0
poll 20 up_after_request "$SA" "$R1_PORT" && poll 20 up_after_request "$SB" "$R2_PORT" &&
  pass "redis-server restarted: A and B report kv_redis_up 1 again (after $k requests)" ||
  fail "after the restart: kv_redis_up A $(metric "$R1_PORT" kv_redis_up), B $(metric "$R2_PORT" kv_redis_up)"
[ $bad = 0 ] && pass "all $k requests while they reconnected returned HTTP 200" || fail "$bad of $k requests failed"
# Shared again: a new prompt computed on A is loaded from the new Redis on B.
P2="{\"prompt\": \"$(printf 'After the storm the children built a tall sandcastle by the sea. %.0s' $(seq 1 12))\", \"max_tokens\": 8, \"temperature\": 0}"
read -r code replica < <(post "$SA" "$P2" "$TMP/a2.json")
N2=$(jf "$TMP/a2.json" 'j["usage"]["prompt_tokens"]')
lookup "$R1_PORT" "$P2" "$TMP/lookup2.json" >/dev/null
mapfile -t KEYS2 < <(jf "$TMP/lookup2.json" '"\n".join("kvserve:{%s}" % h for h in j["block_hashes"])')
written2() { [ "$(rcli exists "${KEYS2[@]}")" = $((${N2:-0} / BS)) ]; }
[ "$code" = 200 ] && [ "$replica" = kvserve1 ] && [ ${#KEYS2[@]} = $((${N2:-0} / BS)) ] && poll 20 written2 &&
  pass "a new $N2-token prompt on A: HTTP 200, its ${#KEYS2[@]} blocks in the restarted Redis" ||
  fail "a new prompt on A: HTTP $code from '$replica', $(rcli exists "${KEYS2[@]}") of its ${#KEYS2[@]} blocks in Redis"
read -r code replica < <(post "$SB" "$P2" "$TMP/b2.json")
from_redis=$(jf "$TMP/b2.json" 'j["usage"]["prompt_tokens_details"]["redis_tokens"]')
[ "$code" = 200 ] && [ "$replica" = kvserve2 ] && [ "${from_redis:-0}" -gt 0 ] &&
  [ "$(jf "$TMP/a2.json" 'j["choices"][0]["text"]')" = "$(jf "$TMP/b2.json" 'j["choices"][0]["text"]')" ] &&
  pass "and B loads it from there: redis_tokens $from_redis, A's text" ||
  fail "the same prompt on B: HTTP $code from '$replica', $(head -c 300 "$TMP/b2.json")"
exit $failures
