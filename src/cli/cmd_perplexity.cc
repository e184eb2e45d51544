#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/thread_pool.h"
#include "engine/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {

Runner AddPerplexityCommand(CLI::App& root) {
  struct Args {
    std::string model, file;
    int32_t n_ctx = 512;
    int32_t threads = ThreadPool::DefaultThreadCount();
    int32_t max_chunks = -1;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = root.add_subcommand(
      "perplexity", "Chunked perplexity of a text, as llama-perplexity computes it");
  cmd->add_option("-m,--model", a->model, "GGUF model file");
  cmd->add_option("-f,--file", a->file, "Text file")->required();
  cmd->add_option("-c,--ctx-size", a->n_ctx, "Tokens per chunk")
      ->capture_default_str()
      ->check(CLI::Range(4, 1 << 20));
  cmd->add_option("-t,--threads", a->threads, "Threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--chunks", a->max_chunks, "Score at most this many chunks (-1: all)")
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "Print one JSON object with the result");
  return [a]() -> int {
    std::string path = a->model;
    if (!ResolveModelPath(path)) return 1;
    std::string text;
    if (!ReadTextFile(a->file, &text)) return 1;
    auto model = Model::Load(path);
    if (!model) {
      std::fprintf(stderr, "error: %s\n", model.error().c_str());
      return 1;
    }
    auto tok = Tokenizer::FromGguf((*model)->file());
    if (!tok) {
      std::fprintf(stderr, "error: %s: %s\n", path.c_str(), tok.error().c_str());
      return 1;
    }
    std::vector<int32_t> ids = (*tok)->Encode(text, /*add_special=*/true, /*parse_special=*/false);
    if (a->max_chunks > 0 &&
        static_cast<int64_t>(ids.size()) > static_cast<int64_t>(a->max_chunks) * a->n_ctx) {
      ids.resize(static_cast<size_t>(a->max_chunks) * a->n_ctx);
    }
    ThreadPool pool(a->threads);
    const int32_t bos = (*tok)->add_bos() ? (*tok)->bos_id() : -1;
    auto r = ComputePerplexity(**model, ids, a->n_ctx, bos, pool, [&](int32_t i, double ppl) {
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
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf(
          "perplexity: %.4f +/- %.4f (nll %.5f) over %d chunks of %d tokens, %lld tokens scored, "
          "%.1f s\n",
          r->ppl, r->ppl * r->nll_stddev, r->nll, r->n_chunks, a->n_ctx,
          static_cast<long long>(r->n_scored), r->seconds);
    }
    return 0;
  };
}

}  // namespace kvs::cli
