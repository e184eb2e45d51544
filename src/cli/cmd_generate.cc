#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <mutex>
#include <random>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/eviction_config.h"
#include "kvserve/kvserve.h"

namespace kvs::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  int32_t n_predict = 128;
  int64_t seed = -1;
  bool no_bos = false;
  bool show_ids = false;
  EngineFlags engine;
  kvserve::ModelOptions model_options;
  kvserve::GenerationOptions gen;
};

int RunGenerate(GenerateArgs a) {
  std::string model_path = a.model;
  if (!ResolveModelPath(model_path)) return 1;
  std::string prompt = a.prompt;
  if (!a.prompt_file.empty() && !ReadTextFile(a.prompt_file, &prompt)) return 1;
  if (!ResolveKvMemory(&a.engine)) return 1;
  if (!ResolveSpecFlags(&a.engine)) return 1;
  std::string error;
  std::shared_ptr<kvserve::Model> model = kvserve::Model::Load(model_path, a.model_options, &error);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  std::vector<int32_t> ids = model->Tokenize(prompt, /*add_special=*/!a.no_bos);
  if (ids.empty()) {
    if (model->bos_token() < 0) {
      std::fprintf(stderr,
                   "error: the prompt is empty and the model has no BOS token to start from\n");
      return 1;
    }
    ids.push_back(model->bos_token());
  }
  if (a.n_predict == 0) return 0;

  kvserve::EngineOptions& eo = a.engine.options;
  auto budget = ParseKvBudget(eo.kv_budget, {eo.kv_sink, eo.kv_window});
  if (!budget.ok()) {
    std::fprintf(stderr, "error: %s\n", budget.error().c_str());
    return 1;
  }
  if (eo.n_ctx == 0) eo.n_ctx = model->n_ctx_train();
  // With a KV budget the context bounds positions, not memory: unless -c says otherwise, -n may
  // run past it (as llama.cpp's context shift lets it).
  const bool ctx_given = a.engine.ctx_flag != nullptr && a.engine.ctx_flag->count() > 0;
  if (budget->active() && a.n_predict > 0 && !ctx_given) {
    eo.n_ctx = static_cast<int32_t>(std::min<int64_t>(
        1 << 24, std::max<int64_t>(eo.n_ctx, static_cast<int64_t>(ids.size()) + a.n_predict + 1)));
  }
  if (static_cast<int64_t>(ids.size()) >= eo.n_ctx) {
    std::fprintf(stderr, "error: the prompt has %zu tokens, which does not fit the context of %d\n",
                 ids.size(), eo.n_ctx);
    return 1;
  }
  // One sequence: the cache needs only what this request can use, not the whole context.
  if (eo.kv_memory_bytes == 0) {
    int64_t positions = eo.n_ctx;
    if (a.n_predict > 0) positions = std::min<int64_t>(positions, ids.size() + a.n_predict);
    // With a KV budget the sequence holds its prompt, or its budget and a block (or
    // --evict-every tokens) more: a bounded pool, however long it generates.
    if (budget->active()) {
      const int64_t slack = std::max(eo.block_size, eo.evict_every);
      positions = std::min<int64_t>(
          positions, std::max<int64_t>(
                         static_cast<int64_t>(ids.size()),
                         budget->For(static_cast<int32_t>(std::min<int64_t>(positions, INT32_MAX)),
                                     {eo.kv_sink, eo.kv_window}) +
                             slack));
    }
    // Its blocks, the null block and the engine's 1% admission watermark (as the default pool
    // counts them for -np sequences).
    const int64_t blocks =
        model->kv_blocks_per_sequence(positions, eo.block_size, eo.max_batch_tokens);
    const int64_t bytes = model->kv_bytes_per_sequence(
        positions, eo.block_size, eo.max_batch_tokens, eo.cache_type_k, eo.cache_type_v);
    if (bytes > 0 && blocks > 0) {  // else Engine::Start reports the bad type
      const int64_t pool = static_cast<int64_t>(std::ceil((blocks + 1) * 1.02)) + 1;
      eo.kv_memory_bytes = pool * (bytes / blocks);
    }
  }
  std::unique_ptr<kvserve::Engine> engine = kvserve::Engine::Start(model, eo, &error);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }

  a.gen.max_tokens = a.n_predict;
  a.gen.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  std::mutex mu;
  std::condition_variable done;
  bool finished = false;
  std::string finish_reason, finish_error;
  std::vector<int32_t> generated;
  // With nothing before it (BOS only), SentencePiece's leading "▁" of the first word would
  // print as a space; drop it as llama.cpp and llama2.c do.
  bool strip_leading_space = ids.size() == 1 && ids[0] == model->bos_token();
  const auto t0 = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point t_first;
  // Blocks in use, sampled as tokens stream: what eviction held the cache to. The engine's
  // stats are those after its last step (post-eviction), so this is the peak between steps.
  const bool evicting = budget->active();
  int32_t peak_blocks = 0;
  std::vector<double> token_times;   // seconds since t0 of each generated token
  int64_t first_evicted_token = -1;  // tokens generated when the first eviction was seen
  auto sample_blocks = [&] {
    const kvserve::EngineStats s = engine->stats();
    peak_blocks = std::max(peak_blocks, s.kv_blocks_total - s.kv_blocks_free);
    if (first_evicted_token < 0 && s.compactions > 0) {
      first_evicted_token = static_cast<int64_t>(generated.size());
    }
  };
  const uint64_t id = engine->Submit(
      ids, a.gen,
      [&](const kvserve::TokenEvent& e) {
        if (evicting) sample_blocks();
        if (e.token >= 0 && generated.empty()) t_first = std::chrono::steady_clock::now();
        if (e.token >= 0) {
          generated.push_back(e.token);
          token_times.push_back(Since(t0));
        }
        std::string text = e.text;
        if (strip_leading_space && !text.empty()) {
          if (text[0] == ' ') text.erase(0, 1);
          strip_leading_space = false;
        }
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
        if (e.finished) {
          std::lock_guard<std::mutex> lock(mu);
          finished = true;
          finish_reason = e.finish_reason;
          finish_error = e.error;
          done.notify_all();
        }
      },
      &error);
  if (id == 0) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [&] { return finished; });
  }
  // The totals reported below (an eviction, a verification) include the last token's step:
  // callbacks run after the step that produced their token has published its totals.
  const double total = Since(t0);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (finish_reason == "error") {
    std::fprintf(stderr, "error: %s\n", finish_error.c_str());
    return 1;
  }
  if (a.show_ids) {
    std::fprintf(stderr, "ids:");
    for (int32_t t : generated) std::fprintf(stderr, " %d", t);
    std::fprintf(stderr, "\n");
  }
  const double prompt_s =
      generated.empty() ? total : std::chrono::duration<double>(t_first - t0).count();
  const double gen_s = total - prompt_s;
  std::fprintf(stderr, "prompt: %zu tokens in %.3f s (%.1f tokens/s)\n", ids.size(), prompt_s,
               prompt_s > 0 ? ids.size() / prompt_s : 0.0);
  // The first generated token comes from the prompt's logits, so decode speed counts the rest.
  const size_t decoded = generated.size() > 1 ? generated.size() - 1 : 0;
  std::fprintf(stderr, "generation: %zu tokens in %.3f s (%.1f tokens/s), finish: %s\n",
               generated.size(), gen_s, gen_s > 0 ? decoded / gen_s : 0.0, finish_reason.c_str());
  if (eo.spec_type != "none") {
    const kvserve::EngineStats s = engine->stats();
    std::fprintf(
        stderr,
        "speculation (%s): %lld verifications, %lld tokens drafted, %lld accepted "
        "(acceptance %.3f)\n",
        eo.spec_type.c_str(), static_cast<long long>(s.spec_drafts),
        static_cast<long long>(s.spec_draft_tokens), static_cast<long long>(s.spec_accepted_tokens),
        s.spec_draft_tokens > 0 ? double(s.spec_accepted_tokens) / s.spec_draft_tokens : 0.0);
  }
  if (evicting) {
    sample_blocks();
    const kvserve::EngineStats s = engine->stats();
    std::fprintf(stderr,
                 "kv eviction: %lld positions evicted in %lld compactions, %lld blocks freed; "
                 "peak KV blocks %d\n",
                 static_cast<long long>(s.evicted_tokens), static_cast<long long>(s.compactions),
                 static_cast<long long>(s.blocks_freed_by_compaction), peak_blocks);
    // Constant memory should mean constant speed: the decode rate of the 1,000 tokens after
    // the first eviction (the cache at its budget) against the last 1,000.
    const int64_t n = static_cast<int64_t>(token_times.size()), w = 1000;
    const int64_t f = first_evicted_token;
    if (f >= 0 && n >= f + 2 * w) {
      const double first = w / (token_times[f + w] - token_times[f]);
      const double last = w / (token_times[n - 1] - token_times[n - 1 - w]);
      std::fprintf(stderr,
                   "decode rate at the budget: %.2f tokens/s over the 1000 tokens after the first "
                   "eviction (tokens %lld-%lld), %.2f tokens/s over the last 1000 (%+.1f%%)\n",
                   first, static_cast<long long>(f), static_cast<long long>(f + w), last,
                   100.0 * (last / first - 1.0));
    }
  }
  return 0;
}

}  // namespace

