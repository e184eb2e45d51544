#include "kv/redis_block_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cctype>
#include <charconv>

#include "core/log.h"

namespace kvs {
namespace {

constexpr size_t kMaxIdle = 4;                 // the writer, the loader, and a spare or two
constexpr size_t kMaxKnown = size_t{1} << 20;  // ~64 MiB of hashes at most
constexpr std::chrono::milliseconds kFirstBackoff{100}, kMaxBackoff{5000};

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval ToTimeval(int64_t ms) {
  return timeval{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
}

bool ParseInt(std::string_view s, int* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size();
}

redisReply* ReplyBefore(redisContext* c, std::chrono::steady_clock::time_point deadline,
                        bool* timed_out);

// Runs one command (binary-safe arguments) within timeout_ms; null when the connection failed
// or the reply did not come in time (then the connection must be dropped).
Reply Command(redisContext* c, int64_t timeout_ms, std::initializer_list<std::string_view> args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAppendCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()) !=
      REDIS_OK) {
    return nullptr;
  }
  bool timed_out = false;
  return Reply(ReplyBefore(
      c, std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms), &timed_out));
}

// The next reply, read with a deadline on the whole reply rather than hiredis's timeout on each
// read (a server that trickles a byte now and then would never trip that one). Null, with
// c->err set, on a connection error; null with *timed_out when the deadline passed.
redisReply* ReplyBefore(redisContext* c, std::chrono::steady_clock::time_point deadline,
                        bool* timed_out) {
  *timed_out = false;
  int done = 0;
  while (!done) {  // what redisAppendCommand* queued goes out first
    if (redisBufferWrite(c, &done) != REDIS_OK) return nullptr;
  }
  while (true) {
    void* reply = nullptr;
    if (redisGetReplyFromReader(c, &reply) != REDIS_OK) return nullptr;
    if (reply) return static_cast<redisReply*>(reply);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *timed_out = true;
      return nullptr;
    }
    redisSetTimeout(c, timeval{static_cast<time_t>(left.count() / 1000),
                               static_cast<suseconds_t>((left.count() % 1000) * 1000)});
    if (redisBufferRead(c) != REDIS_OK) return nullptr;
  }
}

std::string ConnectionError(const redisContext* c) {
  return c && c->err && c->errstr[0] ? std::string(c->errstr)
                                     : std::string("no reply within --kv-redis-timeout-ms");
}

// The URL as a log line may show it: user info (a password) replaced by "***".
std::string Redacted(const std::string& url) {
  const size_t start = url.find("://");
  const size_t at = url.rfind('@');
  if (start == std::string::npos || at == std::string::npos || at < start) return url;
  return url.substr(0, start + 3) + "***" + url.substr(at);
}

}  // namespace

std::string RedisEndpoint::Display() const {
  return "redis://" + host + ":" + std::to_string(port) + "/" + std::to_string(db);
}

Expected<RedisEndpoint> ParseRedisUrl(const std::string& url) {
  const std::string_view scheme = "redis://";
  if (url.rfind("rediss://", 0) == 0) {
    return Status::Error("--kv-redis " + Redacted(url) +
                         ": TLS (rediss://) is not supported; use redis:// on a trusted network "
                         "or a TLS tunnel (stunnel, a service mesh)");
  }
  if (url.rfind(scheme, 0) != 0) {
    return Status::Error("--kv-redis " + Redacted(url) +
                         ": expected redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]");
  }
  std::string_view rest = std::string_view(url).substr(scheme.size());
  RedisEndpoint e;
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = info.find(':');
    if (colon == std::string_view::npos) {
      e.password = std::string(info);  // redis://PASSWORD@HOST, as some clients accept
    } else {
      e.user = std::string(info.substr(0, colon));
      e.password = std::string(info.substr(colon + 1));
    }
  }
  std::string_view hostport = rest;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    hostport = rest.substr(0, slash);
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty() && (!ParseInt(db, &e.db) || e.db < 0 || e.db > 65535)) {
      return Status::Error("--kv-redis " + Redacted(url) + ": the database must be 0-65535, got '" +
                           std::string(db) + "'");
    }
  }
  if (const size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    if (!ParseInt(hostport.substr(colon + 1), &e.port) || e.port < 1 || e.port > 65535) {
      return Status::Error("--kv-redis " + Redacted(url) + ": the port must be 1-65535");
    }
    hostport = hostport.substr(0, colon);
  }
  if (hostport.empty()) return Status::Error("--kv-redis: no host in the URL");
  e.host = std::string(hostport);
  return e;
}

