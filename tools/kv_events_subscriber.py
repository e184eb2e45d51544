#!/usr/bin/env python3
"""Subscribes to the KV cache events of one or more kvserve replicas (or vLLM servers) and keeps
each replica's block index: the hashes stored minus the hashes removed, emptied on
AllBlocksCleared. This is what a KV-aware router does with the stream (issue #22), small enough to
read, and what the tests use to check a server's events against its own view of its cache.

    kv_events_subscriber.py -r a=tcp://127.0.0.1:5557,tcp://127.0.0.1:5558 \\
                            -r b=tcp://127.0.0.1:6557,tcp://127.0.0.1:6558 --duration 10 --summary

A replica is [NAME=]PUB_ENDPOINT[,REPLAY_ENDPOINT]. Output is JSON, one object a line:
  {"replica", "seq", "source": "live"|"replay", "ts", "dp_rank", "events": [...]}  per batch
  (not with --quiet); {"replica", "gap": [first, last], ...} when seqs are missing;
  {"replica", "error": ...} on a malformed message or a replay that fails;
  {"summary": {NAME: {"blocks": [sorted hashes], "last_seq", "complete", counters...}}} at exit
  with --summary ("complete": every seq from 0 to last_seq was applied, none lost).
Hashes print as hex of their bytes (kvserve's 16 bytes read as BlockHashHex) or, for the
integer hashes of older vLLM versions, as decimal.

The wire format (kvserve's src/kv/kv_events.h describes it): a PUB socket sends [topic, seq as 8
bytes big-endian, msgpack batch]; a ROUTER replay socket answers a start seq with the buffered
batches from it, then an end marker whose seq is -1. Batches and events are read in the array
form kvserve and vLLM's example use and in the tagged-map form of recent vLLM releases.

Gaps: a seq past the next expected one (a slow subscriber past the publisher's high-water mark,
or batches sent before it joined) is filled from the replay socket; what the replay no longer
has is counted as lost. At start the subscriber replays from seq 0 (a server that went idle
before it joined would otherwise never show it a gap), and a replica quiet for --idle-replay
seconds is asked for anything past its last seq (a lost last batch shows no gap either). The
replay client is a DEALER socket: a REQ socket, as in vLLM's example, takes only the first answer.

Not handled: a replica that restarts numbers its batches from 0 again; restart the subscriber.

Needs python3-zmq and python3-msgpack (Debian); the standard library otherwise.
"""

import argparse
import json
import signal
import sys
import time

try:
    import msgpack
    import zmq
except ImportError as e:  # pragma: no cover - depends on the machine
    sys.stderr.write(f"kv_events_subscriber: {e}: install python3-zmq and python3-msgpack "
                     "(Debian) or pyzmq and msgpack (pip)\n")
    sys.exit(3)

END_SEQ = -1
FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def hash_text(h):
    if isinstance(h, (bytes, bytearray)):
        return bytes(h).hex()
    if isinstance(h, int):
        return str(h)
    raise ValueError(f"a block hash of type {type(h).__name__}")


def decode_event(raw):
    """One event as a dict with its vLLM field names, from either wire form."""
    if isinstance(raw, (list, tuple)):
        if not raw or raw[0] not in FIELDS:
            raise ValueError(f"unknown event {raw[:1]!r}")
        tag, values = raw[0], raw[1:]
        event = {"type": tag}
        event.update(zip(FIELDS[tag], values))
    elif isinstance(raw, dict):
        tag = raw.get("type")
        if tag not in FIELDS:
            raise ValueError(f"unknown event type {tag!r}")
        event = dict(raw)
    else:
        raise ValueError(f"an event of type {type(raw).__name__}")
    if tag != "AllBlocksCleared":
        if not isinstance(event.get("block_hashes"), (list, tuple)):
            raise ValueError(f"{tag} without block_hashes")
        event["block_hashes"] = [hash_text(h) for h in event["block_hashes"]]
    if tag == "BlockStored" and event.get("parent_block_hash") is not None:
        event["parent_block_hash"] = hash_text(event["parent_block_hash"])
    return event


