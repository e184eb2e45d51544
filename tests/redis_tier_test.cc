// The shared KV tier in Redis (issue #22), against a redis-server each test starts on a free
// loopback port: the URL, keys with a cluster hash tag, pipelined lookups, TTL, passwords; and
// the faults (Redis down at start, killed and restarted, slowed by DEBUG SLEEP, a value of
// another type or of another block under a key), which cost reuse and never a request. With
// the real stories260K model: a second engine (another replica) loads what the first computed,
// with every greedy token equal to a cold run.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "kv/block_file.h"
#include "kv/redis_block_store.h"
#include "testing/redis_server.h"
#include "testing/temp_dir.h"
#include "testing/test_models.h"

namespace kvs {
namespace {

using Clock = std::chrono::steady_clock;
using testing::RedisServer;

#define REQUIRE_REDIS(server) \
  if (!(server).ok()) GTEST_SKIP() << (server).why()

BlockHash Hash(uint64_t i) {
  return BlockHash{0x1234 + i, 0xabcd0000 + i};
}
std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7);
  return b;
}

std::unique_ptr<RedisBlockStore> OpenStore(const std::string& url, int64_t timeout_ms = 500,
                                           int64_t ttl = 0) {
  RedisStoreConfig c;
  auto endpoint = ParseRedisUrl(url);
  EXPECT_TRUE(endpoint.ok()) << endpoint.error();
  c.endpoint = *endpoint;
  c.timeout_ms = timeout_ms;
  c.ttl_seconds = ttl;
  auto store = RedisBlockStore::Open(c);
  EXPECT_TRUE(store.ok()) << store.error();
  return store.ok() ? std::move(*store) : nullptr;
}

// Polls (with a deadline) until fn holds.
template <typename Fn>
bool Eventually(Fn fn, std::chrono::milliseconds limit = std::chrono::seconds(15)) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (fn()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return fn();
}

// A listening TCP socket on a free loopback port (the fake servers below), its port in *port;
// -1 on failure.
int LoopbackListener(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

TEST(RedisUrl, ParsesWhatRedisUrlAllowsAndNamesWhatIsWrong) {
  auto a = ParseRedisUrl("redis://10.0.0.5:6380/3");
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 3);
  EXPECT_TRUE(a->password.empty());
  auto b = ParseRedisUrl("redis://alice:s3cret@cache");
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->user, "alice");
  EXPECT_EQ(b->password, "s3cret");
  EXPECT_EQ(b->port, 6379);
  EXPECT_EQ(b->Display(), "redis://cache:6379/0");  // never the password
  auto c = ParseRedisUrl("redis://:only@h:1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->user, "");
  EXPECT_EQ(c->password, "only");
  for (const char* bad : {"http://h:1", "redis://h:0", "redis://h:99999", "redis://h:x",
                          "redis://h/db", "redis://:pw@", "rediss://u:topsecret@h:1"}) {
    auto r = ParseRedisUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().find("topsecret"), std::string::npos) << r.error();
    EXPECT_NE(r.error().find("--kv-redis"), std::string::npos) << r.error();
  }
  EXPECT_NE(ParseRedisUrl("rediss://h:1").error().find("TLS"), std::string::npos);
}

