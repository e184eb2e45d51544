#include "kv/redis_block_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>

#include "core/log.h"

namespace kvs {
namespace {

constexpr size_t kMaxIdle = 4;                 // the writer, the loader, and a spare or two
constexpr size_t kMaxKnown = size_t{1} << 20;  // ~64 MiB of hashes at most
constexpr std::chrono::milliseconds kFirstBackoff{100}, kMaxBackoff{5000};
constexpr std::chrono::milliseconds kFirstWritePause{1000}, kMaxWritePause{60000};

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
  const size_t at = url.rfind('@');
  if (at == std::string::npos) return url;
  const size_t start = url.find("://");
  // Without a scheme (a mistyped URL) everything before the '@' may be the password.
  if (start == std::string::npos || at < start) return "***" + url.substr(at);
  return url.substr(0, start + 3) + "***" + url.substr(at);
}

// RFC 3986 percent-decoding; nullopt on a '%' not followed by two hex digits.
std::optional<std::string> PercentDecoded(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size() || !std::isxdigit(static_cast<unsigned char>(s[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      return std::nullopt;
    }
    int value = 0;
    std::from_chars(s.data() + i + 1, s.data() + i + 3, value, 16);
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

}  // namespace

std::string RedisEndpoint::Display() const {
  const bool v6 = host.find(':') != std::string::npos;
  return "redis://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + "/" +
         std::to_string(db);
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
    // User info is percent-encoded (RFC 3986): a password holding '@', ':' or '/' is written
    // %40, %3A, %2F, as redis-py and the other REDIS_URL readers expect.
    const size_t colon = info.find(':');
    std::optional<std::string> user, password;
    if (colon == std::string_view::npos) {
      user = "";
      password = PercentDecoded(info);  // redis://PASSWORD@HOST, as some clients accept
    } else {
      user = PercentDecoded(info.substr(0, colon));
      password = PercentDecoded(info.substr(colon + 1));
    }
    if (!user || !password) {
      return Status::Error("--kv-redis " + Redacted(url) +
                           ": bad percent-encoding in the user or password (write '%' as %25)");
    }
    e.user = std::move(*user);
    e.password = std::move(*password);
  }
  if (rest.find_first_of("?#") != std::string_view::npos) {
    return Status::Error("--kv-redis " + Redacted(url) +
                         ": URL options (?...) are not supported; use --kv-redis-timeout-ms and "
                         "--kv-redis-password-file");
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
  std::string_view host = hostport;
  std::optional<std::string_view> port;  // what follows the host's ':', if there is one
  if (!hostport.empty() && hostport.front() == '[') {  // an IPv6 address: [::1]:6379
    const size_t close = hostport.find(']');
    if (close == std::string_view::npos ||
        (close + 1 < hostport.size() && hostport[close + 1] != ':')) {
      return Status::Error("--kv-redis " + Redacted(url) +
                           ": expected an IPv6 address as [ADDRESS] or [ADDRESS]:PORT");
    }
    host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size()) port = hostport.substr(close + 2);
  } else if (const size_t colon = hostport.rfind(':'); colon != std::string_view::npos) {
    if (hostport.find(':') != colon) {
      return Status::Error("--kv-redis " + Redacted(url) +
                           ": write an IPv6 address in brackets, redis://[ADDRESS]:PORT");
    }
    host = hostport.substr(0, colon);
    port = hostport.substr(colon + 1);
  }
  if (port && (!ParseInt(*port, &e.port) || e.port < 1 || e.port > 65535)) {
    return Status::Error("--kv-redis " + Redacted(url) + ": the port must be 1-65535");
  }
  if (host.empty()) return Status::Error("--kv-redis " + Redacted(url) + ": no host in the URL");
  e.host = std::string(host);
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
                         why.find("without any password configured") != std::string::npos ||
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
  // Up only once a command on it succeeds (Release): a Redis that answers PING but times out
  // on every GET would otherwise flap up and down, a log line each way, at every load.
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu_);
    first = !ever_up_;
  }
  if (first) MarkUp();  // the first connection: "connected"
  return c;
}

void RedisBlockStore::Release(redisContext* c, bool ok, const std::string& why) {
  if (ok) {
    MarkUp();
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
  if (up_.load()) return;  // already up: the common case, no lock
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
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (write_refusal_.count() > 0 && Clock::now() < writes_retry_at_) {
      return Status::Error("redis refuses writes (" + write_refusal_reason_ + "); retrying later");
    }
  }
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
  if (r->type == REDIS_REPLY_ERROR) {
    // Refused (OOM under maxmemory with noeviction, NOPERM, READONLY on a replica): the next
    // write would be refused too. Writes pause (1 s doubling to 60 s) instead of sending every
    // block to be refused; one log line when they pause, one when they are taken again.
    ++errors_;
    const std::string reason = r->str ? r->str : "error";
    std::lock_guard<std::mutex> lock(mu_);
    const bool first = write_refusal_.count() == 0;
    write_refusal_ = first ? kFirstWritePause : std::min(write_refusal_ * 2, kMaxWritePause);
    writes_retry_at_ = Clock::now() + write_refusal_;
    write_refusal_reason_ = reason;
    if (first) {
      KVS_LOG_WARN(
          "kv redis: %s refuses writes (%s): blocks are not written, retried every "
          "%lld s at most",
          config_.endpoint.Display().c_str(), reason.c_str(),
          static_cast<long long>(kMaxWritePause.count() / 1000));
    }
    return Status::Error("SET: " + reason);
  }
  bytes_written_ += static_cast<int64_t>(file.size());
  Remember(hash, true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (write_refusal_.count() > 0) {
      write_refusal_ = std::chrono::milliseconds(0);
      KVS_LOG_INFO("kv redis: %s takes writes again", config_.endpoint.Display().c_str());
    }
  }
  return Status::Ok();
}

