// A scripted KV event publisher (a stand-in for a kvserve replica) for
// tests/kv_events_subscriber_test.py, which checks that tools/kv_events_subscriber.py rebuilds
// exactly the block index this program computes.
//
//   kv_events_publish --replica N [--endpoint E] [--replay-endpoint R] [--topic T]
//
// Protocol, one JSON object per stdout line:
//   1. publishes phase 1 of replica N's script (before any subscriber can be there: it has to
//      replay it), then prints {"ready": true, "endpoint": ..., "replay_endpoint": ...};
//   2. publishes a heartbeat batch every 20 ms (a BlockStored of one block, the same each time, so
//      that repeats leave the index as it is) until it reads a line "go" on stdin: a subscriber
//      that has seen a heartbeat is connected, and phase 2 reaches it live;
//   3. publishes phase 2 at once (it clears everything midway and ends by storing the heartbeat
//      block), then prints {"done": true, "last_seq": ..., "blocks": [hex...], "stats": {...}}:
//      the index a subscriber must hold once it has every seq up to last_seq;
//   4. goes on with heartbeats until stdin closes (or 120 s pass), then exits 0.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "kv/block_store.h"
#include "kv/kv_events.h"
#include "kv/zmq_event_publisher.h"

namespace kvs {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int kPhase1Batches = 30;
constexpr int kPhase2Batches = 40;
constexpr int kClearAt = 10;  // phase 2's batch that clears every block
constexpr int kHeartbeatMs = 20;
constexpr auto kLifetime = std::chrono::seconds(120);  // never outlives a test that died

struct Script {
  std::vector<std::vector<KvEvent>> phase1, phase2;
  std::vector<KvEvent> heartbeat;
  std::set<std::string> blocks;  // hex of the blocks stored at the end of phase 2
};

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Chains of stored blocks, removals of blocks stored before, a clear: what a pool does, with
// hashes that differ per replica.
Script MakeScript(int replica) {
  Script s;
  uint64_t rng = 0x1234567ull + static_cast<uint64_t>(replica) * 1000003ull;
  std::vector<BlockHash> live;  // stored and not removed, oldest first
  std::set<std::string> index;
  auto apply = [&](const std::vector<KvEvent>& events) {
    for (const KvEvent& e : events) {
      if (const auto* st = std::get_if<KvBlockStored>(&e)) {
        for (const BlockHash& h : st->hashes) index.insert(BlockHashHex(h));
      } else if (const auto* rm = std::get_if<KvBlockRemoved>(&e)) {
        for (const BlockHash& h : rm->hashes) index.erase(BlockHashHex(h));
      } else {
        index.clear();
      }
    }
  };
  auto stored = [&](int n_blocks, std::optional<BlockHash> parent) {
    KvBlockStored e;
    e.parent = parent;
    e.block_size = kBlockSize;
    e.medium = kKvMediumCpu;
    for (int b = 0; b < n_blocks; ++b) {
      e.hashes.push_back(BlockHash{SplitMix64(rng), SplitMix64(rng)});
      for (int t = 0; t < kBlockSize; ++t) {
        e.token_ids.push_back(static_cast<int32_t>(SplitMix64(rng) % 32000));
      }
    }
    return e;
  };
  auto make_batch = [&]() {
    std::vector<KvEvent> events;
    const uint64_t kind = SplitMix64(rng) % 10;
    if (kind < 7 || live.empty()) {
      std::optional<BlockHash> parent;
      if (!live.empty() && SplitMix64(rng) % 2 == 0) parent = live.back();
      KvBlockStored e = stored(1 + static_cast<int>(SplitMix64(rng) % 3), parent);
      live.insert(live.end(), e.hashes.begin(), e.hashes.end());
      events.push_back(std::move(e));
    }
    if (kind >= 5 && !live.empty()) {
      KvBlockRemoved r;
      r.medium = kKvMediumCpu;
      const int n = 1 + static_cast<int>(SplitMix64(rng) % 2);
      for (int i = 0; i < n && !live.empty(); ++i) {
        const size_t at = SplitMix64(rng) % live.size();
        r.hashes.push_back(live[at]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(at));
      }
      events.push_back(std::move(r));
    }
    return events;
  };
  for (int i = 0; i < kPhase1Batches; ++i) {
    s.phase1.push_back(make_batch());
    apply(s.phase1.back());
  }
  for (int i = 0; i < kPhase2Batches; ++i) {
    if (i == kClearAt) {
      s.phase2.push_back({KvAllBlocksCleared{}});
      live.clear();
    } else {
      s.phase2.push_back(make_batch());
    }
    apply(s.phase2.back());
  }
  KvBlockStored beat;
  beat.hashes = {BlockHash{0xbeefull, static_cast<uint64_t>(replica) + 1}};
  beat.token_ids = {1, 2, 3, 4};
  beat.block_size = kBlockSize;
  beat.medium = kKvMediumCpu;
  s.heartbeat = {beat};
  s.phase2.push_back(s.heartbeat);
  apply(s.heartbeat);
  s.blocks = std::move(index);
  return s;
}

void PrintLine(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// Waits up to timeout_ms for stdin. 1: a line "go" arrived; 0: nothing (or other text);
// -1: stdin closed.
int ReadStdin(int timeout_ms, std::string& pending) {
  pollfd p{0, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return 0;
  char buf[256];
  const ssize_t n = ::read(0, buf, sizeof(buf));
  if (n <= 0) return -1;
  pending.append(buf, static_cast<size_t>(n));
  for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
    const std::string line = pending.substr(0, nl);
    pending.erase(0, nl + 1);
    if (line == "go") return 1;
  }
  return 0;
}

int Main(int argc, char** argv) {
  ZmqKvEventPublisherConfig config;
  config.endpoint = "tcp://127.0.0.1:*";
  config.replay_endpoint = "tcp://127.0.0.1:*";
  int replica = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--replica") {
      replica = std::atoi(value.c_str());
    } else if (flag == "--endpoint") {
      config.endpoint = value;
    } else if (flag == "--replay-endpoint") {
      config.replay_endpoint = value;
    } else if (flag == "--topic") {
      config.topic = value;
    } else {
      std::fprintf(stderr, "kv_events_publish: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  auto pub = ZmqKvEventPublisher::Open(config);
  if (!pub.ok()) {
    std::fprintf(stderr, "kv_events_publish: %s\n", pub.error().c_str());
    return 1;
  }
  const Script script = MakeScript(replica);
  const auto deadline = std::chrono::steady_clock::now() + kLifetime;
  auto alive = [&] { return std::chrono::steady_clock::now() < deadline; };

  for (const auto& batch : script.phase1) (*pub)->Publish(batch);
  (*pub)->Flush(-1);
  PrintLine({{"ready", true},
             {"endpoint", (*pub)->endpoint()},
             {"replay_endpoint", (*pub)->replay_endpoint()}});

  std::string pending;
  int got = 0;
  while (alive() && (got = ReadStdin(kHeartbeatMs, pending)) == 0)
    (*pub)->Publish(script.heartbeat);
  if (got != 1) return got < 0 ? 0 : 1;

  for (const auto& batch : script.phase2) (*pub)->Publish(batch);
  (*pub)->Flush(-1);
  const ZmqKvEventPublisherStats st = (*pub)->stats();
  PrintLine({{"done", true},
             {"last_seq", st.next_seq - 1},
             {"blocks", script.blocks},
             {"stats",
              {{"batches_published", st.batches_published},
               {"batches_dropped", st.batches_dropped},
               {"replay_requests", st.replay_requests},
               {"bad_replay_requests", st.bad_replay_requests}}}});

  while (alive() && ReadStdin(kHeartbeatMs, pending) >= 0) (*pub)->Publish(script.heartbeat);
  return 0;
}

}  // namespace
}  // namespace kvs

int main(int argc, char** argv) {
  return kvs::Main(argc, argv);
}