TEST(RedisUrl, DecodesPercentEncodedCredentialsAndReadsBracketedIpv6) {
  // A password with '@', ':' and '%' in it, as redis-py and the other REDIS_URL readers take it.
  auto a = ParseRedisUrl("redis://app%3A1:p%40ss%3Aw%25rd@cache:6380/2");
  ASSERT_TRUE(a.ok()) << a.error();
  EXPECT_EQ(a->user, "app:1");
  EXPECT_EQ(a->password, "p@ss:w%rd");
  EXPECT_EQ(a->host, "cache");
  EXPECT_EQ(a->port, 6380);
  auto v6 = ParseRedisUrl("redis://[::1]:7000/1");
  ASSERT_TRUE(v6.ok()) << v6.error();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 7000);
  EXPECT_EQ(v6->Display(), "redis://[::1]:7000/1");
  auto v6_default = ParseRedisUrl("redis://[fe80::2]");
  ASSERT_TRUE(v6_default.ok()) << v6_default.error();
  EXPECT_EQ(v6_default->host, "fe80::2");
  EXPECT_EQ(v6_default->port, 6379);
  for (const char* bad :
       {"redis://u:bad%zzsecret@h:1", "redis://u:secret%4@h", "redis://::1:7000", "redis://[::1",
        "redis://[::1]x", "redis://[::1]:", "redis://h:", "u:secret@h:1", ":secret@h",
        "redis:/u:secret@h", "redis://h:1/0?timeout=1", "redis://u:secret@h/0#x"}) {
    auto r = ParseRedisUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().find("secret"), std::string::npos) << r.error();
  }
}

TEST(RedisBlockStore, RoundTripsInOnePipelineUnderHashTaggedKeys) {
  RedisServer server;
  REQUIRE_REDIS(server);
  auto store = OpenStore(server.url());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->KeyOf(Hash(1)), "kvserve:{" + BlockHashHex(Hash(1)) + "}");
  ASSERT_TRUE(store->Put(Hash(1), Bytes(1000, 1)).ok());
  ASSERT_TRUE(store->Put(Hash(3), Bytes(70000, 3)).ok());
  EXPECT_TRUE(store->Contains(Hash(1)));
  EXPECT_FALSE(store->Contains(Hash(2)));
  const std::vector<BlockHash> ask = {Hash(1), Hash(2), Hash(3)};
  const std::vector<StoredBlock> got = store->GetMany(ask);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].state, StoredBlock::State::kFound);
  EXPECT_EQ(got[0].bytes, Bytes(1000, 1));
  EXPECT_EQ(got[1].state, StoredBlock::State::kAbsent);
  EXPECT_EQ(got[2].state, StoredBlock::State::kFound);
  EXPECT_EQ(got[2].bytes, Bytes(70000, 3));
  // The key is what redis-cli would see.
  redisReply* r = server.Command({"STRLEN", store->KeyOf(Hash(3))});
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->integer, 70000);
  freeReplyObject(r);
  const RedisStoreStats s = store->stats();
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.bytes_written, 71000);
  EXPECT_EQ(s.bytes_read, 71000);
  EXPECT_EQ(s.errors, 0);
  EXPECT_TRUE(s.up);
  store->Erase(Hash(1));
  EXPECT_FALSE(store->Contains(Hash(1)));
  EXPECT_EQ(store->GetMany(ask)[0].state, StoredBlock::State::kAbsent);
}

TEST(RedisBlockStore, EveryKeyGetsTheTtl) {
  RedisServer server;
  REQUIRE_REDIS(server);
  auto store = OpenStore(server.url(), 500, /*ttl=*/120);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(Hash(7), Bytes(10, 7)).ok());
  redisReply* r = server.Command({"TTL", store->KeyOf(Hash(7))});
  ASSERT_NE(r, nullptr);
  EXPECT_GT(r->integer, 100);
  EXPECT_LE(r->integer, 120);
  freeReplyObject(r);
}

TEST(RedisBlockStore, ARefusedPasswordFailsAtOpenAndIsNeverPrinted) {
  RedisServer server({"--requirepass", "right-pw"});
  REQUIRE_REDIS(server);
  RedisStoreConfig c;
  c.endpoint = *ParseRedisUrl("redis://:wrong-pw@127.0.0.1:" + std::to_string(server.port()));
  auto refused = RedisBlockStore::Open(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find("AUTH"), std::string::npos) << refused.error();
  EXPECT_EQ(refused.error().find("wrong-pw"), std::string::npos) << refused.error();
  c.endpoint.password = "right-pw";
  auto store = RedisBlockStore::Open(c);
  ASSERT_TRUE(store.ok()) << store.error();
  EXPECT_TRUE((*store)->Put(Hash(1), Bytes(8, 1)).ok());
  // A password for a Redis that has none is refused too (every AUTH would fail): an error now,
  // not a tier that never comes up.
  RedisServer open_server;
  REQUIRE_REDIS(open_server);
  c.endpoint = *ParseRedisUrl("redis://:some-pw@127.0.0.1:" + std::to_string(open_server.port()));
  auto unexpected = RedisBlockStore::Open(c);
  ASSERT_FALSE(unexpected.ok());
  EXPECT_EQ(unexpected.error().find("some-pw"), std::string::npos) << unexpected.error();
}