Expected<std::unique_ptr<RedisBlockStore>> RedisBlockStore::Open(const RedisStoreConfig& config) {
  if (config.key_namespace.empty() ||
      !std::all_of(config.key_namespace.begin(), config.key_namespace.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' ||
               ch == '.' || ch == ':';
      })) {
    return Status::Error("kv redis: the key namespace '" + config.key_namespace +
                         "' may hold only letters, digits, '_', '-', '.' and ':'");
  }
  if (config.timeout_ms < 1 || config.timeout_ms > 600000) {
    return Status::Error(StrFormat("--kv-redis-timeout-ms %lld: expected 1 to 600000",
                                   static_cast<long long>(config.timeout_ms)));
  }
  if (config.ttl_seconds < 0) {
    return Status::Error(StrFormat("--kv-redis-ttl %lld: expected 0 (no expiry) or more seconds",
                                   static_cast<long long>(config.ttl_seconds)));
  }
  auto store = std::unique_ptr<RedisBlockStore>(new RedisBlockStore(config));
  std::string why;
  redisContext* c = store->Acquire(&why);
  if (!c) {
    // Refused credentials are a configuration error; anything else (not running yet, a
    // network) is an outage the store rides out.
    const bool refused = why.find("WRONGPASS") != std::string::npos ||
                         why.find("NOAUTH") != std::string::npos ||
                         why.find("NOPERM") != std::string::npos ||
                         why.find("invalid password") != std::string::npos ||
                         why.find("invalid username") != std::string::npos ||
                         why.find("DB index") != std::string::npos;
    if (refused) {
      return Status::Error("kv redis: " + config.endpoint.Display() + ": " + why);
    }
    return store;
  }
  store->Release(c, true, "");
  return store;
}

RedisBlockStore::~RedisBlockStore() {
  for (redisContext* c : idle_) redisFree(c);
}

std::string RedisBlockStore::KeyOf(const BlockHash& hash) const {
  return config_.key_namespace + ":{" + BlockHashHex(hash) + "}";
}

bool RedisBlockStore::Available() const {
  if (!available_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(mu_);
    return Clock::now() >= retry_at_;  // due for a reconnect attempt
  }
  return true;
}

redisContext* RedisBlockStore::Acquire(std::string* why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (down_ && Clock::now() < retry_at_) {
      *why = "redis unavailable (" + config_.endpoint.Display() + " down, retrying)";
      return nullptr;
    }
    if (!idle_.empty()) {
      redisContext* c = idle_.back();
      idle_.pop_back();
      return c;
    }
  }
  const timeval tv = ToTimeval(config_.timeout_ms);
  redisContext* c =
      redisConnectWithTimeout(config_.endpoint.host.c_str(), config_.endpoint.port, tv);
  if (!c || c->err) {
    *why = "connect: " + ConnectionError(c);
    if (c) redisFree(c);
    MarkDown(*why);
    return nullptr;
  }
  redisSetTimeout(c, tv);
  const auto fail = [&](const char* what, const Reply& r) {
    *why = std::string(what) + ": " +
           (r ? std::string(r->str ? r->str : "unexpected reply") : ConnectionError(c));
    redisFree(c);
    MarkDown(*why);
    return nullptr;
  };
  if (!config_.endpoint.password.empty()) {
    const RedisEndpoint& e = config_.endpoint;
    Reply r = e.user.empty() ? Command(c, config_.timeout_ms, {"AUTH", e.password})
                             : Command(c, config_.timeout_ms, {"AUTH", e.user, e.password});
    if (!r || r->type == REDIS_REPLY_ERROR) return fail("AUTH", r);
  }
  if (config_.endpoint.db != 0) {
    Reply r = Command(c, config_.timeout_ms, {"SELECT", std::to_string(config_.endpoint.db)});
    if (!r || r->type == REDIS_REPLY_ERROR) return fail("SELECT", r);
  }
  Reply r = Command(c, config_.timeout_ms, {"PING"});
  if (!r || r->type == REDIS_REPLY_ERROR) return fail("PING", r);
  MarkUp();
  return c;
}