Runner AddGenerateCommand(CLI::App& root) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = root.add_subcommand("generate", "Generate text from a prompt");
  cmd->add_option("-m,--model", a->model,
                  "GGUF model file (default: $KVSERVE_MODEL or stories260K)");
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text (empty: start from BOS)");
  cmd->add_option("-f,--file", a->prompt_file,
                  std::string("Read the prompt from a file (") + kInputFileHelp + ")");
  cmd->add_option("-n,--n-predict", a->n_predict,
                  "Tokens to generate (-1: until EOS or full context)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 24));
  // The sampler's own bounds (SamplingParams::Validate), checked here too so that a bad value
  // fails before the model loads and names the flag; top-k and the seed have no "negative"
  // meaning there, so -5 would silently mean "off" or "random".
  cmd->add_option("--temp", a->gen.temperature, "Temperature (0: greedy)")
      ->capture_default_str()
      ->check(RealRange(0, 100));
  cmd->add_option("--top-k", a->gen.top_k, "Top-k (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0, std::numeric_limits<int32_t>::max()));
  cmd->add_option("--top-p", a->gen.top_p, "Top-p (1: off)")
      ->capture_default_str()
      ->check(RealRange(0, 1));
  cmd->add_option("--min-p", a->gen.min_p, "Min-p (0: off)")
      ->capture_default_str()
      ->check(RealRange(0, 1));
  cmd->add_option("--repeat-penalty", a->gen.repeat_penalty, "Repetition penalty (1: off)")
      ->capture_default_str()
      ->check(RealRange(0, 100, /*lo_open=*/true));
  cmd->add_option("--repeat-last-n", a->gen.repeat_last_n,
                  "Tokens the penalties look back over (-1: all)")
      ->capture_default_str()
      ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()));
  cmd->add_option("--frequency-penalty", a->gen.frequency_penalty, "Frequency penalty")
      ->capture_default_str()
      ->check(RealRange(-100, 100));
  cmd->add_option("--presence-penalty", a->gen.presence_penalty, "Presence penalty")
      ->capture_default_str()
      ->check(RealRange(-100, 100));
  cmd->add_option("-s,--seed", a->seed, "Random seed (-1: random)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, std::numeric_limits<int64_t>::max()));
  cmd->add_flag("--ignore-eos", a->gen.ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--no-bos", a->no_bos, "Do not add the BOS token to the prompt");
  cmd->add_flag("--show-ids", a->show_ids, "Print the generated token ids on stderr");
  AddEngineFlags(cmd, &a->engine, /*default_parallel=*/1);
  AddModelFlags(cmd, &a->model_options);
  return [a] { return RunGenerate(*a); };
}

}  // namespace kvs::cli
