#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/thread_pool.h"
#include "engine/key_offsets.h"
#include "engine/kv_format_factory.h"
#include "engine/perplexity.h"
#include "kernels/kv_types.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {

Runner AddPerplexityCommand(CLI::App& root) {
  struct Args {
    std::string model, file;
    int32_t n_ctx = 512;
    int32_t threads = ThreadPool::DefaultThreadCount();
    int32_t max_chunks = -1;
    bool json = false;
    std::string cache_type_k = "f32", cache_type_v = "f32";
    bool kl_base = false;
    std::string kl_base_type = "f32";
    std::string kv_calibration;
    kvserve::ModelOptions model_options;
    std::string kv_budget;
    EvictionConfig eviction;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = root.add_subcommand(
      "perplexity", "Chunked perplexity of a text, as llama-perplexity computes it");
  cmd->add_option("-m,--model", a->model, "GGUF model file");
  cmd->add_option("-f,--file", a->file, std::string("Text file (") + kInputFileHelp + ")")
      ->required();
  AddModelFlags(cmd, &a->model_options);
  cmd->add_option("-c,--ctx-size", a->n_ctx, "Tokens per chunk")
      ->capture_default_str()
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_option("-t,--threads", a->threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--chunks", a->max_chunks, "Score at most this many chunks (-1: all)")
      ->capture_default_str();
  cmd->add_option("--cache-type-k", a->cache_type_k,
                  "KV cache type of keys: " + KvTypeNames() + "; also -ctk")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", a->cache_type_v, "KV cache type of values; also -ctv")
      ->capture_default_str();
  cmd->add_flag("--kl-base", a->kl_base,
                "Also run an f32 KV cache over the same chunks and report the change in "
                "perplexity, the mean KL divergence from it and the top-1 agreement");
  cmd->add_option("--kl-base-type", a->kl_base_type,
                  "KV cache type (K and V) of the --kl-base run: f32, f16 or bf16 (f16 matches "
                  "llama-perplexity's base with flash attention)")
      ->capture_default_str();
  cmd->add_option("--kv-calibration", a->kv_calibration, kKvCalibrationHelp);
  cmd->add_flag("--json", a->json, "Print one JSON object with the result");
  cmd->add_option("--kv-budget", a->kv_budget,
                  "Token eviction: positions each chunk keeps (e.g. 128) or a share of its "
                  "length (25%): the first half is prefilled and evicted, the scored half "
                  "decoded token by token, evicting as generation does");
  cmd->add_option("--kv-sink", a->eviction.guard.sink, "Token eviction: first positions kept")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-window", a->eviction.guard.window,
                  "Token eviction: most recent positions kept")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--evict-policy", a->eviction.policy,
                  "Token eviction policy: streaming, keydiff, h2o, snapkv, tri")
      ->capture_default_str()
      ->check(CLI::IsMember({"keydiff", "streaming", "h2o", "snapkv", "tri"}));
  cmd->add_option("--evict-every", a->eviction.every,
                  "Token eviction: decode steps between evictions (0: a block past the budget)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  return [a]() -> int {
    PerplexityOptions options;
    auto budget = ParseKvBudget(a->kv_budget, a->eviction.guard);
    if (!budget.ok()) {
      std::fprintf(stderr, "error: %s\n", budget.error().c_str());
      return 1;
    }
    options.eviction = a->eviction;
    options.eviction.budget = *budget;
    for (auto [name, type] : {std::pair{&a->cache_type_k, &options.kv.types.k},
                              std::pair{&a->cache_type_v, &options.kv.types.v}}) {
      auto parsed = ParseKvType(*name);
      if (!parsed) {
        std::fprintf(stderr, "error: %s\n", parsed.error().c_str());
        return 1;
      }
      *type = *parsed;
    }
    auto base_type = ParseKvType(a->kl_base_type);
    if (!base_type) {
      std::fprintf(stderr, "error: --kl-base-type: %s\n", base_type.error().c_str());
      return 1;
    }
    options.base_types = KvTypes{*base_type, *base_type};
    std::string path = a->model;
    LoadedModel loaded;
    std::vector<int32_t> ids;
    if (!LoadScoredText(&path, a->file, a->model_options.check_tensors, a->max_chunks, a->n_ctx,
                        &loaded, &ids)) {
      return 1;
    }
    const Model& model = *loaded.model;
    const Tokenizer& tok = *loaded.tokenizer;
    ThreadPool pool(ThreadPool::ResolveThreadCount(a->threads));
    const int32_t bos = tok.add_bos() ? tok.bos_id() : -1;
    options.n_ctx = a->n_ctx;
    options.bos_id = bos;
    options.kl_base = a->kl_base;
    options.tokenizer = &tok;
    if (!a->kv_calibration.empty()) {
      if (Status st = UseCalibrationFile(a->kv_calibration, tok, &options.kv); !st.ok()) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
      }
    } else if (KvTypeIsQuantized(options.kv.types.k)) {
      options.kv.calibration_tokens = KeyCalibrationTokens(&tok, model.config().n_vocab);
    }
    auto r = ComputePerplexity(model, ids, options, pool, [&](int32_t i, double ppl) {
      if (!a->json) std::fprintf(stderr, "[%d] %.4f\n", i + 1, ppl);
    });
    if (!r) {
      std::fprintf(stderr, "error: %s\n", r.error().c_str());
      return 1;
    }
    if (a->json) {
      nlohmann::json j = {
          {"ppl", r->ppl},           {"nll", r->nll},           {"nll_stderr", r->nll_stddev},
          {"n_tokens", r->n_tokens}, {"n_chunks", r->n_chunks}, {"n_scored", r->n_scored},
          {"n_ctx", a->n_ctx},       {"seconds", r->seconds}};
      const ModelConfig& c = model.config();
      j["cache_type_k"] = a->cache_type_k;
      j["cache_type_v"] = a->cache_type_v;
      j["bits_k"] = KvBitsPerElement(options.kv.types.k, c.head_dim_k);
      j["bits_v"] = KvBitsPerElement(options.kv.types.v, c.head_dim_v);
      if (r->has_eviction) {
        j["kv_budget"] = options.eviction.budget.ToString();
        j["evict_policy"] = options.eviction.policy;
        j["kv_sink"] = options.eviction.guard.sink;
        j["kv_window"] = options.eviction.guard.window;
        j["kv_kept_pct"] = r->kv_kept_pct;
        j["evicted_tokens"] = r->evicted_tokens;
      }
      if (r->has_base) {
        j["base_cache_type"] = a->kl_base_type;
        j["base_ppl"] = r->base_ppl;
        j["delta_ppl_pct"] = 100.0 * (r->ppl / r->base_ppl - 1.0);
        j["delta_ppl_stderr_pct"] = r->delta_ppl_stderr_pct;
        j["kl_mean"] = r->kl_mean;
        j["kl_stderr"] = r->kl_stderr;
        j["top1_agree_pct"] = r->top1_agree_pct;
      }
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "perplexity: %.4f +/- %.4f (nll %.5f) over %d chunks of %d tokens, %lld tokens scored, "
          "%.1f s\n",
          r->ppl, r->ppl * r->nll_stddev, r->nll, r->n_chunks, a->n_ctx,
          static_cast<long long>(r->n_scored), r->seconds);
      if (r->has_eviction) {
        std::printf(
            "token eviction: --kv-budget %s --evict-policy %s kept %.1f%% of the context "
            "on average (%lld positions evicted)\n",
            options.eviction.budget.ToString().c_str(), options.eviction.policy.c_str(),
            r->kv_kept_pct, static_cast<long long>(r->evicted_tokens));
      }
      if (r->has_base) {
        std::printf(
            "vs %s KV (perplexity %.4f): %+.3f%% +/- %.3f%% perplexity, mean KL %.6f +/- "
            "%.6f, top-1 agreement %.2f%%\n",
            a->kl_base_type.c_str(), r->base_ppl, 100.0 * (r->ppl / r->base_ppl - 1.0),
            r->delta_ppl_stderr_pct, r->kl_mean, r->kl_stderr, r->top1_agree_pct);
      }
    }
    return 0;
  };
}

}  // namespace kvs::cli