void RedisBlockStore::Release(redisContext* c, bool ok, const std::string& why) {
  if (ok) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdle) {
      idle_.push_back(c);
      return;
    }
  }
  redisFree(c);
  if (!ok) MarkDown(why);
}

void RedisBlockStore::MarkDown(const std::string& why) {
  ++errors_;
  up_ = false;
  std::vector<redisContext*> stale;
  {
    std::lock_guard<std::mutex> lock(mu_);
    backoff_ = backoff_.count() == 0 ? kFirstBackoff : std::min(backoff_ * 2, kMaxBackoff);
    retry_at_ = Clock::now() + backoff_;
    available_ = false;
    stale.swap(idle_);  // they most likely died with it
    if (!down_) {
      down_ = true;
      KVS_LOG_WARN(
          "kv redis: %s unreachable (%s): lookups miss and writes are dropped until it "
          "answers again (retrying every %lld ms at most)",
          config_.endpoint.Display().c_str(), why.c_str(),
          static_cast<long long>(kMaxBackoff.count()));
    }
  }
  for (redisContext* c : stale) redisFree(c);
}

void RedisBlockStore::MarkUp() {
  up_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  backoff_ = std::chrono::milliseconds(0);
  available_ = true;
  if (down_ || !ever_up_) {
    if (down_ && ever_up_) ++reconnects_;
    KVS_LOG_INFO("kv redis: %s %s", config_.endpoint.Display().c_str(),
                 ever_up_ ? "answers again" : "connected");
  }
  down_ = false;
  ever_up_ = true;
}

void RedisBlockStore::Remember(const BlockHash& hash, bool present) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!present) {
    known_.erase(hash);  // expired or evicted: this process may write it again
    return;
  }
  if (known_.size() >= kMaxKnown) known_.clear();
  known_.insert(hash);
}

bool RedisBlockStore::Contains(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_.contains(hash);
}

Status RedisBlockStore::Put(const BlockHash& hash, std::span<const uint8_t> file) {
  std::string why;
  redisContext* c = Acquire(&why);
  if (!c) return Status::Error(why);
  const std::string key = KeyOf(hash);
  const std::string_view value(reinterpret_cast<const char*>(file.data()), file.size());
  const std::string ttl = std::to_string(config_.ttl_seconds);
  Reply r = config_.ttl_seconds > 0 ? Command(c, config_.timeout_ms, {"SET", key, value, "EX", ttl})
                                    : Command(c, config_.timeout_ms, {"SET", key, value});
  if (!r) {
    why = "SET: " + ConnectionError(c);
    Release(c, false, why);
    return Status::Error(why);
  }
  Release(c, true, "");
  if (r->type == REDIS_REPLY_ERROR) {  // e.g. OOM under maxmemory with noeviction
    ++errors_;
    return Status::Error(std::string("SET: ") + (r->str ? r->str : "error"));
  }
  bytes_written_ += static_cast<int64_t>(file.size());
  Remember(hash, true);
  return Status::Ok();
}

