"""tools/kv_events_subscriber.py against two scripted publishers (tests/kv_events_publish_main.cc,
the C++ ZmqKvEventPublisher): the block index it rebuilds for each replica is exactly the one the
publisher computed, with the first batches recovered by replay (sent before it connected) and the
live ones it discards on purpose (--drop-live-every) recovered by gap detection and replay.

Run by kv_events_subscriber_test.sh, which picks a Python with zmq and msgpack. Every wait has a
deadline; nothing sleeps.
"""

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

PUBLISH_BIN = os.environ["KVEVENTS_PUBLISH_BIN"]
TOOL = os.environ["KVEVENTS_SUBSCRIBER"]
DEADLINE = time.monotonic() + 90
REPLICAS = ["a", "b"]


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    raise SystemExit(1)


class Proc:
    """A child process whose stdout lines are read by a thread into a queue."""

    def __init__(self, argv, stdin=None):
        self.argv = argv
        self.p = subprocess.Popen(argv, stdin=stdin, stdout=subprocess.PIPE, text=True)
        self.lines = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_json(self, until=None):
        """The next JSON line, or None at EOF; fails at the test's deadline."""
        remaining = (until or DEADLINE) - time.monotonic()
        if remaining <= 0:
            fail(f"timed out waiting for {os.path.basename(self.argv[0])}; last lines: "
                 f"{self.seen[-5:]}")
        try:
            line = self.lines.get(timeout=remaining)
        except queue.Empty:
            return self.next_json(until)
        if line is None:
            return None
        self.seen.append(line.strip())
        try:
            return json.loads(line)
        except ValueError:
            fail(f"not JSON: {line!r}")


def main():
    procs = []
    try:
        pubs = []
        for i, name in enumerate(REPLICAS):
            pub = Proc([PUBLISH_BIN, "--replica", str(i), "--topic", f"kv@{name}@test"],
                       stdin=subprocess.PIPE)
            procs.append(pub)
            pubs.append(pub)
        ready = []
        for pub in pubs:
            line = pub.next_json()
            if not line or not line.get("ready"):
                fail(f"publisher not ready: {line}")
            ready.append(line)

        cmd = [sys.executable, TOOL, "--topic", "kv@", "--summary", "--drop-live-every", "7",
               "--idle-replay", "0.5"]
        for name, r in zip(REPLICAS, ready):
            cmd += ["-r", f"{name}={r['endpoint']},{r['replay_endpoint']}"]
        sub = Proc(cmd)
        procs.append(sub)

        # A live batch from a replica means its subscription is in place: phase 2 is sent then.
        went = set()
        applied = {name: -1 for name in REPLICAS}
        last_seq = {}
        expected = {}
        while True:
            line = sub.next_json()
            if line is None:
                fail("the subscriber exited early")
            name = line.get("replica")
            if "error" in line:
                fail(f"subscriber error: {line}")
            if "seq" in line:
                applied[name] = line["seq"]
                if line["source"] == "live" and name not in went:
                    went.add(name)
                    pub = pubs[REPLICAS.index(name)]
                    pub.p.stdin.write("go\n")
                    pub.p.stdin.flush()
                    done = pub.next_json()
                    if not done or not done.get("done"):
                        fail(f"publisher {name} did not finish phase 2: {done}")
                    if done["stats"]["batches_dropped"] != 0:
                        fail(f"publisher {name} dropped batches: {done}")
                    last_seq[name] = done["last_seq"]
                    expected[name] = set(done["blocks"])
            if len(last_seq) == len(REPLICAS) and all(
                    applied[n] >= last_seq[n] for n in REPLICAS):
                break

        sub.p.send_signal(signal.SIGINT)
        summary = None
        while (line := sub.next_json()) is not None:
            if "summary" in line:
                summary = line["summary"]
        if sub.p.wait(timeout=max(1, DEADLINE - time.monotonic())) != 0:
            fail(f"subscriber exit status {sub.p.returncode}")
        if summary is None:
            fail("no summary")

        for name in REPLICAS:
            s = summary[name]
            got = set(s["blocks"])
            if got != expected[name]:
                fail(f"replica {name}: index differs: missing {sorted(expected[name] - got)}, "
                     f"extra {sorted(got - expected[name])}")
            if not s["complete"] or s["lost"] != 0:
                fail(f"replica {name}: incomplete: {s}")
            # Phase 1 went out before the subscriber connected: only a replay can bring it.
            if s["replayed"] < 30:
                fail(f"replica {name}: phase 1 not replayed: {s}")
            print(f"replica {name}: {len(got)} blocks match; last_seq {s['last_seq']}, "
                  f"live {s['live']}, replayed {s['replayed']}, gaps {s['gaps']}, "
                  f"simulated drops {s['simulated_drops']}", flush=True)
        if sum(summary[n]["simulated_drops"] for n in REPLICAS) == 0:
            fail("no live message was dropped: the gap path went untested")
        if sum(summary[n]["gaps"] for n in REPLICAS) == 0:
            fail("no gap was detected and replayed")

        for pub in pubs:
            pub.p.stdin.close()
            if pub.p.wait(timeout=max(1, DEADLINE - time.monotonic())) != 0:
                fail(f"publisher exit status {pub.p.returncode}")
        print("PASS", flush=True)
    finally:
        for proc in procs:
            if proc.p.poll() is None:
                proc.p.kill()
                proc.p.wait()


if __name__ == "__main__":
    main()
