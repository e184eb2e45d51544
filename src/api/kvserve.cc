// The embedding API over the engine: model + tokenizer + thread pool, an AsyncEngine, and its
// token dispatcher (streaming detokenization per choice, off the engine's loop).
#include "kvserve/kvserve.h"

#include <cmath>
#include <new>

#include "api/engine_impl.h"
#include "core/memory_info.h"
#include "core/thread_pool.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "kernels/cpu_isa.h"
#include "model/compressed_view.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

std::shared_ptr<Model> Model::Load(const std::string& path, std::string* error) {
  return Load(path, ModelOptions(), error);
}

std::shared_ptr<Model> Model::Load(const std::string& path, const ModelOptions& options,
                                   std::string* error) {
  kvs::ModelLoadOptions load;
  load.check_tensors = options.check_tensors;
  auto model = kvs::Model::Load(path, load);
  if (!model.ok()) {
    *error = model.error();
    return nullptr;
  }
  auto tokenizer = kvs::Tokenizer::FromGguf((*model)->file());
  if (!tokenizer.ok()) {
    *error = path + ": " + tokenizer.error();
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->model = std::move(*model);
  impl->tokenizer = std::move(*tokenizer);
  return std::shared_ptr<Model>(new Model(std::move(impl)));
}

std::vector<int32_t> Model::Tokenize(std::string_view text, bool add_special) const {
  return impl_->tokenizer->Encode(text, add_special, /*parse_special=*/true);
}
std::string CpuIsa() {
  return std::string(kvs::IsaName(kvs::ActiveIsa()));
}

std::string CpuIsaDescription() {
  return kvs::IsaDescription();
}

bool CheckKvBudget(const std::string& text, int32_t kv_sink, int32_t kv_window,
                   std::string* canonical, std::string* error) {
  auto parsed = kvs::ParseKvBudget(text, kvs::EvictionGuard{kv_sink, kv_window}, "kv_budget");
  if (!parsed.ok()) {
    *error = parsed.error();
    return false;
  }
  *canonical = parsed->active() ? parsed->ToString() : std::string();
  return true;
}

std::string Model::Detokenize(const std::vector<int32_t>& tokens) const {
  return impl_->tokenizer->Decode(tokens);
}
std::string Model::TokenText(int32_t token) const {
  return impl_->tokenizer->TokenToPiece(token, /*show_special=*/true);
}
std::string Model::ChatTemplate() const {
  return impl_->model->file().GetString("tokenizer.chat_template").value_or("");
}
int32_t Model::eos_token() const {
  return impl_->tokenizer->eos_id();
}
bool Model::IsEndOfGeneration(int32_t token) const {
  return impl_->tokenizer->IsEndOfGeneration(token);
}
int32_t Model::bos_token() const {
  return impl_->tokenizer->bos_id();
}
int32_t Model::n_vocab() const {
  return impl_->model->config().n_vocab;
}
int32_t Model::n_ctx_train() const {
  return impl_->model->config().n_ctx_train;
}
const std::string& Model::name() const {
  return impl_->model->config().name;
}
std::string Model::weights_digest() const {
  return impl_->model->weights_digest().Hex();
}
namespace {

kvs::Expected<kvs::KvGeometry> CacheGeometry(const kvs::ModelConfig& c, int32_t block_size,
                                             const std::string& k, const std::string& v) {
  auto k_type = kvs::ParseKvType(k);
  if (!k_type) return kvs::Status::Error("--cache-type-k: " + k_type.error());
  auto v_type = kvs::ParseKvType(v);
  if (!v_type) return kvs::Status::Error("--cache-type-v: " + v_type.error());
  const kvs::KvGeometry g = kvs::ModelKvGeometry(c, block_size, {*k_type, *v_type});
  KVS_RETURN_IF_ERROR(g.Validate());
  return g;
}

}  // namespace

double Model::kv_bytes_per_token(const std::string& cache_type_k,
                                 const std::string& cache_type_v) const {
  auto g = CacheGeometry(impl_->model->config(), 16, cache_type_k, cache_type_v);
  return g ? g->BytesPerToken() : -1.0;
}

kvs::RequestOptions ToRequestOptions(const GenerationOptions& g, const kvs::Digest128& weights,
                                     const kvs::KvFormat& format,
                                     const std::vector<int32_t>& end_of_generation) {
  kvs::RequestOptions r;
  r.cache_key = kvs::ModelCacheKey(weights, format, g.cache_salt);
  r.max_tokens = g.max_tokens;
  r.n = g.n;
  r.priority = g.priority;
  r.sampling.temperature = g.temperature;
  r.sampling.top_k = g.top_k;
  r.sampling.top_p = g.top_p;
  r.sampling.min_p = g.min_p;
  r.sampling.repeat_penalty = g.repeat_penalty;
  r.sampling.repeat_last_n = g.repeat_last_n;
  r.sampling.frequency_penalty = g.frequency_penalty;
  r.sampling.presence_penalty = g.presence_penalty;
  r.sampling.seed = g.seed;
  r.stop_ids = g.stop_tokens;
  r.logprobs = g.logprobs;
  r.speculative = g.speculative;
  if (!g.ignore_eos) {
    r.stop_ids.insert(r.stop_ids.end(), end_of_generation.begin(), end_of_generation.end());
  }
  return r;
}

namespace {

// -c, -np and -t on their own.
kvs::Status CheckParallelism(const EngineOptions& o) {
  if (o.n_ctx < 2 || o.n_parallel < 1 || o.threads < 0) {
    return kvs::Status::Error("-c must be at least 2, -np at least 1 and -t not negative");
  }
  // Before the default KV size, which grows with -np, turns an absurd -np into a memory error.
  if (o.n_parallel > kvs::kMaxParallelSequences) {
    return kvs::Status::Error(kvs::StrFormat("-np %d: must be between 1 and %d", o.n_parallel,
                                             kvs::kMaxParallelSequences));
  }
  return kvs::Status::Ok();
}

// The KV pool's size in blocks. Sets o->kv_memory_bytes when it was left to the default.
kvs::Expected<int64_t> KvPoolBlocks(EngineOptions* o, const kvs::KvGeometry& geometry) {
  const int64_t block_bytes = static_cast<int64_t>(geometry.BytesPerBlock());
  const int64_t blocks_per_seq = (int64_t{o->n_ctx} + o->block_size - 1) / o->block_size;
  const int64_t available = kvs::AvailableRamBytes();
  if (o->kv_memory_bytes <= 0) {
    // n_parallel full sequences, the null block, and the 1% admission watermark on top.
    const double blocks =
        std::ceil((static_cast<double>(blocks_per_seq) * o->n_parallel + 1) * 1.02) + 1;
    const double want = blocks * block_bytes;
    o->kv_memory_bytes = static_cast<int64_t>(std::min<double>(want, available / 2));
  }
  if (o->kv_memory_bytes > available) {
    return kvs::Status::Error(
        kvs::StrFormat("--kv-memory %.2f GiB is more than the %.2f GiB of RAM available",
                       o->kv_memory_bytes / double(1 << 30), available / double(1 << 30)));
  }
  const int64_t n_blocks = o->kv_memory_bytes / block_bytes;
  if (n_blocks < 2 || n_blocks > (int64_t{1} << 30)) {
    return kvs::Status::Error(kvs::StrFormat(
        "--kv-memory %lld bytes holds %lld blocks of %lld bytes (%d positions); need at least 2",
        static_cast<long long>(o->kv_memory_bytes), static_cast<long long>(n_blocks),
        static_cast<long long>(block_bytes), o->block_size));
  }
  return n_blocks;
}

// The scheduler's part of the config: sequences, batches, blocks, and token eviction.
kvs::Status ConfigureScheduler(const EngineOptions& o, int64_t n_blocks, kvs::EngineConfig* ec) {
  ec->n_ctx = o.n_ctx;
  ec->max_seqs = o.n_parallel;
  ec->max_batch_tokens = o.max_batch_tokens;
  ec->max_step_ms = o.max_step_ms;
  ec->block_size = o.block_size;
  ec->n_blocks = static_cast<int32_t>(n_blocks);
  ec->reserve_full_context = o.reserve_full_context;
  ec->prefix_cache = o.prefix_cache;
  ec->eviction.guard = {o.kv_sink, o.kv_window};
  ec->eviction.policy = o.evict_policy;
  ec->eviction.every = o.evict_every;
  KVS_ASSIGN_OR_RETURN(ec->eviction.budget, kvs::ParseKvBudget(o.kv_budget, ec->eviction.guard));
  ec->spec.draft_max = o.draft_max;
  ec->spec.draft_min = o.draft_min;
  return kvs::Status::Ok();
}

// --spec-type and its drafter: -md's model or --draft-weights' view. limits: --draft-max/min.
kvs::Expected<kvs::SpecOptions> SpecFromOptions(const EngineOptions& o,
                                                const kvs::SpecConfig& limits) {
  kvs::SpecOptions spec;
  KVS_ASSIGN_OR_RETURN(spec.type, kvs::ParseSpecType(o.spec_type));
  if (spec.type != kvs::SpecType::kNone) KVS_RETURN_IF_ERROR(limits.Validate());
  if (o.draft_model && spec.type != kvs::SpecType::kDraft) {
    return kvs::Status::Error("-md/--model-draft is only used with --spec-type draft");
  }
  // Shares ownership of the public model, pointing at the model inside it.
  if (o.draft_model) {
    spec.draft_model =
        std::shared_ptr<const kvs::Model>(o.draft_model, o.draft_model->impl().model.get());
  }
  if (!o.draft_weights.empty()) {
    KVS_ASSIGN_OR_RETURN(spec.draft_weights, kvs::ParseDraftWeights(o.draft_weights));
  }
  spec.draft_window = o.draft_window;
  return spec;
}

// The disk tier (--kv-disk DIR and its size, policy and codec).
kvs::Status ConfigureKvDisk(const EngineOptions& o, kvs::EngineConfig* ec) {
  if (o.kv_disk.empty()) return kvs::Status::Ok();
  ec->kv_disk.dir = o.kv_disk;
  if (o.kv_disk_size < 0) return kvs::Status::Error("--kv-disk-size must not be negative");
  ec->kv_disk.capacity_bytes = static_cast<uint64_t>(o.kv_disk_size);
  auto policy = kvs::ParseKvDiskPolicy(o.kv_disk_policy);
  auto codec = kvs::ParseBlockCodec(o.kv_disk_codec);
  if (!policy.ok() || !codec.ok()) return !policy.ok() ? policy.status() : codec.status();
  ec->kv_disk.policy = *policy;
  ec->kv_disk.codec = *codec;
  if (*codec == kvs::BlockCodec::kTransform) {
    ec->kv_disk.transform_options = *kvs::ParseTransformCodec(o.kv_disk_codec);
  }
  if (!o.prefix_cache || o.reserve_full_context) {
    return kvs::Status::Error(
        "--kv-disk keeps the prefix cache's blocks: it cannot go with --no-prefix-cache");
  }
  return kvs::Status::Ok();
}

// The Redis tier (--kv-redis URL and its password file, TTL, timeout, namespace and codec).
kvs::Status ConfigureKvRedis(const EngineOptions& o, kvs::EngineConfig* ec) {
  if (o.kv_redis.empty()) {
    if (o.kv_redis_password_file.empty()) return kvs::Status::Ok();
    return kvs::Status::Error("--kv-redis-password-file is only used with --kv-redis URL");
  }
  if (!o.prefix_cache || o.reserve_full_context) {
    return kvs::Status::Error(
        "--kv-redis shares the prefix cache's blocks: it cannot go with --no-prefix-cache");
  }
  ec->kv_redis.url = o.kv_redis;
  ec->kv_redis.password_file = o.kv_redis_password_file;
  ec->kv_redis.ttl_seconds = o.kv_redis_ttl;
  ec->kv_redis.timeout_ms = o.kv_redis_timeout_ms;
  ec->kv_redis.key_namespace = o.kv_redis_namespace;
  if (o.kv_redis_codec != "zstd") {
    auto tc = kvs::ParseTransformCodec(o.kv_redis_codec);
    if (!tc.ok()) {
      return kvs::Status::Error("--kv-redis-codec " + o.kv_redis_codec +
                                ": expected zstd or tc:BITS (" + tc.error() + ")");
    }
    ec->kv_redis.transform_options = *tc;
  }
  return kvs::Status::Ok();
}

// The engine's config and its drafter, refusing bad options and options that do not go
// together. Sets o->kv_memory_bytes when it was left to the default.
kvs::Status ConfigureEngine(EngineOptions* o, const kvs::KvGeometry& geometry,
                            kvs::EngineConfig* ec, kvs::SpecOptions* spec) {
  KVS_ASSIGN_OR_RETURN(const int64_t n_blocks, KvPoolBlocks(o, geometry));
  KVS_RETURN_IF_ERROR(ConfigureScheduler(*o, n_blocks, ec));
  KVS_ASSIGN_OR_RETURN(*spec, SpecFromOptions(*o, ec->spec));
  if (ec->eviction.budget.active() && spec->type != kvs::SpecType::kNone) {
    return kvs::Status::Error(
        "--kv-budget and --spec-type cannot be combined yet: drafters read the KV by "
        "position, and a sequence that evicted holds fewer slots than positions");
  }
  KVS_RETURN_IF_ERROR(ConfigureKvDisk(*o, ec));
  KVS_RETURN_IF_ERROR(ConfigureKvRedis(*o, ec));
  return ec->Validate();
}

// The KV format's options: the cache types, the transform codec where a tier stores blocks with
// it, and --kv-calibration-file's scales.
kvs::Expected<kvs::KvFormatOptions> KvFormatFromOptions(const EngineOptions& o,
                                                        const kvs::KvGeometry& geometry,
                                                        const kvs::EngineConfig& ec,
                                                        const kvs::Tokenizer& tokenizer) {
  kvs::KvFormatOptions kv;
  kv.types = {geometry.k_type, geometry.v_type};
  kv.transform_codec =
      ec.kv_disk.codec == kvs::BlockCodec::kTransform || ec.kv_redis.transform_options.has_value();
  if (!o.kv_calibration_file.empty()) {
    KVS_RETURN_IF_ERROR(
        kvs::UseCalibrationFile(o.kv_calibration_file, tokenizer, &kv, o.kv_calibration_tokens));
  }
  return kv;
}

// --kv-events: the publisher of the prefix cache's blocks, opened before the engine that
// publishes into it.
kvs::Status OpenKvEvents(Engine::Impl* impl, kvs::EngineConfig* ec) {
  const EngineOptions& o = impl->options;
  if (o.kv_events.empty()) {
    if (o.kv_events_replay.empty() && o.kv_events_topic.empty()) return kvs::Status::Ok();
    return kvs::Status::Error(
        "--kv-events-replay and --kv-events-topic are only used with --kv-events ENDPOINT");
  }
  if (!o.prefix_cache || o.reserve_full_context) {
    return kvs::Status::Error(
        "--kv-events reports the prefix cache's blocks: it cannot go with --no-prefix-cache");
  }
  kvs::ZmqKvEventPublisherConfig pc;
  pc.endpoint = o.kv_events;
  pc.replay_endpoint = o.kv_events_replay;
  pc.topic = o.kv_events_topic;
  KVS_ASSIGN_OR_RETURN(impl->events, kvs::ZmqKvEventPublisher::Open(pc));
  ec->kv_event_sink = impl->events.get();
  return kvs::Status::Ok();
}

// Builds impl's engine (allocating its KV cache) on impl's pool, then, with a disk tier, opens
// the KV documents and pins their blocks.
kvs::Status BuildEngine(Engine::Impl* impl, kvs::EngineConfig ec, kvs::KvFormatOptions kv,
                        kvs::SpecOptions spec) {
  const Model::Impl& model = impl->model->impl();
  kvs::EngineBuilder builder(*model.model, model.tokenizer.get(), *impl->pool, std::move(kv));
  KVS_RETURN_IF_ERROR(builder.Speculative(std::move(spec)));
  KVS_ASSIGN_OR_RETURN(impl->kv_format, builder.Format(ec.block_size, ec.n_ctx));
  KVS_RETURN_IF_ERROR(OpenKvEvents(impl, &ec));
  impl->dispatcher = std::make_unique<TokenDispatcher>(*model.tokenizer, &impl->tier_labels);
  KVS_ASSIGN_OR_RETURN(impl->engine,
                       builder.Async(ec, [d = impl->dispatcher.get()] { d->Flush(); }));
  // Before any request (so before any event reads them): the tiers' labels, in list order.
  for (const auto& tier : impl->engine->tiers()) impl->tier_labels.emplace_back(tier->name());
  if (kvs::KvTier* tier = impl->engine->tier("disk")) {
    KVS_ASSIGN_OR_RETURN(impl->documents, kvs::KvDocuments::Open(impl->options.kv_disk));
    for (const kvs::BlockHash& h : impl->documents->PinnedBlocks()) tier->store().Pin(h, true);
  }
  return kvs::Status::Ok();
}

// One tier's totals for EngineStats (a remote store's dropped blocks include its failed writes:
// either way the block is not there).
TierStats ToTierStats(const kvs::KvTier& tier) {
  const kvs::KvTierStats t = tier.stats();
  TierStats out;
  out.name = std::string(tier.name());
  out.up = t.up;
  out.hits = t.hits;
  out.misses = t.misses;
  out.corrupt = t.corrupt;
  out.bytes_read = t.bytes_read;
  out.read_seconds = t.load_seconds;
  out.bytes_written = t.bytes_written;
  out.payload_bytes_written = t.payload_bytes_written;
  out.blocks_written = t.blocks_written;
  out.dropped = t.dropped + t.write_errors;
  out.errors = t.errors;
  out.usage_bytes = t.usage_bytes;
  out.capacity_bytes = t.capacity_bytes;
  out.blocks = t.blocks_stored;
  return out;
}

// Every configured tier in lookup order; one that is off since the start (a directory it could
// not write) is listed down, with nothing counted.
std::vector<TierStats> TierStatsOf(const kvs::AsyncEngine& engine) {
  std::vector<TierStats> out;
  for (const kvs::TierKind& kind : kvs::TierKinds()) {
    if (const kvs::KvTier* tier = engine.tier(kind.name)) {
      out.push_back(ToTierStats(*tier));
    } else if (kind.configured(engine.config())) {
      TierStats off;
      off.name = std::string(kind.name);
      off.usage_bytes = off.capacity_bytes = off.blocks = 0;  // it holds nothing
      out.push_back(std::move(off));
    }
  }
  return out;
}

}  // namespace

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() {
  if (impl_ && impl_->engine) impl_->engine->Shutdown();
  // The shutdown's cancellations are queued: their callbacks run before ~Engine returns.
  if (impl_ && impl_->dispatcher) impl_->dispatcher->Drain();
}

std::unique_ptr<Engine> Engine::Start(std::shared_ptr<const Model> model,
                                      const EngineOptions& options, std::string* error) {
  const kvs::ModelConfig& mc = model->impl().model->config();
  auto cache = CacheGeometry(mc, options.block_size, options.cache_type_k, options.cache_type_v);
  if (!cache) {
    *error = cache.error();
    return nullptr;
  }
  const kvs::KvGeometry geometry = *cache;
  if (auto st = CheckParallelism(options); !st.ok()) {
    *error = st.message();
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->model = model;
  impl->options = options;
  EngineOptions& o = impl->options;
  kvs::EngineConfig ec;
  kvs::SpecOptions spec;
  if (auto st = ConfigureEngine(&o, geometry, &ec, &spec); !st.ok()) {
    *error = st.message();
    return nullptr;
  }
  o.threads = kvs::ThreadPool::ResolveThreadCount(o.threads);
  impl->pool = std::make_unique<kvs::ThreadPool>(o.threads);
  const kvs::Tokenizer* tokenizer = model->impl().tokenizer.get();
  auto kv = KvFormatFromOptions(o, geometry, ec, *tokenizer);
  if (!kv.ok()) {
    *error = kv.error();
    return nullptr;
  }
  for (int32_t id = 0; id < mc.n_vocab; ++id) {
    if (tokenizer->IsEndOfGeneration(id)) impl->end_of_generation.push_back(id);
  }
  // The KV cache is allocated here, all at once: under a memory limit (ulimit -v, a container)
  // that can fail even below the available RAM, which is a bad option, not a crash.
  try {
    if (auto st = BuildEngine(impl.get(), std::move(ec), std::move(*kv), std::move(spec));
        !st.ok()) {
      *error = st.message();
      return nullptr;
    }
  } catch (const std::bad_alloc&) {
    *error = kvs::StrFormat("cannot allocate the KV cache (%.2f GiB): lower --kv-memory or -np",
                            o.kv_memory_bytes / double(1 << 30));
    return nullptr;
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

uint64_t Engine::Submit(std::vector<int32_t> prompt, const GenerationOptions& options,
                        TokenCallback on_token, std::string* error) {
  const Model& model = *impl_->model;
  // The engine's thread only queues the request's events; the dispatcher's thread detokenizes
  // them and runs on_token.
  kvs::TokenCallback callback = impl_->dispatcher->Bind(std::move(on_token));
  kvs::RequestOptions request = ToRequestOptions(options, model.impl().model->weights_digest(),
                                                 *impl_->kv_format, impl_->end_of_generation);
  auto budget =
      kvs::ParseKvBudget(options.kv_budget, impl_->engine->config().eviction.guard, "kv_budget");
  if (!budget.ok()) {
    *error = budget.error();
    return 0;
  }
  request.kv_budget = *budget;
  auto id = impl_->engine->Submit(std::move(prompt), std::move(request), std::move(callback));
  if (!id.ok()) {
    *error = id.error();
    return 0;
  }
  return static_cast<uint64_t>(*id);
}

void Engine::Cancel(uint64_t request) {
  impl_->engine->Cancel(static_cast<kvs::RequestId>(request));
}

void Engine::CancelAll() {
  impl_->engine->CancelAll();
}

EngineStats Engine::stats() const {
  const kvs::EngineLoad load = impl_->engine->load();
  EngineStats s;
  s.running = load.running;
  s.waiting = load.waiting;
  s.kv_blocks_free = load.free_blocks;
  s.kv_blocks_total = load.usable_blocks;
  s.block_size = impl_->options.block_size;
  s.steps = load.steps;
  s.tokens_computed = load.tokens_computed;
  s.preemptions = load.preemptions;
  s.prefix_cache_queries = load.prefix_queries;
  s.prefix_cache_hits = load.prefix_hits;
  s.spec_drafts = load.spec_drafts;
  s.spec_draft_tokens = load.spec_draft_tokens;
  s.spec_accepted_tokens = load.spec_accepted_tokens;
  s.evicted_tokens = load.evicted_tokens;
  s.compactions = load.compactions;
  s.blocks_freed_by_compaction = load.blocks_freed_by_compaction;
  s.tiers = TierStatsOf(*impl_->engine);
  return s;
}

const EngineOptions& Engine::options() const {
  return impl_->options;
}

std::string Engine::kv_format() const {
  return impl_->kv_format->Describe();
}

std::string Engine::kv_format_fingerprint() const {
  return impl_->kv_format->fingerprint().Hex();
}

std::vector<std::string> TierNames() {
  return kvs::TierNames();
}

const TierStats* EngineStats::tier(std::string_view name) const {
  for (const TierStats& t : tiers) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

int32_t TokenEvent::TokensFrom(std::string_view tier) const {
  for (const TierTokens& t : tier_tokens) {
    if (t.tier == tier) return t.tokens;
  }
  return 0;
}

}  // namespace kvserve