TEST(RedisBlockStore, DownAtStartMissesFastThenServesOnceUp) {
  RedisServer server;
  REQUIRE_REDIS(server);
  server.Kill();  // its port stays known: Redis is down when the store opens
  auto store = OpenStore(server.url());
  ASSERT_NE(store, nullptr);  // not an error: Redis may come later
  EXPECT_FALSE(store->stats().up);
  const auto t0 = Clock::now();
  const std::vector<BlockHash> ask = {Hash(1), Hash(2)};
  const auto got = store->GetMany(ask);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(400));  // no connect wait while down
  EXPECT_EQ(got[0].state, StoredBlock::State::kUnavailable);
  EXPECT_EQ(got[1].state, StoredBlock::State::kUnavailable);
  EXPECT_FALSE(store->Put(Hash(1), Bytes(8, 1)).ok());
  ASSERT_TRUE(server.Start());
  // Within the backoff (100 ms, doubling to 5 s) the store connects and serves.
  EXPECT_TRUE(Eventually([&] { return store->Put(Hash(2), Bytes(8, 2)).ok(); }));
  EXPECT_TRUE(store->stats().up);
  EXPECT_GE(store->stats().errors, 1);
  EXPECT_EQ(store->GetMany(ask)[1].state, StoredBlock::State::kFound);
}

TEST(RedisBlockStore, KilledMidRunMissesAndComesBackEmpty) {
  RedisServer server;
  REQUIRE_REDIS(server);
  auto store = OpenStore(server.url());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(Hash(1), Bytes(100, 1)).ok());
  server.Kill();
  const std::vector<BlockHash> ask = {Hash(1)};
  EXPECT_EQ(store->GetMany(ask)[0].state, StoredBlock::State::kUnavailable);
  EXPECT_FALSE(store->Available());  // no lookups held for it until the retry is due
  ASSERT_TRUE(server.Start());       // no persistence: it comes back empty
  EXPECT_TRUE(
      Eventually([&] { return store->GetMany(ask)[0].state == StoredBlock::State::kAbsent; }));
  EXPECT_FALSE(store->Contains(Hash(1)));  // forgotten: it will be written again
  EXPECT_TRUE(store->Available());
  EXPECT_EQ(store->stats().reconnects, 1);
}

TEST(RedisBlockStore, ASlowRedisTimesOutInsteadOfStalling) {
  RedisServer server({"--enable-debug-command", "yes"});  // Redis 7 refuses DEBUG otherwise
  REQUIRE_REDIS(server);
  auto store = OpenStore(server.url(), /*timeout_ms=*/200);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(Hash(1), Bytes(100, 1)).ok());
  std::thread sleeper([&] { freeReplyObject(server.Command({"DEBUG", "SLEEP", "1.5"})); });
  // Until the sleep began, lookups may still succeed; once it has, they time out.
  const std::vector<BlockHash> ask = {Hash(1)};
  bool timed_out = false;
  const auto t_end = Clock::now() + std::chrono::milliseconds(1200);
  while (!timed_out && Clock::now() < t_end) {
    const auto t0 = Clock::now();
    const auto got = store->GetMany(ask);
    if (got[0].state == StoredBlock::State::kUnavailable) {
      timed_out = true;
      EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(700));  // the timeout, not the sleep
    }
  }
  sleeper.join();
  EXPECT_TRUE(timed_out);
  EXPECT_TRUE(
      Eventually([&] { return store->GetMany(ask)[0].state == StoredBlock::State::kFound; }));
}