// One round trip: every command goes out before the first reply is read. STRLEN first, so that
// a huge value under a block's key (someone else's, or a broken writer's) is never read:
// GETRANGE reads at most a block file's bound.
void RedisBlockStore::AppendLookups(redisContext* c, std::span<const BlockHash> hashes) const {
  const std::string last =
      config_.max_value_bytes > 0 ? std::to_string(config_.max_value_bytes - 1) : "-1";
  for (const BlockHash& hash : hashes) {
    const std::string key = KeyOf(hash);
    const char* strlen_argv[2] = {"STRLEN", key.c_str()};
    const size_t strlen_lens[2] = {6, key.size()};
    redisAppendCommandArgv(c, 2, strlen_argv, strlen_lens);
    const char* range_argv[4] = {"GETRANGE", key.c_str(), "0", last.c_str()};
    const size_t range_lens[4] = {8, key.size(), 1, last.size()};
    redisAppendCommandArgv(c, 4, range_argv, range_lens);
  }
}

void RedisBlockStore::ReadLookup(const BlockHash& hash, const redisReply& length,
                                 const redisReply& value, StoredBlock& b) {
  const redisReply* error = length.type == REDIS_REPLY_ERROR  ? &length
                            : value.type == REDIS_REPLY_ERROR ? &value
                                                              : nullptr;
  if (error && std::string_view(error->str ? error->str : "").rfind("WRONGTYPE", 0) != 0) {
    // Refused (NOPERM: an ACL without these keys or commands; BUSY: a script runs): the
    // store cannot be asked now; the block is not at fault, so it stays. Logged once.
    b.state = StoredBlock::State::kUnavailable;
    b.error = std::string("redis: ") + (error->str ? error->str : "error");
    ++misses_;
    ++errors_;
    if (!refusal_logged_.exchange(true)) {
      KVS_LOG_WARN("kv redis: %s refuses lookups (%s): they miss (logged once)",
                   config_.endpoint.Display().c_str(), error->str ? error->str : "error");
    }
  } else if (error || length.type != REDIS_REPLY_INTEGER || value.type != REDIS_REPLY_STRING) {
    // WRONGTYPE, or replies of other shapes: something else lives under the block's key.
    b.state = StoredBlock::State::kUnreadable;
    b.error = std::string("redis: ") +
              (error && error->str ? error->str : "a value that is not a string");
    ++misses_;
  } else if (config_.max_value_bytes > 0 && length.integer > config_.max_value_bytes) {
    b.state = StoredBlock::State::kUnreadable;
    b.error = StrFormat("redis: a value of %lld bytes, larger than any block file can be (%lld)",
                        static_cast<long long>(length.integer),
                        static_cast<long long>(config_.max_value_bytes));
    ++misses_;
  } else if (value.len == 0) {
    // No key (or an empty value, which no block file is: rewritten when recomputed).
    b.state = StoredBlock::State::kAbsent;
    ++misses_;
    Remember(hash, false);
  } else {
    b.state = StoredBlock::State::kFound;
    // As bytes (a char range would be copied element by element, converting).
    const auto* data = reinterpret_cast<const uint8_t*>(value.str);
    b.bytes.assign(data, data + value.len);
    bytes_read_ += static_cast<int64_t>(value.len);
    ++hits_;
    Remember(hash, true);
  }
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
  // One round trip: every command goes out before the first reply is read. STRLEN first, so
  // that a huge value under a block's key (someone else's, or a broken writer's) is never read:
  // GETRANGE reads at most a block file's bound.
  AppendLookups(c, hashes);
  bool ok = true;
  // One deadline for the batch: a slow or trickling server costs at most the timeout.
  const auto deadline = Clock::now() + std::chrono::milliseconds(config_.timeout_ms);
  const auto next = [&]() -> Reply {
    bool timed_out = false;
    Reply r(ok ? ReplyBefore(c, deadline, &timed_out) : nullptr);
    if (!r && ok) {
      why = "GET: " + ConnectionError(c);
      ok = false;
    }
    return r;
  };
  for (size_t i = 0; i < hashes.size(); ++i) {
    StoredBlock& b = out[i];
    Reply length = next();
    Reply value = next();  // read even when STRLEN settles it: the replies stay in step
    if (!length || !value) {
      b.state = StoredBlock::State::kUnavailable;
      b.error = why;
      ++misses_;
      continue;
    }
    ReadLookup(hashes[i], *length, *value, b);
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

BlockStoreCounters RedisBlockStore::counters() const {
  const RedisStoreStats r = stats();
  BlockStoreCounters c;
  c.up = r.up;
  c.errors = r.errors;
  c.bytes_read = r.bytes_read;  // every value read, the pipelined ones past a miss too
  c.bytes_written = r.bytes_written;
  return c;
}

}  // namespace kvs
