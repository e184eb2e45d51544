// The embedding API over the engine: model + tokenizer + thread pool, an AsyncEngine, and its
// token dispatcher (streaming detokenization per choice, off the engine's loop).
#include "kvserve/kvserve.h"

#include <new>

#include "api/engine_impl.h"
#include "api/engine_setup.h"
#include "core/thread_pool.h"
#include "engine/async_engine.h"
#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "kernels/cpu_isa.h"
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
  auto parsed = kvs::ParseRequestKvBudget(text, kvs::EvictionGuard{kv_sink, kv_window});
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
double Model::kv_bytes_per_token(const std::string& cache_type_k,
                                 const std::string& cache_type_v) const {
  auto g = kvs::CacheGeometry(impl_->model->config(), 16, cache_type_k, cache_type_v);
  return g ? g->BytesPerToken() : -1.0;
}
int64_t Model::kv_blocks_per_sequence(int64_t positions, int32_t block_size,
                                      int32_t max_batch_tokens) const {
  if (positions <= 0 || block_size <= 0) return 0;
  return kvs::PeakBlocks(impl_->model->config().kv_groups, positions, block_size,
                         std::max(1, max_batch_tokens));
}
int64_t Model::kv_bytes_per_sequence(int64_t positions, int32_t block_size,
                                     int32_t max_batch_tokens, const std::string& cache_type_k,
                                     const std::string& cache_type_v) const {
  const kvs::ModelConfig& c = impl_->model->config();
  auto g = kvs::CacheGeometry(c, block_size, cache_type_k, cache_type_v);
  if (!g) return -1;
  return kv_blocks_per_sequence(positions, block_size, max_batch_tokens) *
         static_cast<int64_t>(kvs::SlabBlockBytes(*g, c.kv_slabs()));
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

// --kv-events: the publisher of the prefix cache's blocks, opened before the engine that
// publishes into it.
kvs::Status OpenKvEvents(Engine::Impl* impl, const kvs::EngineSetup& setup, kvs::EngineConfig* ec) {
  if (!setup.events) return kvs::Status::Ok();
  KVS_ASSIGN_OR_RETURN(impl->events, kvs::ZmqKvEventPublisher::Open(*setup.events));
  ec->kv_event_sink = impl->events.get();
  return kvs::Status::Ok();
}

// Builds impl's engine (allocating its KV cache) on impl's pool, then, with a disk tier, opens
// the KV documents and pins their blocks.
kvs::Status BuildEngine(Engine::Impl* impl, kvs::EngineSetup setup) {
  const Model::Impl& model = impl->model->impl();
  kvs::EngineConfig ec = setup.config;
  kvs::EngineBuilder builder(*model.model, model.tokenizer.get(), *impl->pool, std::move(setup.kv));
  KVS_RETURN_IF_ERROR(builder.Speculative(std::move(setup.spec)));
  KVS_ASSIGN_OR_RETURN(impl->kv_format, builder.Format(ec.block_size, ec.n_ctx));
  KVS_RETURN_IF_ERROR(OpenKvEvents(impl, setup, &ec));
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
  const Model::Impl& m = model->impl();
  auto setup = kvs::ResolveEngineOptions(options, *m.model, m.tokenizer.get());
  if (!setup.ok()) {
    *error = setup.error();
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->model = model;
  impl->options = setup->options;
  impl->pool = std::make_unique<kvs::ThreadPool>(impl->options.threads);
  for (int32_t id = 0; id < m.model->config().n_vocab; ++id) {
    if (m.tokenizer->IsEndOfGeneration(id)) impl->end_of_generation.push_back(id);
  }
  // The KV cache is allocated here, all at once: under a memory limit (ulimit -v, a container)
  // that can fail even below the available RAM, which is a bad option, not a crash.
  try {
    if (auto st = BuildEngine(impl.get(), std::move(*setup)); !st.ok()) {
      *error = st.message();
      return nullptr;
    }
  } catch (const std::bad_alloc&) {
    *error = kvs::StrFormat("cannot allocate the KV cache (%.2f GiB): lower --kv-memory or -np",
                            impl->options.kv_memory_bytes / double(1 << 30));
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
      kvs::ParseRequestKvBudget(options.kv_budget, impl_->engine->config().eviction.guard);
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