// A server that answers PING, then trickles a GET's reply a byte at a time: each read returns
// something, so only a deadline on the whole reply ends the wait.
TEST(RedisBlockStore, ATricklingServerTimesOutOnTheWholeReply) {
  int port = 0;
  const int listener = LoopbackListener(&port);
  ASSERT_GE(listener, 0);
  ::listen(listener, 4);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    if (fd < 0) return;
    char buf[4096];
    (void)::read(fd, buf, sizeof buf);  // PING
    (void)::write(fd, "+PONG\r\n", 7);
    (void)::read(fd, buf, sizeof buf);  // the GETs
    (void)::write(fd, "$100000\r\n", 9);
    while (!stop) {
      if (::write(fd, "x", 1) != 1) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the server's pace
    }
    ::close(fd);
  });
  auto store = OpenStore("redis://127.0.0.1:" + std::to_string(port),
                         /*timeout_ms=*/300);
  ASSERT_NE(store, nullptr);
  const std::vector<BlockHash> ask = {Hash(1)};
  const auto t0 = Clock::now();
  EXPECT_EQ(store->GetMany(ask)[0].state, StoredBlock::State::kUnavailable);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_FALSE(store->stats().up);
  stop = true;
  ::shutdown(listener, SHUT_RDWR);
  server.join();
  ::close(listener);
}

TEST(RedisBlockStore, ARedisThatAnswersPingButNotGetsStaysDownInsteadOfFlapping) {
  // Every connection: PING answered at once, the GETs' reply trickled past the timeout.
  int port = 0;
  const int listener = LoopbackListener(&port);
  ASSERT_GE(listener, 0);
  ::listen(listener, 8);
  std::atomic<bool> stop{false};
  std::atomic<int> connections{0};
  std::thread server([&] {
    while (!stop) {
      const int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) return;
      ++connections;
      char buf[4096];
      (void)::read(fd, buf, sizeof buf);  // PING
      (void)::send(fd, "+PONG\r\n", 7, MSG_NOSIGNAL);
      (void)::read(fd, buf, sizeof buf);  // the lookups
      (void)::send(fd, ":100000\r\n$100000\r\n", 19, MSG_NOSIGNAL);
      while (!stop && ::send(fd, "x", 1, MSG_NOSIGNAL) == 1) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the server's pace
      }
      ::close(fd);
    }
  });
  auto store = OpenStore("redis://127.0.0.1:" + std::to_string(port),
                         /*timeout_ms=*/150);
  ASSERT_NE(store, nullptr);
  const std::vector<BlockHash> ask = {Hash(1)};
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(Eventually([&] { return store->Available(); }));  // the backoff passed
    EXPECT_EQ(store->GetMany(ask)[0].state, StoredBlock::State::kUnavailable);
  }
  EXPECT_GE(connections.load(), 3);         // it did reconnect (and PING worked) each time
  EXPECT_EQ(store->stats().reconnects, 0);  // but never counted as up again
  EXPECT_FALSE(store->stats().up);
  stop = true;
  ::shutdown(listener, SHUT_RDWR);
  server.join();
  ::close(listener);
}

TEST(RedisBlockStore, AValueOfAnotherTypeIsUnreadableNotAnOutage) {
  RedisServer server;
  REQUIRE_REDIS(server);
  auto store = OpenStore(server.url());
  ASSERT_NE(store, nullptr);
  freeReplyObject(server.Command({"LPUSH", store->KeyOf(Hash(5)), "x"}));
  const std::vector<BlockHash> ask = {Hash(5)};
  const auto got = store->GetMany(ask);
  EXPECT_EQ(got[0].state, StoredBlock::State::kUnreadable);
  EXPECT_NE(got[0].error.find("WRONGTYPE"), std::string::npos) << got[0].error;
  EXPECT_TRUE(store->stats().up);
  store->Erase(Hash(5));  // what the loader does with it
  EXPECT_EQ(store->GetMany(ask)[0].state, StoredBlock::State::kAbsent);
}