def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False)
    if isinstance(batch, dict):
        ts, events, rank = batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank")
    elif isinstance(batch, (list, tuple)) and len(batch) >= 2:
        ts, events = batch[0], batch[1]
        rank = batch[2] if len(batch) > 2 else None
    else:
        raise ValueError("a batch is neither [ts, events, rank] nor a map")
    if not isinstance(events, (list, tuple)):
        raise ValueError("a batch's events are not an array")
    return ts, [decode_event(e) for e in events], rank


class Replica:
    def __init__(self, spec, ctx, topic):
        name, eq, rest = spec.partition("=")
        if not eq:
            name, rest = None, spec
        pub, _, replay = rest.partition(",")
        self.name = name or pub
        self.pub_endpoint = pub
        self.replay_endpoint = replay or None
        self.ctx = ctx
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        try:
            self.sub.connect(pub)
        except zmq.ZMQError as e:
            raise SystemExit(f"kv_events_subscriber: cannot connect to {pub!r}: {e}")
        self.dealer = None
        self.index = set()
        self.last_seq = -1
        self.last_activity = time.monotonic()
        self.counts = {"batches": 0, "live": 0, "replayed": 0, "duplicates": 0, "gaps": 0,
                       "lost": 0, "decode_errors": 0, "malformed": 0, "simulated_drops": 0,
                       "replay_failures": 0}

    def summary(self):
        out = {"pub": self.pub_endpoint, "replay": self.replay_endpoint,
               "blocks": sorted(self.index), "num_blocks": len(self.index),
               "last_seq": self.last_seq,
               "complete": self.last_seq >= 0 and self.counts["lost"] == 0
               and self.counts["decode_errors"] == 0}
        out.update(self.counts)
        return out


