#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "core/thread_pool.h"
#include "engine/generate.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {
namespace {

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  int32_t n_predict = 128;
  int32_t n_ctx = 4096;
  int32_t threads = ThreadPool::DefaultThreadCount();
  int64_t seed = -1;
  bool ignore_eos = false;
  bool no_bos = false;
  bool show_ids = false;
  SamplingParams sampling;
};

int RunGenerate(const GenerateArgs& a) {
  std::string model_path = a.model;
  if (!ResolveModelPath(model_path)) return 1;
  std::string prompt = a.prompt;
  if (!a.prompt_file.empty() && !ReadTextFile(a.prompt_file, &prompt)) return 1;

  auto model = Model::Load(model_path);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.error().c_str());
    return 1;
  }
  auto tokenizer = Tokenizer::FromGguf((*model)->file());
  if (!tokenizer) {
    std::fprintf(stderr, "error: %s: %s\n", model_path.c_str(), tokenizer.error().c_str());
    return 1;
  }
  const Tokenizer& tok = **tokenizer;
  std::vector<int32_t> ids = tok.Encode(prompt, /*add_special=*/!a.no_bos, /*parse_special=*/true);
  if (ids.empty()) {
    if (tok.bos_id() < 0) {
      std::fprintf(stderr,
                   "error: the prompt is empty and the model has no BOS token to start from\n");
      return 1;
    }
    ids.push_back(tok.bos_id());
  }

  GenerateOptions opt;
  opt.n_predict = a.n_predict;
  opt.n_ctx = a.n_ctx;
  opt.sampling = a.sampling;
  opt.sampling.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : std::random_device{}();
  if (!a.ignore_eos) {
    for (int32_t id = 0; id < tok.n_vocab(); ++id) {
      if (tok.IsEndOfGeneration(id)) opt.stop_ids.push_back(id);
    }
  }

  ThreadPool pool(a.threads);
  StreamingDetokenizer detok(tok);
  // With nothing before it (BOS only), SentencePiece's leading "▁" of the first word would
  // print as a space; drop it as llama.cpp and llama2.c do.
  bool strip_leading_space = ids.size() == 1 && ids[0] == tok.bos_id();
  std::vector<int32_t> generated;
  auto stats = Generate(**model, ids, opt, pool, [&](int32_t id) {
    generated.push_back(id);
    if (tok.IsEndOfGeneration(id) && !a.ignore_eos) return true;
    std::string text = detok.Push(id);
    if (strip_leading_space && !text.empty()) {
      if (text[0] == ' ') text.erase(0, 1);
      strip_leading_space = false;
    }
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::string rest = detok.Flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!stats) {
    std::fprintf(stderr, "error: %s\n", stats.error().c_str());
    return 1;
  }
  if (a.show_ids) {
    std::fprintf(stderr, "ids:");
    for (int32_t id : generated) std::fprintf(stderr, " %d", id);
    std::fprintf(stderr, "\n");
  }
  const GenerateStats& s = *stats;
  std::fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tokens/s)\n", s.n_prompt,
               s.prompt_seconds, s.prompt_seconds > 0 ? s.n_prompt / s.prompt_seconds : 0.0);
  // The first generated token comes from the prompt's logits, so decode speed counts the rest.
  int32_t decoded = s.n_generated > 1 ? s.n_generated - 1 : 0;
  std::fprintf(stderr, "generation: %d tokens in %.3f s (%.1f tokens/s)\n", s.n_generated,
               s.generate_seconds, s.generate_seconds > 0 ? decoded / s.generate_seconds : 0.0);
  return 0;
}

}  // namespace

Runner AddGenerateCommand(CLI::App& root) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* cmd = root.add_subcommand("generate", "Generate text from a prompt");
  cmd->add_option("-m,--model", a->model,
                  "GGUF model file (default: $KVSERVE_MODEL or stories260K)");
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text (empty: start from BOS)");
  cmd->add_option("-f,--file", a->prompt_file, "Read the prompt from a file");
  cmd->add_option("-n,--n-predict", a->n_predict,
                  "Tokens to generate (-1: until EOS or full context)")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 24));
  cmd->add_option("-c,--ctx-size", a->n_ctx, "Context size (0: the model's training context)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("-t,--threads", a->threads, "Threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--temp", a->sampling.temperature, "Temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "Top-k (0: off)")->capture_default_str();
  cmd->add_option("--top-p", a->sampling.top_p, "Top-p (1: off)")->capture_default_str();
  cmd->add_option("--min-p", a->sampling.min_p, "Min-p (0: off)")->capture_default_str();
  cmd->add_option("--repeat-penalty", a->sampling.repeat_penalty, "Repetition penalty (1: off)")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", a->sampling.repeat_last_n,
                  "Tokens the penalties look back over (-1: all)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", a->sampling.frequency_penalty, "Frequency penalty")
      ->capture_default_str();
  cmd->add_option("--presence-penalty", a->sampling.presence_penalty, "Presence penalty")
      ->capture_default_str();
  cmd->add_option("-s,--seed", a->seed, "Random seed (-1: random)")->capture_default_str();
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep generating past end-of-sequence tokens");
  cmd->add_flag("--no-bos", a->no_bos, "Do not add the BOS token to the prompt");
  cmd->add_flag("--show-ids", a->show_ids, "Print the generated token ids on stderr");
  return [a] { return RunGenerate(*a); };
}

}  // namespace kvs::cli