TEST(RedisBlockStore, AValueLargerThanAnyBlockFileIsNeverRead) {
  RedisServer server;
  REQUIRE_REDIS(server);
  RedisStoreConfig c;
  c.endpoint = *ParseRedisUrl(server.url());
  c.max_value_bytes = 4096;
  auto opened = RedisBlockStore::Open(c);
  ASSERT_TRUE(opened.ok()) << opened.error();
  RedisBlockStore& store = **opened;
  const std::string huge(size_t{8} << 20, 'x');  // 8 MiB where a block file is at most 4 KiB
  freeReplyObject(server.Command({"SET", store.KeyOf(Hash(1)), huge}));
  ASSERT_TRUE(store.Put(Hash(2), Bytes(4096, 2)).ok());  // exactly the bound: a block file
  freeReplyObject(server.Command({"SET", store.KeyOf(Hash(3)), ""}));
  const std::vector<BlockHash> ask = {Hash(1), Hash(2), Hash(3), Hash(4)};
  const auto got = store.GetMany(ask);
  EXPECT_EQ(got[0].state, StoredBlock::State::kUnreadable);
  EXPECT_NE(got[0].error.find("8388608 bytes"), std::string::npos) << got[0].error;
  EXPECT_TRUE(got[0].bytes.empty());
  EXPECT_EQ(got[1].state, StoredBlock::State::kFound);
  EXPECT_EQ(got[1].bytes, Bytes(4096, 2));
  EXPECT_EQ(got[2].state, StoredBlock::State::kAbsent);  // empty: no block file; rewritten
  EXPECT_EQ(got[3].state, StoredBlock::State::kAbsent);
  EXPECT_EQ(store.stats().bytes_read, 4096);  // the 8 MiB never crossed the wire
  EXPECT_TRUE(store.stats().up);
}

TEST(RedisBlockStore, RefusedWritesPauseInsteadOfResendingEveryBlock) {
  RedisServer server;
  REQUIRE_REDIS(server);
  auto store = OpenStore(server.url());
  ASSERT_NE(store, nullptr);
  // Full, and told not to evict: every SET is refused with OOM.
  freeReplyObject(server.Command({"CONFIG", "SET", "maxmemory-policy", "noeviction"}));
  freeReplyObject(server.Command({"CONFIG", "SET", "maxmemory", "1"}));
  const Status refused = store->Put(Hash(1), Bytes(100, 1));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("OOM"), std::string::npos) << refused.message();
  const int64_t errors = store->stats().errors;
  // The next writes fail here, without a SET sent to be refused again.
  for (int i = 2; i < 10; ++i) EXPECT_FALSE(store->Put(Hash(i), Bytes(100, 1)).ok());
  EXPECT_EQ(store->stats().errors, errors);
  EXPECT_EQ(store->stats().bytes_written, 0);
  EXPECT_TRUE(store->stats().up);  // refused writes are not an outage: lookups go on
  EXPECT_EQ(store->GetMany(std::vector<BlockHash>{Hash(1)})[0].state, StoredBlock::State::kAbsent);
  freeReplyObject(server.Command({"CONFIG", "SET", "maxmemory", "0"}));
  // After the pause (1 s at first) writes are taken again.
  EXPECT_TRUE(Eventually([&] { return store->Put(Hash(1), Bytes(100, 1)).ok(); }));
  EXPECT_EQ(store->GetMany(std::vector<BlockHash>{Hash(1)})[0].state, StoredBlock::State::kFound);
}