class Subscriber:
    def __init__(self, args):
        self.args = args
        self.ctx = zmq.Context()
        self.replicas = [Replica(spec, self.ctx, args.topic) for spec in args.replica]
        self.poller = zmq.Poller()
        for r in self.replicas:
            self.poller.register(r.sub, zmq.POLLIN)
        self.live_received = 0
        self.stop = False

    def emit(self, obj):
        # Fields this tool does not interpret (vLLM's extra_keys, say) may hold bytes.
        print(json.dumps(obj, default=lambda o: o.hex() if isinstance(o, (bytes, bytearray))
                         else repr(o)), flush=True)

    def apply(self, r, seq, payload, source):
        """Applies batch seq (> r.last_seq), counting the seqs skipped before it as lost."""
        if seq > r.last_seq + 1:
            r.counts["lost"] += seq - r.last_seq - 1
            self.emit({"replica": r.name, "gap": [r.last_seq + 1, seq - 1], "recovered": False})
        r.last_seq = seq
        r.counts["batches"] += 1
        r.counts["live" if source == "live" else "replayed"] += 1
        try:
            ts, events, rank = decode_batch(payload)
        except Exception as e:  # a malformed batch costs its own events only
            r.counts["decode_errors"] += 1
            self.emit({"replica": r.name, "seq": seq, "error": f"undecodable batch: {e}"})
            return
        for ev in events:
            if ev["type"] == "BlockStored":
                r.index.update(ev["block_hashes"])
            elif ev["type"] == "BlockRemoved":
                r.index.difference_update(ev["block_hashes"])
            else:
                r.index.clear()
        if not self.args.quiet:
            self.emit({"replica": r.name, "seq": seq, "source": source, "ts": ts,
                       "dp_rank": rank, "events": events})

    def replay(self, r, start):
        """Asks r's replay socket for every batch from start and applies the new ones."""
        if r.replay_endpoint is None:
            return
        if r.dealer is None:
            r.dealer = self.ctx.socket(zmq.DEALER)
            r.dealer.setsockopt(zmq.LINGER, 0)
            try:
                r.dealer.connect(r.replay_endpoint)
            except zmq.ZMQError as e:
                raise SystemExit(f"kv_events_subscriber: cannot connect to "
                                 f"{r.replay_endpoint!r}: {e}")
        r.dealer.send_multipart([b"", start.to_bytes(8, "big")])
        timeout_ms = int(self.args.replay_timeout * 1000)
        while True:
            if not r.dealer.poll(timeout_ms):
                # The answers may still come: a new socket keeps them from being read as the
                # answer to the next request.
                r.counts["replay_failures"] += 1
                self.emit({"replica": r.name, "error": f"replay from {start} timed out"})
                r.dealer.close()
                r.dealer = None
                return
            frames = r.dealer.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) != 2 or len(frames[0]) != 8:
                r.counts["malformed"] += 1
                continue
            seq = int.from_bytes(frames[0], "big", signed=True)
            if seq == END_SEQ:
                break
            if seq > r.last_seq:
                self.apply(r, seq, frames[1], "replay")
        r.last_activity = time.monotonic()

    def on_live(self, r, frames):
        r.last_activity = time.monotonic()
        if len(frames) != 3 or len(frames[1]) != 8:
            r.counts["malformed"] += 1
            self.emit({"replica": r.name, "error": f"a message of {len(frames)} frames"})
            return
        self.live_received += 1
        if self.args.drop_live_every and self.live_received % self.args.drop_live_every == 0:
            r.counts["simulated_drops"] += 1  # tests: as if ZeroMQ had dropped it
            return
        seq = int.from_bytes(frames[1], "big")
        if seq <= r.last_seq:
            r.counts["duplicates"] += 1  # already applied from a replay
            return
        if seq > r.last_seq + 1 and r.replay_endpoint is not None:
            r.counts["gaps"] += 1
            self.emit({"replica": r.name, "gap": [r.last_seq + 1, seq - 1], "recovered": True})
            self.replay(r, r.last_seq + 1)
            if seq <= r.last_seq:
                return  # the replay brought it too
        self.apply(r, seq, frames[2], "live")

    def run(self):
        if not self.args.no_initial_replay:
            for r in self.replicas:
                self.replay(r, 0)
        deadline = None if self.args.duration is None else time.monotonic() + self.args.duration
        while not self.stop:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                break
            wait_s = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
            ready = dict(self.poller.poll(int(wait_s * 1000)))
            for r in self.replicas:
                if r.sub in ready:
                    self.on_live(r, r.sub.recv_multipart())
                elif (self.args.idle_replay > 0 and r.replay_endpoint is not None
                      and time.monotonic() - r.last_activity >= self.args.idle_replay):
                    self.replay(r, r.last_seq + 1)
        if self.args.summary:
            self.emit({"summary": {r.name: r.summary() for r in self.replicas}})
        self.ctx.destroy(linger=0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-r", "--replica", action="append", required=True,
                   help="[NAME=]PUB_ENDPOINT[,REPLAY_ENDPOINT] (repeat for each replica)")
    p.add_argument("--topic", default="", help="topic prefix to subscribe to (default: all)")
    p.add_argument("--duration", type=float, help="stop after this many seconds (default: never)")
    p.add_argument("--summary", action="store_true", help="print each replica's index at exit")
    p.add_argument("--quiet", action="store_true", help="no line per batch")
    p.add_argument("--no-initial-replay", action="store_true",
                   help="do not ask for the buffered batches at start")
    p.add_argument("--idle-replay", type=float, default=1.0, metavar="S",
                   help="ask a replica quiet for S seconds for newer batches (0: never)")
    p.add_argument("--replay-timeout", type=float, default=2.0, metavar="S",
                   help="wait at most S seconds for each replay answer")
    p.add_argument("--drop-live-every", type=int, default=0, metavar="N",
                   help=argparse.SUPPRESS)  # tests: discard every Nth live message
    args = p.parse_args()

    sub = Subscriber(args)

    def on_signal(signum, frame):
        sub.stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    sub.run()


if __name__ == "__main__":
    main()
