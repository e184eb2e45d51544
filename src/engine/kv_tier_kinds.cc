// The kinds of tier under the RAM prefix cache, and how each is opened from an EngineConfig.
// A tier kind is a BlockStore (src/kv) and an entry in the table at the end of this file; the
// connector (engine/kv_tier.h), the engine, stats, usage and metrics take it from there.
#include "engine/kv_tier_kinds.h"

#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "core/text_file.h"
#include "kv/redis_block_store.h"

namespace kvs {
namespace {

// The disk tier's store at config.dir, opened (or created) and its index rebuilt, reporting
// progress for large stores.
Expected<std::unique_ptr<KvTier>> OpenDisk(const KvTierConfig& config,
                                           const BlockIdentity& identity, KvStorage& storage,
                                           const std::function<void(int64_t)>& progress) {
  if (config.dir.empty()) return Status::Error("--kv-disk: no directory given");
  if (config.codec == BlockCodec::kTransform && config.transform == nullptr) {
    return Status::Error("--kv-disk-codec tc: no transform codec was made");
  }
  // A file size limit (ulimit -f) must fail a block's write with EFBIG, which turns the tier
  // off, rather than kill the process with SIGXFSZ.
  ::signal(SIGXFSZ, SIG_IGN);
  auto store = DiskBlockStore::Open(config.dir, UINT64_MAX, progress);
  if (!store.ok()) return store.status();
  KvTierConfig c = config;
  if (c.capacity_bytes == 0) {
    // 20G, or what the file system has free (plus what the store holds already), if less.
    struct statvfs fs;
    uint64_t room = kDefaultKvDiskBytes;
    if (::statvfs(c.dir.c_str(), &fs) == 0) {
      room = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize + (*store)->usage_bytes();
    }
    c.capacity_bytes = std::min(kDefaultKvDiskBytes, room);
  }
  const uint64_t min_bytes = 4 * storage.geometry().BytesPerBlock();
  if (c.capacity_bytes < min_bytes) {
    if (config.capacity_bytes != 0) {
      return Status::Error(StrFormat(
          "--kv-disk-size %llu bytes holds fewer than 4 blocks of this KV format (%llu bytes each)",
          static_cast<unsigned long long>(c.capacity_bytes),
          static_cast<unsigned long long>(storage.geometry().BytesPerBlock())));
    }
    // A full (or read-only) file system: the blocks there still load; new ones are not written.
    KVS_LOG_WARN("kv disk: %s has no room for new blocks: the tier only reads what it holds",
                 c.dir.c_str());
  }
  (*store)->set_capacity(c.capacity_bytes);
  return KvTier::Make(c, identity, storage, std::move(*store));
}

// Configuration errors (URL, password file, a password Redis refused) fail; Redis down at
// start does not (lookups miss until it answers).
Expected<std::unique_ptr<KvTier>> OpenRedis(const KvRedisConfig& config,
                                            const BlockIdentity& identity, KvStorage& storage) {
  auto endpoint = ParseRedisUrl(config.url);
  if (!endpoint.ok()) return endpoint.status();
  if (!config.password_file.empty()) {
    auto text = ReadTextFile(config.password_file, 4096);
    if (!text.ok()) {
      return Status::Error("--kv-redis-password-file " + config.password_file + ": " +
                           text.error());
    }
    std::string password = text->substr(0, text->find_first_of("\r\n"));
    if (password.empty()) {
      return Status::Error("--kv-redis-password-file " + config.password_file +
                           ": the first line is empty");
    }
    endpoint->password = std::move(password);
  }
  if (config.zstd_level < 1 || config.zstd_level > 19) {
    return Status::Error(StrFormat("kv redis: zstd level %d: expected 1-19", config.zstd_level));
  }
  RedisStoreConfig rc;
  rc.endpoint = *endpoint;
  rc.key_namespace = config.key_namespace;
  rc.ttl_seconds = config.ttl_seconds;
  rc.timeout_ms = config.timeout_ms;
  rc.max_value_bytes =
      static_cast<int64_t>(MaxBlockFileBytes(identity, storage.geometry().BytesPerBlock()));
  auto store = RedisBlockStore::Open(rc);
  if (!store.ok()) return store.status();
  KvTierConfig c;
  c.policy = KvDiskPolicy::kWriteThrough;  // written behind as soon as full and hashed
  c.codec = config.transform ? BlockCodec::kTransform : BlockCodec::kZstd;
  c.transform = config.transform;
  c.zstd_level = config.zstd_level;
  c.write_queue_bytes = config.write_queue_bytes;
  return KvTier::Make(c, identity, storage, std::move(*store));
}

// Why blocks could not be written under dir (created here where missing): a read-only file
// system or a directory this process may not write; empty when they can. Other failures
// (not a directory, a vanished parent) are left to the store's open, which names them.
std::string ReadOnlyReason(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // EPERM: an immutable directory (chattr +i), which even root may not write.
  if (ec == std::errc::read_only_file_system || ec == std::errc::permission_denied ||
      ec == std::errc::operation_not_permitted) {
    return ec.message();
  }
  if (ec) return {};
  struct statvfs fs;
  if (::statvfs(dir.c_str(), &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0) {
    return "Read-only file system";
  }
  if (::access(dir.c_str(), W_OK) != 0 && (errno == EROFS || errno == EACCES || errno == EPERM)) {
    return std::strerror(errno);
  }
  return {};
}

// --kv-disk DIR: a read-only directory leaves the tier off (null) instead of failing the start.
Expected<std::unique_ptr<KvTier>> DiskTier(const TierContext& ctx) {
  const EngineConfig& config = ctx.config;  // with prefix caching: EngineBuilder::Tiers checked
  const auto t0 = std::chrono::steady_clock::now();
  const std::string& dir = config.kv_disk.dir;
  if (std::string why = ReadOnlyReason(dir); !why.empty()) {
    // A read-only (or uncreatable) directory fails no start: serving goes on without the tier,
    // as a tier that fails while running does (docs/SECURITY.md).
    KVS_LOG_WARN(
        "kv disk: %s is not writable (%s): the disk tier is off, serving goes on "
        "without it",
        dir.c_str(), why.c_str());
    return std::unique_ptr<KvTier>();
  }
  KvTierConfig disk_config = config.kv_disk;
  if (disk_config.codec == BlockCodec::kTransform) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // the basis is saved there before the store
    auto codec = ctx.transform(disk_config.transform_options, dir);
    if (!codec.ok()) return codec.status();
    disk_config.transform = *codec;
  }
  auto tier = OpenDisk(disk_config, ctx.identity, ctx.storage, [&dir](int64_t files) {
    KVS_LOG_INFO("kv disk: indexing %s: %lld files so far", dir.c_str(),
                 static_cast<long long>(files));
  });
  if (!tier.ok()) return tier.status();
  const KvTierStats s = (*tier)->stats();
  KVS_LOG_INFO(
      "kv disk: %s holds %lld blocks (%.1f MiB of %.1f GiB; indexed in %.0f ms), %s, %s",
      dir.c_str(), static_cast<long long>(s.blocks_stored), s.usage_bytes / 1048576.0,
      (*tier)->config().capacity_bytes / 1073741824.0,
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
      config.kv_disk.policy == KvDiskPolicy::kWriteThrough ? "write-through" : "write-back",
      disk_config.transform ? disk_config.transform->name().c_str()
                            : BlockCodecName(config.kv_disk.codec));
  return tier;
}

// --kv-redis URL: the Redis tier; its transform codec's fit is kept in the disk tier's
// directory when there is one.
Expected<std::unique_ptr<KvTier>> RedisTier(const TierContext& ctx) {
  KvRedisConfig redis_config = ctx.config.kv_redis;
  if (redis_config.transform_options) {
    auto codec = ctx.transform(*redis_config.transform_options, ctx.config.kv_disk.dir);
    if (!codec.ok()) return codec.status();
    redis_config.transform = *codec;
  }
  return OpenRedis(redis_config, ctx.identity, ctx.storage);
}

}  // namespace

std::span<const TierKind> TierKinds() {
  // In the order an engine asks them: the local disk before the shared Redis (a hit nearer
  // home costs less).
  static const TierKind kKinds[] = {
      {"disk", "--kv-disk", [](const EngineConfig& c) { return !c.kv_disk.dir.empty(); }, DiskTier},
      {"redis", "--kv-redis", [](const EngineConfig& c) { return !c.kv_redis.url.empty(); },
       RedisTier},
  };
  return kKinds;
}

std::vector<std::string> TierNames() {
  std::vector<std::string> names;
  for (const TierKind& kind : TierKinds()) names.emplace_back(kind.name);
  return names;
}

}  // namespace kvs