TEST(RedisBlockStore, ALookupTheServerRefusesIsAMissNotADamagedBlock) {
  RedisServer server;
  REQUIRE_REDIS(server);
  // A user that may not touch these keys (an ACL for another application).
  freeReplyObject(server.Command({"ACL", "SETUSER", "other", "on", ">pw", "~other:*", "+@all"}));
  auto owner = OpenStore(server.url());
  ASSERT_NE(owner, nullptr);
  ASSERT_TRUE(owner->Put(Hash(1), Bytes(100, 1)).ok());
  auto limited = OpenStore("redis://other:pw@127.0.0.1:" + std::to_string(server.port()));
  ASSERT_NE(limited, nullptr);
  const std::vector<BlockHash> ask = {Hash(1)};
  const auto got = limited->GetMany(ask);
  EXPECT_EQ(got[0].state, StoredBlock::State::kUnavailable);
  EXPECT_NE(got[0].error.find("NOPERM"), std::string::npos) << got[0].error;
  EXPECT_GE(limited->stats().errors, 1);
  EXPECT_EQ(owner->GetMany(ask)[0].state, StoredBlock::State::kFound);  // the block stays
}

// --- Two engines (replicas) sharing one Redis, on the real model.

constexpr const char* kModel = "stories260K.gguf";

std::vector<std::vector<int32_t>> Prompts(const Model& model) {
  const int32_t vocab = model.config().n_vocab - 3;
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t p = 0; p < 3; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int32_t i = 1; i < 70 + p; ++i)
      prompt.push_back(3 + (p * 89 + i * 37 + i * i * 5) % vocab);
    prompts.push_back(prompt);
  }
  return prompts;
}

struct Served {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int32_t> redis_tokens;
};

class Replica {
 public:
  // transform_bits > 0: blocks transform-coded (--kv-redis-codec tc:BITS). disk_dir: a disk
  // tier too (asked before Redis).
  Replica(const Model& model, const std::string& url, double transform_bits = 0,
          const std::string& disk_dir = "")
      : pool_(2), builder_(model, nullptr, pool_, KvFormatWithTypes({KvType::kF16, KvType::kF16})) {
    EngineConfig cfg;
    cfg.n_ctx = 256;
    cfg.max_seqs = 4;
    cfg.max_batch_tokens = 32;
    cfg.n_blocks = 64;
    cfg.watermark_blocks = 0;
    cfg.verify_each_step = true;
    cfg.kv_redis.url = url;
    cfg.kv_redis.timeout_ms = 300;
    cfg.kv_disk.dir = disk_dir;
    if (transform_bits > 0) {
      TransformCodecOptions tc;
      tc.bits = transform_bits;
      cfg.kv_redis.transform_options = tc;
    }
    auto local = builder_.Local(cfg);
    EXPECT_TRUE(local.ok()) << local.error();
    if (local.ok()) local_ = std::move(*local);
  }
  Engine& engine() { return *local_.engine; }
  Served Serve(const std::vector<std::vector<int32_t>>& prompts) {
    Served run;
    for (const auto& prompt : prompts) {
      RequestOptions o;
      o.max_tokens = 8;
      o.sampling.temperature = 0;
      std::vector<int32_t> out;
      int32_t redis = -1;
      auto id = engine().Submit(prompt, o, [&](const TokenEvent& e) {
        if (e.token >= 0) out.push_back(e.token);
        if (redis < 0) redis = e.tier_tokens[engine().connectors().tier("redis")->index()];
      });
      EXPECT_TRUE(id.ok()) << id.error();
      for (int i = 0; i < 100000 && engine().HasWork(); ++i) EXPECT_TRUE(engine().Step().ok());
      run.tokens.push_back(out);
      run.redis_tokens.push_back(redis);
    }
    return run;
  }
  KvTierStats stats() { return engine().connectors().tier("redis")->stats(); }

 private:
  ThreadPool pool_;
  EngineBuilder builder_;
  LocalEngine local_;
};

