#include "api/generate.h"

#include <unistd.h>
#include <algorithm>

#include <chrono>

#include "api/engine_setup.h"

namespace kvs {
namespace {
double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

Expected<GenerateStats> Generate(const Model& model, const std::vector<int32_t>& prompt,
                                 const GenerateOptions& options, ThreadPool& pool,
                                 const std::function<bool(int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  if (prompt.empty()) return Status::Error("the prompt is empty (no tokens to start from)");
  KVS_RETURN_IF_ERROR(options.sampling.Validate());
  const int32_t n_ctx = options.n_ctx > 0 ? options.n_ctx : c.n_ctx_train;
  if (static_cast<int64_t>(prompt.size()) >= n_ctx) {
    return Status::Error(StrFormat(
        "the prompt has %zu tokens, which does not fit the context of %d", prompt.size(), n_ctx));
  }
  int32_t budget = n_ctx - static_cast<int32_t>(prompt.size());
  if (options.n_predict >= 0) budget = std::min(budget, options.n_predict);
  // The cache holds only what this request can use, not the whole context window.
  const int32_t cache_tokens = static_cast<int32_t>(prompt.size()) + budget;
  const double cache_bytes =
      static_cast<double>(sizeof(float)) * c.n_layer * (c.k_dim() + c.v_dim()) * cache_tokens;
  const double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (ram > 0 && cache_bytes > 0.75 * ram) {
    return Status::Error(
        StrFormat("a KV cache for %d tokens needs %.1f GiB, more than this machine has; "
                  "lower -c or -n",
                  cache_tokens, cache_bytes / (1 << 30)));
  }

  if (budget == 0) return GenerateStats{static_cast<int32_t>(prompt.size()), 0, 0, 0};
  // One request through the engine, in a pool of just the blocks it can use (f32 K/V).
  kvserve::EngineOptions eo;
  eo.n_ctx = cache_tokens + 1;  // the last sampled token is never computed
  eo.n_parallel = 1;
  eo.block_size = kKvBlockTokens;
  eo.cache_type_k = eo.cache_type_v = "f32";
  const PoolShape shape{(cache_tokens + kKvBlockTokens - 1) / kKvBlockTokens + 1, 0};
  KVS_ASSIGN_OR_RETURN(EngineSetup setup, ResolveEngineOptions(eo, model, nullptr, shape));
  KVS_ASSIGN_OR_RETURN(LocalEngine local, BuildLocalEngine(std::move(setup), model, nullptr, pool));
  Engine& engine = *local.engine;
  RequestOptions ro;
  ro.sampling = options.sampling;
  ro.max_tokens = budget;
  ro.stop_ids = options.stop_ids;

  GenerateStats stats;
  stats.n_prompt = static_cast<int32_t>(prompt.size());
  bool stop = false;
  const auto t0 = std::chrono::steady_clock::now();
  auto t1 = t0;
  auto id = engine.Submit(prompt, ro, [&](const TokenEvent& e) {
    if (e.token < 0) return;
    if (stats.n_generated++ == 0) {
      t1 = std::chrono::steady_clock::now();
      stats.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
    }
    if (!on_token(e.token)) stop = true;
  });
  if (!id.ok()) return id.status();
  while (engine.HasWork()) {
    KVS_RETURN_IF_ERROR(engine.Step());
    if (stop) engine.Cancel(*id);
  }
  if (stats.n_generated > 0) stats.generate_seconds = SecondsSince(t1);
  return stats;
}

}  // namespace kvs
