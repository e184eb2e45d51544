// kvserve::EngineOptions, checked and resolved once (engine_setup.h).
#include "api/engine_setup.h"

#include <algorithm>
#include <cmath>

#include "api/engine_impl.h"
#include "core/memory_info.h"
#include "core/thread_pool.h"
#include "engine/kv_tier.h"
#include "engine/transform_codec.h"
#include "kernels/kv_types.h"
#include "model/compressed_view.h"

namespace kvs {
namespace {

using kvserve::EngineOptions;

// -c, -np and -t on their own.
Status CheckParallelism(const EngineOptions& o) {
  if (o.n_ctx < 2 || o.n_parallel < 1 || o.threads < 0) {
    return Status::Error("-c must be at least 2, -np at least 1 and -t not negative");
  }
  // Before the default KV size, which grows with -np, turns an absurd -np into a memory error.
  if (o.n_parallel > kMaxParallelSequences) {
    return Status::Error(
        StrFormat("-np %d: must be between 1 and %d", o.n_parallel, kMaxParallelSequences));
  }
  return Status::Ok();
}

// The KV pool's size in blocks. Sets o->kv_memory_bytes when it was left to the default.
// A block's bytes: the cache types' in each of the model's KV slabs (kv/kv_storage.h: a block
// holds one group's layers).
int64_t PoolBlockBytes(const KvGeometry& geometry, const ModelConfig& c) {
  return static_cast<int64_t>(SlabBlockBytes(geometry, c.kv_slabs()));
}

Expected<int64_t> KvPoolBlocks(EngineOptions* o, const KvGeometry& geometry, const ModelConfig& c) {
  const std::span<const KvGroupSpec> groups = c.kv_groups;
  const int64_t block_bytes = PoolBlockBytes(geometry, c);
  // A full context's blocks in every KV group (a sliding window's: its window and a chunk).
  const int64_t blocks_per_seq = PeakBlocks(groups, o->n_ctx, o->block_size, o->max_batch_tokens);
  const int64_t available = AvailableRamBytes();
  if (o->kv_memory_bytes <= 0) {
    // n_parallel full sequences, the null block, and the 1% admission watermark on top.
    const double blocks =
        std::ceil((static_cast<double>(blocks_per_seq) * o->n_parallel + 1) * 1.02) + 1;
    const double want = blocks * block_bytes;
    o->kv_memory_bytes = static_cast<int64_t>(std::min<double>(want, available / 2));
  }
  if (o->kv_memory_bytes > available) {
    return Status::Error(
        StrFormat("--kv-memory %.2f GiB is more than the %.2f GiB of RAM available",
                  o->kv_memory_bytes / double(1 << 30), available / double(1 << 30)));
  }
  const int64_t n_blocks = o->kv_memory_bytes / block_bytes;
  if (n_blocks < 2 || n_blocks > (int64_t{1} << 30)) {
    return Status::Error(StrFormat(
        "--kv-memory %lld bytes holds %lld blocks of %lld bytes (%d positions); need at least 2",
        static_cast<long long>(o->kv_memory_bytes), static_cast<long long>(n_blocks),
        static_cast<long long>(block_bytes), o->block_size));
  }
  return n_blocks;
}

// The pool: PoolShape's exact one (its bytes in o->kv_memory_bytes), else KvPoolBlocks'.
Expected<int64_t> PoolBlocks(EngineOptions* o, const KvGeometry& geometry, const ModelConfig& c,
                             const PoolShape& pool) {
  if (pool.n_blocks <= 0) return KvPoolBlocks(o, geometry, c);
  o->kv_memory_bytes = int64_t{pool.n_blocks} * PoolBlockBytes(geometry, c);
  return int64_t{pool.n_blocks};
}

// The scheduler's part of the config: sequences, batches, blocks, and token eviction.
Status ConfigureScheduler(const EngineOptions& o, int64_t n_blocks, int32_t watermark_blocks,
                          EngineConfig* ec) {
  ec->n_ctx = o.n_ctx;
  ec->max_seqs = o.n_parallel;
  ec->max_batch_tokens = o.max_batch_tokens;
  ec->max_step_ms = o.max_step_ms;
  ec->block_size = o.block_size;
  ec->n_blocks = static_cast<int32_t>(n_blocks);
  ec->watermark_blocks = watermark_blocks;
  ec->reserve_full_context = o.reserve_full_context;
  ec->prefix_cache = o.prefix_cache;
  ec->eviction.guard = {o.kv_sink, o.kv_window};
  ec->eviction.policy = o.evict_policy;
  ec->eviction.every = o.evict_every;
  KVS_ASSIGN_OR_RETURN(ec->eviction.budget, ParseKvBudget(o.kv_budget, ec->eviction.guard));
  ec->spec.draft_max = o.draft_max;
  ec->spec.draft_min = o.draft_min;
  return Status::Ok();
}

// --spec-type and its drafter: -md's model or --draft-weights' view. limits: --draft-max/min.
Expected<SpecOptions> SpecFromOptions(const EngineOptions& o, const SpecConfig& limits) {
  SpecOptions spec;
  KVS_ASSIGN_OR_RETURN(spec.type, ParseSpecType(o.spec_type));
  if (o.draft_min > o.draft_max) {
    return Status::Error(
        StrFormat("--draft-min %d is more than --draft-max %d", o.draft_min, o.draft_max));
  }
  if (spec.type != SpecType::kNone) KVS_RETURN_IF_ERROR(limits.Validate());
  if (o.draft_model && spec.type != SpecType::kDraft) {
    return Status::Error("-md/--model-draft is only used with --spec-type draft");
  }
  if (spec.type == SpecType::kDraft && !o.draft_model) {
    return Status::Error(
        "--spec-type draft needs a draft model: -md/--model-draft FILE (a GGUF with the same "
        "vocabulary)");
  }
  // Shares ownership of the public model, pointing at the model inside it.
  if (o.draft_model) {
    spec.draft_model =
        std::shared_ptr<const Model>(o.draft_model, o.draft_model->impl().model.get());
  }
  if (!o.draft_weights.empty()) {
    KVS_ASSIGN_OR_RETURN(spec.draft_weights, ParseDraftWeights(o.draft_weights));
  }
  spec.draft_window = o.draft_window;
  return spec;
}

// The one test of "needs the prefix cache": flag `verb` the prefix cache's blocks.
Status NeedsPrefixCache(const EngineConfig& ec, const char* flag, const char* verb) {
  if (ec.prefix_caching()) return Status::Ok();
  return Status::Error(StrFormat(
      "%s %s the prefix cache's blocks: it cannot go with --no-prefix-cache", flag, verb));
}

// The disk tier (--kv-disk DIR and its size, policy and codec).
Status ConfigureKvDisk(const EngineOptions& o, EngineConfig* ec) {
  if (o.kv_disk.empty()) return Status::Ok();
  ec->kv_disk.dir = o.kv_disk;
  if (o.kv_disk_size < 0) return Status::Error("--kv-disk-size must not be negative");
  ec->kv_disk.capacity_bytes = static_cast<uint64_t>(o.kv_disk_size);
  auto policy = ParseKvDiskPolicy(o.kv_disk_policy);
  auto codec = ParseBlockCodec(o.kv_disk_codec);
  if (!policy.ok() || !codec.ok()) return !policy.ok() ? policy.status() : codec.status();
  ec->kv_disk.policy = *policy;
  ec->kv_disk.codec = *codec;
  if (*codec == BlockCodec::kTransform) {
    ec->kv_disk.transform_options = *ParseTransformCodec(o.kv_disk_codec);
  }
  return NeedsPrefixCache(*ec, "--kv-disk", "keeps");
}

// The Redis tier (--kv-redis URL and its password file, TTL, timeout, namespace and codec).
Status ConfigureKvRedis(const EngineOptions& o, EngineConfig* ec) {
  if (o.kv_redis.empty()) {
    if (o.kv_redis_password_file.empty()) return Status::Ok();
    return Status::Error("--kv-redis-password-file is only used with --kv-redis URL");
  }
  KVS_RETURN_IF_ERROR(NeedsPrefixCache(*ec, "--kv-redis", "shares"));
  ec->kv_redis.url = o.kv_redis;
  ec->kv_redis.password_file = o.kv_redis_password_file;
  ec->kv_redis.ttl_seconds = o.kv_redis_ttl;
  ec->kv_redis.timeout_ms = o.kv_redis_timeout_ms;
  ec->kv_redis.key_namespace = o.kv_redis_namespace;
  if (o.kv_redis_codec != "zstd") {
    auto tc = ParseTransformCodec(o.kv_redis_codec);
    if (!tc.ok()) {
      return Status::Error("--kv-redis-codec " + o.kv_redis_codec + ": expected zstd or tc:BITS (" +
                           tc.error() + ")");
    }
    ec->kv_redis.transform_options = *tc;
  }
  return Status::Ok();
}

// --kv-events: the publisher's config (opened by the caller, before the engine publishes).
Expected<std::optional<ZmqKvEventPublisherConfig>> KvEventsFromOptions(const EngineOptions& o,
                                                                       const EngineConfig& ec) {
  if (o.kv_events.empty()) {
    if (o.kv_events_replay.empty() && o.kv_events_topic.empty()) {
      return std::optional<ZmqKvEventPublisherConfig>();
    }
    return Status::Error(
        "--kv-events-replay and --kv-events-topic are only used with --kv-events ENDPOINT");
  }
  KVS_RETURN_IF_ERROR(NeedsPrefixCache(ec, "--kv-events", "reports"));
  ZmqKvEventPublisherConfig pc;
  pc.endpoint = o.kv_events;
  pc.replay_endpoint = o.kv_events_replay;
  pc.topic = o.kv_events_topic;
  return std::optional<ZmqKvEventPublisherConfig>(std::move(pc));
}

// The engine's config, its drafter and its KV events, refusing bad options and options that do
// not go together. Sets s->options.kv_memory_bytes when it was left to the default.
Status ConfigureEngine(const ModelConfig& c, const PoolShape& pool, EngineSetup* s) {
  EngineConfig* ec = &s->config;
  KVS_ASSIGN_OR_RETURN(const int64_t n_blocks, PoolBlocks(&s->options, s->geometry, c, pool));
  KVS_RETURN_IF_ERROR(ConfigureScheduler(s->options, n_blocks, pool.watermark_blocks, ec));
  KVS_ASSIGN_OR_RETURN(s->spec, SpecFromOptions(s->options, ec->spec));
  if (ec->eviction.budget.active() && s->spec.type != SpecType::kNone) {
    return Status::Error(
        "--kv-budget and --spec-type cannot be combined yet: drafters read the KV by "
        "position, and a sequence that evicted holds fewer slots than positions");
  }
  KVS_RETURN_IF_ERROR(ConfigureKvDisk(s->options, ec));
  KVS_RETURN_IF_ERROR(ConfigureKvRedis(s->options, ec));
  KVS_ASSIGN_OR_RETURN(s->events, KvEventsFromOptions(s->options, *ec));
  return ec->Validate();
}

// The KV format's options: the cache types, the transform codec where a tier stores blocks with
// it, and --kv-calibration-file's scales.
Expected<KvFormatOptions> KvFormatFromOptions(const EngineSetup& s, const Tokenizer* tokenizer) {
  const EngineOptions& o = s.options;
  KvFormatOptions kv;
  kv.types = {s.geometry.k_type, s.geometry.v_type};
  kv.transform_codec = s.config.kv_disk.codec == BlockCodec::kTransform ||
                       s.config.kv_redis.transform_options.has_value();
  if (!o.kv_calibration_file.empty()) {
    if (tokenizer == nullptr) return Status::Error("--kv-calibration needs the model's tokenizer");
    KVS_RETURN_IF_ERROR(
        UseCalibrationFile(o.kv_calibration_file, *tokenizer, &kv, o.kv_calibration_tokens));
  }
  return kv;
}

}  // namespace

Expected<KvGeometry> CacheGeometry(const ModelConfig& c, int32_t block_size, const std::string& k,
                                   const std::string& v) {
  auto k_type = ParseKvType(k);
  if (!k_type) return Status::Error("--cache-type-k: " + k_type.error());
  auto v_type = ParseKvType(v);
  if (!v_type) return Status::Error("--cache-type-v: " + v_type.error());
  const KvGeometry g = ModelKvGeometry(c, block_size, {*k_type, *v_type});
  KVS_RETURN_IF_ERROR(g.Validate());
  return g;
}

Expected<EngineSetup> ResolveEngineOptions(const kvserve::EngineOptions& options,
                                           const Model& model, const Tokenizer* tokenizer,
                                           const PoolShape& pool) {
  EngineSetup s;
  s.options = options;
  KVS_ASSIGN_OR_RETURN(s.geometry, CacheGeometry(model.config(), options.block_size,
                                                 options.cache_type_k, options.cache_type_v));
  KVS_RETURN_IF_ERROR(CheckParallelism(options));
  KVS_RETURN_IF_ERROR(ConfigureEngine(model.config(), pool, &s));
  s.options.threads = ThreadPool::ResolveThreadCount(options.threads);
  KVS_ASSIGN_OR_RETURN(s.kv, KvFormatFromOptions(s, tokenizer));
  return s;
}

Expected<LocalEngine> BuildLocalEngine(EngineSetup setup, const Model& model,
                                       const Tokenizer* tokenizer, ThreadPool& pool) {
  EngineBuilder builder(model, tokenizer, pool, std::move(setup.kv));
  KVS_RETURN_IF_ERROR(builder.Speculative(std::move(setup.spec)));
  return builder.Local(setup.config);
}

Expected<KvBudget> ParseRequestKvBudget(const std::string& text, const EvictionGuard& guard) {
  return ParseKvBudget(text, guard, "kv_budget");
}

}  // namespace kvs
