// The shared tier (issue #22): block files (kv/block_file.h, checksummed, usually compressed) in a
// Redis server that several kvserve replicas share, keyed by the block's chain hash, which
// already covers the weights' digest and the KV format, so replicas of another model or format
// never see each other's blocks. Expiry and memory limits are Redis's own (maxmemory-policy
// allkeys-lru, and an optional TTL on every key).
//
// Keys: "<namespace>:{<32 hex digits>}". The braces are a Redis Cluster hash tag: each block
// hashes to its own slot, so a cluster spreads blocks evenly and a block's key never moves.
//
// The engine's thread never talks to Redis: the tier's writer and loader threads call Put and
// GetMany, and the engine only reads Contains (what this process knows) and Available (an
// atomic). Faults cost lookups and writes, never requests: every command has a timeout; a
// connection that fails or times out is dropped, the store is "down" (one log line), and until
// the next reconnect attempt (100 ms, doubling to 5 s) calls fail at once without touching the
// network; the first success is "up" again (one line). A reply of the wrong type (someone else's
// value under a block's key) is an unreadable block, erased by the loader, not an outage.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "kv/block_store.h"

struct redisContext;
struct redisReply;

namespace kvs {

// Where the Redis server is: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] (REDIS_URL's form).
struct RedisEndpoint {
  std::string host = "127.0.0.1";
  int port = 6379;
  int db = 0;
  std::string user;      // ACL user (Redis 6+); empty: the default user
  std::string password;  // empty: no AUTH
  // "redis://HOST:PORT/DB" without the credentials, for log lines and errors.
  std::string Display() const;
};
// Parses a redis:// URL; an error naming what is wrong (scheme, port, database, rediss://).
Expected<RedisEndpoint> ParseRedisUrl(const std::string& url);

struct RedisStoreConfig {
  RedisEndpoint endpoint;
  std::string key_namespace = "kvserve";  // letters, digits, '_', '-', '.', ':' only
  int64_t ttl_seconds = 0;                // 0: keys do not expire (maxmemory evicts them)
  int64_t timeout_ms = 500;               // connect and every command
  // The most bytes a value may have to be one of this pool's block files; a larger value under
  // a block's key is never read (unreadable, erased). 0: no bound.
  int64_t max_value_bytes = 0;
};

struct RedisStoreStats {
  int64_t errors = 0;         // commands or connections that failed or timed out
  int64_t hits = 0;           // blocks found by a lookup
  int64_t misses = 0;         // blocks a lookup did not find (absent, or Redis unavailable)
  int64_t bytes_written = 0;  // value bytes SET
  int64_t bytes_read = 0;     // value bytes read by lookups
  int64_t reconnects = 0;     // times the store came back after being down
  bool up = false;            // the last attempt to reach Redis succeeded
};

class RedisBlockStore final : public BlockStore {
 public:
  // Checks the configuration and tries one connection: Redis down at start is logged, not an
  // error (lookups miss and writes are dropped until it is up).
  static Expected<std::unique_ptr<RedisBlockStore>> Open(const RedisStoreConfig& config);
  ~RedisBlockStore() override;

  std::string_view name() const override { return "redis"; }
  bool Contains(const BlockHash& hash) const override;
  bool KnowsContents() const override { return false; }
  bool Available() const override;
  bool Recovers() const override { return true; }
  int64_t timeout_ms() const override { return config_.timeout_ms; }
  BlockStoreCounters counters() const override;
  Status Put(const BlockHash& hash, std::span<const uint8_t> file) override;
  Expected<std::vector<uint8_t>> Get(const BlockHash& hash) override;
  std::vector<StoredBlock> GetMany(std::span<const BlockHash> hashes) override;
  void Erase(const BlockHash& hash) override;

  std::string KeyOf(const BlockHash& hash) const;
  RedisStoreStats stats() const;
  const RedisStoreConfig& config() const { return config_; }

 private:
  using Clock = std::chrono::steady_clock;
  explicit RedisBlockStore(RedisStoreConfig config) : config_(std::move(config)) {}
  // A ready connection (connected, authenticated, database selected), or null with *why when
  // Redis cannot be reached now (down and not yet due for a retry, or the attempt failed).
  redisContext* Acquire(std::string* why);
  // Gives a connection back: kept when ok, closed (and the store marked down) when not.
  void Release(redisContext* c, bool ok, const std::string& why);
  // GetMany's parts: the STRLEN and GETRANGE of every block queued on c (one round trip), and
  // one block's pair of replies read into b (counted, absent blocks remembered).
  void AppendLookups(redisContext* c, std::span<const BlockHash> hashes) const;
  void ReadLookup(const BlockHash& hash, const redisReply& length, const redisReply& value,
                  StoredBlock& b);
  void MarkDown(const std::string& why);
  void MarkUp();
  void Remember(const BlockHash& hash, bool present);

  const RedisStoreConfig config_;
  mutable std::mutex mu_;
  std::vector<redisContext*> idle_;  // connections not in use (at most kMaxIdle)
  bool down_ = false;
  bool ever_up_ = false;
  std::chrono::milliseconds backoff_{0};
  Clock::time_point retry_at_{};
  std::atomic<bool> available_{true};
  // Blocks this process wrote or found, so it does not SET them again; bounded (cleared when
  // full: the cost is a rewrite, never a wrong answer).
  std::unordered_set<BlockHash, BlockHashHasher> known_;
  std::atomic<int64_t> errors_{0}, hits_{0}, misses_{0}, bytes_written_{0}, bytes_read_{0};
  std::atomic<int64_t> reconnects_{0};
  std::atomic<bool> up_{false};
  std::atomic<bool> refusal_logged_{false};  // a lookup refused by an error reply was logged
  // Writes Redis refused (an error reply, e.g. OOM): paused for write_refusal_ (0: not
  // refused), until writes_retry_at_.
  std::chrono::milliseconds write_refusal_{0};
  Clock::time_point writes_retry_at_{};
  std::string write_refusal_reason_;
};

}  // namespace kvs
