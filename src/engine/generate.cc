#include "engine/generate.h"

#include <unistd.h>
#include <algorithm>

#include <chrono>

#include "model/forward.h"

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

  SimpleKvCache cache(c, cache_tokens);
  ForwardPass forward(model, pool);
  Sampler sampler(options.sampling, c.n_vocab);
  std::vector<float> logits(c.n_vocab);
  std::vector<int32_t> history = prompt;
  GenerateStats stats;
  stats.n_prompt = static_cast<int32_t>(prompt.size());

  auto t0 = std::chrono::steady_clock::now();
  KVS_RETURN_IF_ERROR(forward.Run(prompt.data(), stats.n_prompt, 0, cache, 1, logits.data()));
  stats.prompt_seconds = SecondsSince(t0);

  auto t1 = std::chrono::steady_clock::now();
  for (int32_t step = 0; step < budget; ++step) {
    int32_t token = sampler.Sample(logits.data(), history);
    history.push_back(token);
    ++stats.n_generated;
    bool stop = std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
                options.stop_ids.end();
    if (!on_token(token) || stop || step + 1 == budget) break;
    KVS_RETURN_IF_ERROR(
        forward.Run(&token, 1, static_cast<int32_t>(history.size()) - 1, cache, 1, logits.data()));
  }
  stats.generate_seconds = SecondsSince(t1);
  return stats;
}

}  // namespace kvs