TEST(RedisTier, AReplicaLoadsWhatAnotherComputedAndFindsTheSameTokens) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  RedisServer server;
  REQUIRE_REDIS(server);
  const auto prompts = Prompts(*model);
  Replica cold(*model, "redis://127.0.0.1:" + std::to_string(RedisServer::FreePort()));
  const Served reference = cold.Serve(prompts);  // Redis unreachable: every request computed
  EXPECT_EQ(reference.redis_tokens, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_GT(cold.stats().misses, 0);

  Replica a(*model, server.url());
  EXPECT_EQ(a.Serve(prompts).tokens, reference.tokens);
  a.engine().connectors().Flush(/*wait=*/true);
  EXPECT_EQ(a.stats().blocks_written, 3 * 4);  // each prompt's four full blocks
  Replica b(*model, server.url());
  const Served shared = b.Serve(prompts);
  EXPECT_EQ(shared.tokens, reference.tokens);
  EXPECT_EQ(shared.redis_tokens, (std::vector<int32_t>{64, 64, 64}));
  EXPECT_EQ(b.stats().hits, 12);
  EXPECT_EQ(b.stats().corrupt, 0);
}

// Tiers are a list, asked in order (disk, then Redis), each labelled by its store: a request's
// tier_tokens follow the engine's list, and each tier reports what it knows (Redis, shared by
// replicas, neither its size nor its block count).
TEST(RedisTier, TiersAreAskedInOrderAndCountedUnderTheirOwnLabels) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  RedisServer server;
  REQUIRE_REDIS(server);
  const auto prompts = Prompts(*model);
  testing::TempDir disk_a, disk_b;
  Replica a(*model, server.url(), 0, disk_a.path());
  ASSERT_EQ(a.engine().connectors().tiers().size(), 2u);
  EXPECT_EQ(a.engine().connectors().tiers()[0]->name(), "disk");
  EXPECT_EQ(a.engine().connectors().tiers()[1]->name(), "redis");
  EXPECT_EQ(a.engine().connectors().tier("redis")->index(), 1);
  a.Serve(prompts);
  a.engine().connectors().Flush(/*wait=*/true);
  // B's disk is empty: the disk misses and Redis loads, under its own index.
  Replica b(*model, server.url(), 0, disk_b.path());
  std::vector<std::vector<int32_t>> loaded;  // per prompt: [disk, redis] tokens
  for (const auto& prompt : prompts) {
    RequestOptions o;
    o.max_tokens = 8;
    o.sampling.temperature = 0;
    std::vector<int32_t> first;
    ASSERT_TRUE(b.engine()
                    .Submit(prompt, o,
                            [&](const TokenEvent& e) {
                              if (first.empty()) first = {e.tier_tokens[0], e.tier_tokens[1]};
                            })
                    .ok());
    for (int i = 0; i < 100000 && b.engine().HasWork(); ++i) ASSERT_TRUE(b.engine().Step().ok());
    loaded.push_back(first);
  }
  EXPECT_EQ(loaded, (std::vector<std::vector<int32_t>>(3, {0, 64})));
  const KvTierStats disk = b.engine().connectors().tier("disk")->stats();
  const KvTierStats redis = b.engine().connectors().tier("redis")->stats();
  EXPECT_EQ(disk.hits, 0);
  EXPECT_EQ(disk.misses, 12);
  EXPECT_EQ(redis.hits, 12);
  EXPECT_GT(disk.capacity_bytes, 0);
  EXPECT_EQ(redis.usage_bytes, -1);
  EXPECT_EQ(redis.blocks_stored, -1);
  EXPECT_TRUE(redis.up);
  EXPECT_EQ(redis.errors, 0);
}

