// `kvserve bench spec`: speculative decoding against plain decoding, one sequence, greedy: the
// same prompt (and -d tokens of context before it) decoded with and without drafts in one
// engine, interleaved -r times; prints acceptance, mean accepted tokens per verification,
// decode tokens/s of both and the speedup. The plain run uses the request option that opts out
// of speculation, so both share one engine and the prompt is prefilled once (prefix cache).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/status.h"

namespace kvs::cli {
namespace {

// A passage of plain prose for the default prompt (any text does; the prompt file replaces it).
constexpr const char* kDefaultPrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun "
    "with her dog, Max. One day, Lily and Max went to the park. They saw a big tree with red "
    "apples. Lily wanted to get an apple, but the tree was too tall. Max barked at the tree.";

struct Run {
  double tg_tps = 0;
  int32_t n_tokens = 0;
  std::vector<int32_t> tokens;
};

// Decodes n tokens greedily after prompt; tokens/s from the first token to the last.
Expected<Run> Decode(kvserve::Engine& engine, const std::vector<int32_t>& prompt, int32_t n,
                     bool speculative) {
  kvserve::GenerationOptions g;
  g.max_tokens = n;
  g.temperature = 0;
  g.ignore_eos = true;
  g.speculative = speculative;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  Run run;
  std::chrono::steady_clock::time_point first, last;
  std::string submit_error;
  const uint64_t id = engine.Submit(
      prompt, g,
      [&](const kvserve::TokenEvent& e) {
        const auto now = std::chrono::steady_clock::now();
        std::lock_guard<std::mutex> lock(mu);
        if (e.token >= 0) {
          if (run.tokens.empty()) first = now;
          last = now;
          run.tokens.push_back(e.token);
        }
        if (e.finished) {
          if (e.finish_reason != "length") error = e.finish_reason + " " + e.error;
          done = true;
          cv.notify_all();
        }
      },
      &submit_error);
  if (id == 0) return Status::Error(submit_error);
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!error.empty()) return Status::Error("the decode ended early: " + error);
  run.n_tokens = static_cast<int32_t>(run.tokens.size());
  const double seconds = std::chrono::duration<double>(last - first).count();
  run.tg_tps = run.n_tokens > 1 && seconds > 0 ? (run.n_tokens - 1) / seconds : 0;
  return run;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int RunSpecBench(SpecBenchArgs a) {
  std::string path = a.model;
  if (!ResolveModelPath(path)) return 1;
  if (!ResolveKvMemory(&a.engine) || !ResolveSpecFlags(&a.engine)) return 1;
  kvserve::EngineOptions& eo = a.engine.options;
  if (eo.spec_type == "none") {
    std::fprintf(stderr, "error: bench spec needs --spec-type draft, ngram or self\n");
    return 1;
  }
  std::string text = kDefaultPrompt;
  if (!a.prompt_file.empty() && !ReadTextFile(a.prompt_file, &text)) return 1;
  std::string error;
  auto model = kvserve::Model::Load(path, a.model_options, &error);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  std::vector<int32_t> prompt = model->Tokenize(text, true);
  if (prompt.empty()) {
    std::fprintf(stderr, "error: the prompt has no tokens\n");
    return 1;
  }
  // -d: the prompt repeated to that many tokens of context (a long document to continue).
  if (a.depth > static_cast<int32_t>(prompt.size())) {
    const std::vector<int32_t> unit = model->Tokenize(text, false);
    while (static_cast<int32_t>(prompt.size()) < a.depth && !unit.empty()) {
      prompt.insert(prompt.end(), unit.begin(), unit.end());
    }
    prompt.resize(a.depth);
  }
  eo.n_parallel = 1;
  const std::string ctx_flag =
      eo.n_ctx == 0 ? "-c 0 (the training context, " + std::to_string(model->n_ctx_train()) + ")"
                    : "-c " + std::to_string(eo.n_ctx);
  if (a.ctx_given && eo.n_ctx == 0) eo.n_ctx = model->n_ctx_train();
  const int64_t needed = static_cast<int64_t>(prompt.size()) + a.n_gen;
  if (a.ctx_given && eo.n_ctx < needed) {
    std::fprintf(stderr,
                 "error: %s is too small for %zu prompt tokens (-d) and %d generated (-n): "
                 "it needs at least %lld; raise -c, or lower -d or -n\n",
                 ctx_flag.c_str(), prompt.size(), a.n_gen, static_cast<long long>(needed));
    return 1;
  }
  if (!a.ctx_given && (eo.n_ctx == 0 || eo.n_ctx < needed + 1)) {
    eo.n_ctx = static_cast<int32_t>(prompt.size()) + a.n_gen + 64;
  }
  auto engine = kvserve::Engine::Start(model, eo, &error);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  std::fprintf(stderr, "bench spec: %s, --spec-type %s, %zu prompt tokens, %d generated, %d reps\n",
               path.c_str(), eo.spec_type.c_str(), prompt.size(), a.n_gen, a.reps);
  std::vector<double> base_tps, spec_tps;
  int64_t drafts = 0, drafted = 0, accepted = 0;
  bool identical = true;
  for (int32_t r = 0; r < a.reps; ++r) {
    // Interleaved, plain first: it also prefills the prompt into the prefix cache for both.
    auto base = Decode(*engine, prompt, a.n_gen, false);
    const kvserve::EngineStats before = engine->stats();
    auto spec = base.ok() ? Decode(*engine, prompt, a.n_gen, true) : base;
    const kvserve::EngineStats after = engine->stats();
    if (!base.ok() || !spec.ok()) {
      std::fprintf(stderr, "error: %s\n", (!base.ok() ? base : spec).error().c_str());
      return 1;
    }
    base_tps.push_back(base->tg_tps);
    spec_tps.push_back(spec->tg_tps);
    drafts += after.spec_drafts - before.spec_drafts;
    drafted += after.spec_draft_tokens - before.spec_draft_tokens;
    accepted += after.spec_accepted_tokens - before.spec_accepted_tokens;
    identical = identical && base->tokens == spec->tokens;
    std::fprintf(stderr, "  rep %d: plain %.2f t/s, speculative %.2f t/s\n", r + 1, base->tg_tps,
                 spec->tg_tps);
  }
  const double tg = Median(spec_tps), tg_base = Median(base_tps);
  nlohmann::json out = {
      {"model", path},
      {"spec_type", eo.spec_type},
      {"draft_max", eo.draft_max},
      {"draft_min", eo.draft_min},
      {"n_prompt", prompt.size()},
      {"n_gen", a.n_gen},
      {"threads", eo.threads},
      {"reps", a.reps},
      {"acceptance_rate", drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0},
      // Tokens a verification step emits: the accepted drafts and the target's own token.
      {"mean_accepted_tokens", drafts > 0 ? static_cast<double>(accepted) / drafts : 0.0},
      {"num_drafts", drafts},
      {"num_draft_tokens", drafted},
      {"num_accepted_tokens", accepted},
      {"tg_tps", tg},
      {"tg_tps_baseline", tg_base},
      {"speedup", tg_base > 0 ? tg / tg_base : 0.0},
      {"greedy_output_identical", identical},
  };
  if (eo.spec_type == "self") {
    out["draft_window"] = eo.draft_window;
    out["draft_weights"] = eo.draft_weights.empty() ? "default" : eo.draft_weights;
  }
  if (a.json) {
    std::printf("%s\n", out.dump(2).c_str());
  } else {
    std::printf(
        "spec %-5s  prompt %6zu  gen %4d  acceptance %.3f  mean accepted %.2f  tg %.2f t/s  "
        "plain %.2f t/s  speedup %.3fx%s\n",
        eo.spec_type.c_str(), prompt.size(), a.n_gen, out["acceptance_rate"].get<double>(),
        out["mean_accepted_tokens"].get<double>(), tg, tg_base, out["speedup"].get<double>(),
        identical ? "" : "  (OUTPUT DIFFERS)");
  }
  if (!identical) {
    std::fprintf(stderr, "error: the greedy output with speculation differs from without\n");
    return 2;
  }
  return 0;
}

Runner AddSpecBenchCommand(CLI::App* bench) {
  auto a = std::make_shared<SpecBenchArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "spec", "Speculative decoding against plain decoding: acceptance and speedup, one sequence");
  cmd->add_option("-m,--model", a->model, "Target GGUF model file");
  AddModelFlags(cmd, &a->model_options);
  AddEngineFlags(cmd, &a->engine, /*default_parallel=*/1);
  cmd->add_option("-n,--n-gen", a->n_gen, "Tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("-d,--n-depth", a->depth,
                  "Tokens of context before generation (the prompt repeated to this length)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("-r,--repetitions", a->reps, "Interleaved repetitions (medians are reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--prompt-file", a->prompt_file,
                  std::string("Prompt text (default: a short built-in story); ") + kInputFileHelp);
  cmd->add_flag("--json", a->json, "Print one JSON object (and nothing else) on stdout");
  return [a, cmd]() -> int {
    if (!cmd->parsed()) return -1;
    a->ctx_given = cmd->count("--ctx-size") > 0;
    return RunSpecBench(*a);
  };
}

}  // namespace kvs::cli