std::vector<StoredBlock> RedisBlockStore::GetMany(std::span<const BlockHash> hashes) {
  std::vector<StoredBlock> out(hashes.size());
  std::string why;
  redisContext* c = Acquire(&why);
  if (!c) {
    for (StoredBlock& b : out) {
      b.state = StoredBlock::State::kUnavailable;
      b.error = why;
    }
    misses_ += static_cast<int64_t>(hashes.size());
    return out;
  }
  // One round trip: every GET goes out before the first reply is read.
  for (const BlockHash& hash : hashes) {
    const std::string key = KeyOf(hash);
    const char* argv[2] = {"GET", key.c_str()};
    const size_t lens[2] = {3, key.size()};
    redisAppendCommandArgv(c, 2, argv, lens);
  }
  bool ok = true;
  // One deadline for the batch: a slow or trickling server costs at most the timeout.
  const auto deadline = Clock::now() + std::chrono::milliseconds(config_.timeout_ms);
  for (size_t i = 0; i < hashes.size(); ++i) {
    StoredBlock& b = out[i];
    bool timed_out = false;
    Reply r(ok ? ReplyBefore(c, deadline, &timed_out) : nullptr);
    if (!r) {
      if (ok) why = "GET: " + ConnectionError(c);
      ok = false;
      b.state = StoredBlock::State::kUnavailable;
      b.error = why;
      ++misses_;
      continue;
    }
    if (r->type == REDIS_REPLY_STRING) {
      b.state = StoredBlock::State::kFound;
      // As bytes (a char range would be copied element by element, converting).
      const auto* data = reinterpret_cast<const uint8_t*>(r->str);
      b.bytes.assign(data, data + r->len);
      bytes_read_ += static_cast<int64_t>(r->len);
      ++hits_;
      Remember(hashes[i], true);
    } else if (r->type == REDIS_REPLY_NIL) {
      b.state = StoredBlock::State::kAbsent;
      ++misses_;
      Remember(hashes[i], false);
    } else if (r->type == REDIS_REPLY_ERROR &&
               std::string_view(r->str ? r->str : "").rfind("WRONGTYPE", 0) != 0) {
      // Refused (NOPERM: an ACL without these keys or GET; BUSY: a script runs): the store
      // cannot be asked now; the block is not at fault, so it stays. Logged once.
      b.state = StoredBlock::State::kUnavailable;
      b.error = std::string("redis: ") + (r->str ? r->str : "error");
      ++misses_;
      ++errors_;
      if (!refusal_logged_.exchange(true)) {
        KVS_LOG_WARN("kv redis: %s refuses lookups (%s): they miss (logged once)",
                     config_.endpoint.Display().c_str(), r->str ? r->str : "error");
      }
    } else {
      // WRONGTYPE, or a reply that is not a string: something else lives under the block's key.
      b.state = StoredBlock::State::kUnreadable;
      b.error = std::string("redis: ") +
                (r->type == REDIS_REPLY_ERROR && r->str ? r->str : "a value that is not a string");
      ++misses_;
    }
  }
  Release(c, ok, why);
  return out;
}

Expected<std::vector<uint8_t>> RedisBlockStore::Get(const BlockHash& hash) {
  std::vector<StoredBlock> one = GetMany(std::span<const BlockHash>(&hash, 1));
  if (one[0].state == StoredBlock::State::kFound) return std::move(one[0].bytes);
  if (one[0].state == StoredBlock::State::kAbsent) return Status::Error("not in the redis store");
  return Status::Error(one[0].error);
}

void RedisBlockStore::Erase(const BlockHash& hash) {
  Remember(hash, false);
  std::string why;
  redisContext* c = Acquire(&why);
  if (!c) return;
  Reply r = Command(c, config_.timeout_ms, {"DEL", KeyOf(hash)});
  if (!r) {
    Release(c, false, "DEL: " + ConnectionError(c));
    return;
  }
  Release(c, true, "");
}

RedisStoreStats RedisBlockStore::stats() const {
  RedisStoreStats s;
  s.errors = errors_;
  s.hits = hits_;
  s.misses = misses_;
  s.bytes_written = bytes_written_;
  s.bytes_read = bytes_read_;
  s.reconnects = reconnects_;
  s.up = up_;
  return s;
}

}  // namespace kvs