// --kv-redis-codec tc:2: replicas share transform-coded blocks (8x smaller than f16 here), every
// loading replica decodes them to the same KV (the same tokens), and a replica of another budget
// cannot read them: misses (not corrupt), computed, never loaded.
TEST(RedisTier, ReplicasShareTransformCodedBlocksAndAnotherBudgetLoadsNone) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  RedisServer server;
  REQUIRE_REDIS(server);
  const auto prompts = Prompts(*model);
  Replica cold(*model, "redis://127.0.0.1:" + std::to_string(RedisServer::FreePort()));
  const Served reference = cold.Serve(prompts);

  Replica a(*model, server.url(), 2);
  EXPECT_EQ(a.Serve(prompts).tokens, reference.tokens);  // computed: nothing was stored yet
  a.engine().connectors().Flush(/*wait=*/true);
  const KvTierStats written = a.stats();
  EXPECT_EQ(written.blocks_written, 3 * 4);
  EXPECT_LT(written.bytes_written * 4, written.payload_bytes_written);
  Replica b(*model, server.url(), 2), c(*model, server.url(), 2);
  const Served from_b = b.Serve(prompts), from_c = c.Serve(prompts);
  EXPECT_EQ(from_b.redis_tokens, (std::vector<int32_t>{64, 64, 64}));
  EXPECT_EQ(b.stats().hits, 12);
  EXPECT_EQ(b.stats().corrupt, 0);
  EXPECT_EQ(from_c.tokens, from_b.tokens);
  EXPECT_EQ(c.stats().hits, 12);

  Replica other(*model, server.url(), 3);
  const Served from_other = other.Serve(prompts);
  EXPECT_EQ(from_other.tokens, reference.tokens);
  EXPECT_EQ(from_other.redis_tokens, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(other.stats().hits, 0);
  EXPECT_EQ(other.stats().corrupt, 0);  // another codec's blocks: misses, not damage
  EXPECT_GT(other.stats().misses, 0);
}

TEST(RedisTier, AnotherBlocksBytesOrGarbageUnderAKeyIsRecomputedNeverLoaded) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  RedisServer server;
  REQUIRE_REDIS(server);
  const auto prompts = Prompts(*model);
  Replica a(*model, server.url());
  const Served reference = a.Serve(prompts);
  a.engine().connectors().Flush(/*wait=*/true);
  auto store = OpenStore(server.url());
  ASSERT_NE(store, nullptr);
  // Prompt 0's first block gets prompt 1's first block's (valid, checksummed) bytes; prompt 1's
  // second block gets garbage; prompt 2's third block a list.
  const auto h0 = a.engine().kv().HashFullBlocks(prompts[0], {});
  const auto h1 = a.engine().kv().HashFullBlocks(prompts[1], {});
  const auto h2 = a.engine().kv().HashFullBlocks(prompts[2], {});
  auto other = store->Get(h1[0]);
  ASSERT_TRUE(other.ok()) << other.error();
  ASSERT_TRUE(store->Put(h0[0], *other).ok());
  ASSERT_TRUE(store->Put(h1[1], Bytes(5000, 9)).ok());
  freeReplyObject(server.Command({"DEL", store->KeyOf(h2[2])}));
  freeReplyObject(server.Command({"LPUSH", store->KeyOf(h2[2]), "x"}));

  Replica b(*model, server.url());
  const Served run = b.Serve(prompts);
  EXPECT_EQ(run.tokens, reference.tokens);
  EXPECT_EQ(run.redis_tokens, (std::vector<int32_t>{0, 16, 32}));
  EXPECT_EQ(b.stats().corrupt, 3);
  // The bad values were deleted, and the recompute wrote the right ones back.
  b.engine().connectors().Flush(/*wait=*/true);
  Replica c(*model, server.url());
  EXPECT_EQ(c.Serve(prompts).redis_tokens, (std::vector<int32_t>{64, 64, 64}));
}

TEST(RedisTier, RedisKilledMidRunCostsReuseNotRequests) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  RedisServer server;
  REQUIRE_REDIS(server);
  const auto prompts = Prompts(*model);
  Replica a(*model, server.url());
  const Served reference = a.Serve(prompts);
  a.engine().connectors().Flush(/*wait=*/true);
  Replica b(*model, server.url());
  server.Kill();
  const Served down = b.Serve(prompts);
  EXPECT_EQ(down.tokens, reference.tokens);
  EXPECT_EQ(down.redis_tokens, (std::vector<int32_t>{0, 0, 0}));
  ASSERT_TRUE(server.Start());  // back, empty: b writes again what it computes
  Replica c(*model, server.url());
  EXPECT_EQ(c.Serve(prompts).tokens, reference.tokens);
}

}  // namespace
}  // namespace kvs
