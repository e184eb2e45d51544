// Embedding kvserve: load a model, start an engine, run three prompts at once with streamed
// output, and cancel one of them half way. Uses only include/kvserve/kvserve.h.
//   build/examples/embed_example MODEL.gguf
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "kvserve/kvserve.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
    return 2;
  }
  std::string error;
  std::shared_ptr<kvserve::Model> model = kvserve::Model::Load(argv[1], &error);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  kvserve::EngineOptions options;
  options.n_ctx = 256;
  options.n_parallel = 4;
  std::unique_ptr<kvserve::Engine> engine = kvserve::Engine::Start(model, options, &error);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }

  std::mutex mu;
  std::condition_variable done;
  std::map<uint64_t, std::string> texts;
  std::map<uint64_t, std::string> endings;
  uint64_t to_cancel = 0;
  auto on_token = [&](const kvserve::TokenEvent& e) {
    std::lock_guard<std::mutex> lock(mu);
    texts[e.request] += e.text;
    // Cancelling from inside a callback is allowed: it takes effect before the next step.
    if (e.request == to_cancel && texts[e.request].size() > 20) engine->Cancel(e.request);
    if (e.finished) {
      endings[e.request] = e.finish_reason;
      done.notify_all();
    }
  };

  const char* prompts[] = {"Once upon a time", "The little dog", "Lily and Tom went"};
  std::vector<uint64_t> ids;
  for (const char* prompt : prompts) {
    kvserve::GenerationOptions g;
    g.max_tokens = 48;
    g.temperature = 0;  // greedy: the same output every run
    std::lock_guard<std::mutex> lock(mu);
    const uint64_t id = engine->Submit(model->Tokenize(prompt), g, on_token, &error);
    if (id == 0) {
      std::fprintf(stderr, "error: %s\n", error.c_str());
      return 1;
    }
    ids.push_back(id);
    if (ids.size() == 2) to_cancel = id;
  }

  std::unique_lock<std::mutex> lock(mu);
  done.wait(lock, [&] { return endings.size() == ids.size(); });
  for (size_t i = 0; i < ids.size(); ++i) {
    std::printf("[%s] %s%s\n    (%s)\n", endings[ids[i]].c_str(), prompts[i], texts[ids[i]].c_str(),
                ids[i] == to_cancel ? "cancelled on purpose" : "complete");
  }
  const kvserve::EngineStats s = engine->stats();
  std::printf("engine: %lld steps, %lld tokens computed, %d KV blocks of %d positions\n",
              static_cast<long long>(s.steps), static_cast<long long>(s.tokens_computed),
              s.kv_blocks_total, s.block_size);
  return endings[ids[0]] == "length" && endings[to_cancel] == "cancelled" ? 0 : 1;
}
