// `kvserve bench evict`: what token eviction buys at a fixed KV memory. The same requests (random
// prompts, greedy, EOS ignored) run twice through the engine, with a KV budget and without, over
// the same pool; it reports what eviction dropped and freed, how many sequences held their
// full-length KV together, and the aggregate decode rate. stdout holds only the JSON with --json.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "api/engine_setup.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "kvserve/kvserve.h"

namespace kvs::cli {
namespace {

struct EvictArgs {
  std::string model;
  int32_t requests = 16;
  int32_t concurrency = 0;  // 0: all requests at once
  int32_t prompt_tokens = 512;
  int32_t gen_tokens = 2048;
  int32_t depth = 0;  // -d: the prompt's length, when given (the depth decoding starts at)
  // --kv-budget (default 25%), --kv-sink, --kv-window, --evict-policy, --evict-every,
  // --cache-type-k/-v and --max-batch-tokens; the rest is set from the workload.
  kvserve::EngineOptions engine = [] {
    kvserve::EngineOptions o;
    o.kv_budget = "25%";
    return o;
  }();
  std::string kv_memory;  // default: a pool that holds 4 requests without eviction
  int32_t threads = ThreadPool::DefaultThreadCount();
  uint64_t seed = 42;
  bool json = false;
  bool skip_baseline = false;
  kvserve::ModelOptions model_options;
};

struct EvictRun {
  int64_t evicted_tokens = 0, compactions = 0, blocks_freed = 0, preemptions = 0, steps = 0;
  // Most sequences running together past 90% of their length: how many long sequences the pool
  // holds at once (early in a run, when every sequence is short, they all fit either way).
  int32_t max_concurrent = 0;
  int32_t max_running = 0;          // most sequences running in any step
  int32_t peak_blocks_per_seq = 0;  // most blocks one sequence held
  int32_t peak_blocks_used = 0;     // most pool blocks in use
  double wall_s = 0, output_tps = 0, decode_tps = 0;

  double FreedRatio(int32_t block_size) const {
    return evicted_tokens > 0 ? blocks_freed / (static_cast<double>(evicted_tokens) / block_size)
                              : 0.0;
  }
  nlohmann::json Json(int32_t block_size, int32_t usable_blocks) const {
    return {{"evicted_tokens", evicted_tokens},
            {"compactions", compactions},
            {"blocks_freed", blocks_freed},
            {"freed_ratio", FreedRatio(block_size)},
            {"max_concurrent", max_concurrent},
            {"max_running", max_running},
            {"peak_blocks_per_seq", peak_blocks_per_seq},
            {"capacity_seqs", peak_blocks_per_seq > 0 ? usable_blocks / peak_blocks_per_seq : 0},
            {"peak_blocks_used", peak_blocks_used},
            {"preemptions", preemptions},
            {"steps", steps},
            {"wall_s", wall_s},
            {"output_tps", output_tps},
            {"decode_tps", decode_tps}};
  }
};

Expected<EvictRun> RunOnce(const Model& model, const Tokenizer* tokenizer, ThreadPool& pool,
                           EngineSetup setup, const std::vector<std::vector<int32_t>>& prompts,
                           int32_t gen_tokens, bool quiet, const char* label) {
  KVS_ASSIGN_OR_RETURN(LocalEngine local,
                       BuildLocalEngine(std::move(setup), model, tokenizer, pool));
  Engine& engine = *local.engine;
  int64_t out_tokens = 0, decode_tokens = 0;
  int32_t finished_this_step = 0, started = 0;
  const int32_t n = static_cast<int32_t>(prompts.size());
  const int32_t full_length = static_cast<int32_t>(prompts[0].size()) + gen_tokens;
  double decode_start = -1;
  const auto t0 = Clock::now();
  std::vector<char> has_first(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    RequestOptions o;
    o.sampling.temperature = 0;
    o.max_tokens = gen_tokens;
    auto id = engine.Submit(prompts[i], o, [&, i](const TokenEvent& e) {
      if (e.token >= 0) {
        ++out_tokens;
        if (decode_start >= 0) ++decode_tokens;
        if (!has_first[i]) {
          has_first[i] = 1;
          ++started;
        }
      }
      if (e.finished) ++finished_this_step;
    });
    if (!id.ok()) return id.status();
  }
  EvictRun r;
  int64_t next_report = 0;
  while (engine.HasWork()) {
    finished_this_step = 0;
    EngineStepStats s;
    KVS_RETURN_IF_ERROR(engine.Step(&s));
    ++r.steps;
    r.preemptions += s.n_preempted;
    r.max_running = std::max(r.max_running, s.n_running + finished_this_step);
    int32_t long_running = finished_this_step;  // a finished one was at its full length
    for (const Sequence* seq : engine.scheduler().running()) {
      long_running += seq->n_computed * 10 >= int64_t{full_length} * 9 ? 1 : 0;
      r.peak_blocks_per_seq = std::max(
          r.peak_blocks_per_seq, static_cast<int32_t>(engine.kv().Table(seq->id).blocks.size()));
    }
    r.max_concurrent = std::max(r.max_concurrent, long_running);
    r.peak_blocks_used = std::max(r.peak_blocks_used,
                                  engine.kv().num_usable_blocks() - engine.kv().num_free_blocks());
    r.evicted_tokens = s.evicted_tokens;
    r.compactions = s.compactions;
    r.blocks_freed = s.blocks_freed_by_compaction;
    // The decode window starts once every request has its first token.
    if (decode_start < 0 && started == n) decode_start = Since(t0);
    if (!quiet && out_tokens >= next_report) {
      std::fprintf(stderr, "  %s: %lld / %lld tokens, %d running, %d waiting, %lld evicted\n",
                   label, static_cast<long long>(out_tokens),
                   static_cast<long long>(int64_t{n} * gen_tokens), s.n_running, s.n_waiting,
                   static_cast<long long>(s.evicted_tokens));
      next_report = out_tokens + std::max<int64_t>(1, int64_t{n} * gen_tokens / 10);
    }
  }
  r.wall_s = Since(t0);
  r.output_tps = out_tokens / r.wall_s;
  r.decode_tps = decode_start >= 0 && r.wall_s > decode_start
                     ? decode_tokens / (r.wall_s - decode_start)
                     : 0.0;
  return r;
}

// The engine of both runs, from a's options: the workload's context and concurrency over a pool
// of --kv-memory (default: four requests at full length, and the 1% watermark); with_budget
// false: the baseline, without eviction.
Expected<EngineSetup> EvictSetup(const EvictArgs& a, const Model& model, const Tokenizer* tok,
                                 bool with_budget) {
  kvserve::EngineOptions eo = a.engine;
  const int32_t length = a.prompt_tokens + a.gen_tokens;
  eo.n_ctx = length + 1;
  eo.n_parallel = a.concurrency;
  eo.block_size = 16;
  if (!with_budget) eo.kv_budget.clear();
  KVS_ASSIGN_OR_RETURN(const KvGeometry geometry, CacheGeometry(model.config(), eo.block_size,
                                                                eo.cache_type_k, eo.cache_type_v));
  const int64_t block_bytes = geometry.BytesPerBlock();
  int64_t kv_bytes = 0;
  if (!a.kv_memory.empty()) {
    std::string error;
    if (!ParseMemorySize(a.kv_memory, &kv_bytes, &error)) return Status::Error(error);
  } else {
    const int64_t per_seq = (length + eo.block_size - 1) / eo.block_size;
    kv_bytes = (4 * per_seq * 101 / 100 + 1) * block_bytes;
  }
  const int64_t n_blocks = kv_bytes / block_bytes + 1;
  if (n_blocks < 3 || n_blocks > (int64_t{1} << 30)) {
    return Status::Error(
        StrFormat("--kv-memory holds %lld blocks of %lld bytes: too few or too many",
                  static_cast<long long>(n_blocks - 1), static_cast<long long>(block_bytes)));
  }
  KVS_ASSIGN_OR_RETURN(
      EngineSetup setup,
      ResolveEngineOptions(eo, model, tok, PoolShape{static_cast<int32_t>(n_blocks)}));
  if (with_budget && !setup.config.eviction.budget.active()) {
    return Status::Error("bench evict needs a --kv-budget (e.g. 25% or 1024)");
  }
  return setup;
}

int RunEvict(EvictArgs a) {
  std::string path = a.model;
  if (!ResolveModelPath(path)) return 1;
  if (a.depth > 0) a.prompt_tokens = a.depth;
  if (a.concurrency <= 0 || a.concurrency > a.requests) a.concurrency = a.requests;
  LoadedModel loaded;
  if (!LoadModelWithTokenizer(path, a.model_options.check_tensors, &loaded)) return 1;
  const Model& model = *loaded.model;
  const Tokenizer* tok = loaded.tokenizer.get();
  auto setup = EvictSetup(a, model, tok, /*with_budget=*/true);
  if (!setup.ok()) {
    std::fprintf(stderr, "error: %s\n", setup.error().c_str());
    return 1;
  }
  const EngineConfig cfg = setup->config;
  const int64_t block_bytes = setup->geometry.BytesPerBlock();
  std::mt19937_64 rng(a.seed);
  std::uniform_int_distribution<int32_t> token(3, model.config().n_vocab - 1);
  std::vector<std::vector<int32_t>> prompts(a.requests, std::vector<int32_t>(a.prompt_tokens));
  for (auto& p : prompts) {
    for (int32_t& t : p) t = token(rng);
  }
  ThreadPool pool(ThreadPool::ResolveThreadCount(a.threads));
  const int32_t usable = cfg.n_blocks - 1;
  if (!a.json) {
    std::fprintf(stderr,
                 "bench evict: %d requests of %d + %d tokens, concurrency %d, KV memory %lld "
                 "blocks of %d (%.1f MiB), --kv-budget %s --evict-policy %s\n",
                 a.requests, a.prompt_tokens, a.gen_tokens, a.concurrency,
                 static_cast<long long>(usable), cfg.block_size,
                 static_cast<double>(usable) * block_bytes / (1 << 20),
                 cfg.eviction.budget.ToString().c_str(), cfg.eviction.policy.c_str());
  }
  auto evict = RunOnce(model, tok, pool, *setup, prompts, a.gen_tokens, a.json, "evict");
  if (!evict.ok()) {
    std::fprintf(stderr, "error: %s\n", evict.error().c_str());
    return 1;
  }
  nlohmann::json j = {{"model", path},
                      {"requests", a.requests},
                      {"concurrency", a.concurrency},
                      {"prompt_tokens", a.prompt_tokens},
                      {"gen_tokens", a.gen_tokens},
                      {"kv_budget", cfg.eviction.budget.ToString()},
                      {"evict_policy", cfg.eviction.policy},
                      {"kv_sink", cfg.eviction.guard.sink},
                      {"kv_window", cfg.eviction.guard.window},
                      {"cache_type_k", a.engine.cache_type_k},
                      {"cache_type_v", a.engine.cache_type_v},
                      {"block_size", cfg.block_size},
                      {"kv_blocks", usable},
                      {"kv_memory_bytes", static_cast<int64_t>(usable) * block_bytes},
                      {"threads", pool.size()},
                      {"evict", evict->Json(cfg.block_size, usable)},
                      {"evicted_tokens", evict->evicted_tokens},
                      {"blocks_freed", evict->blocks_freed},
                      {"freed_ratio", evict->FreedRatio(cfg.block_size)},
                      {"max_concurrent", evict->max_concurrent},
                      {"decode_tps", evict->decode_tps}};
  if (!a.skip_baseline) {
    auto base = EvictSetup(a, model, tok, /*with_budget=*/false);
    if (!base.ok()) {
      std::fprintf(stderr, "error: %s\n", base.error().c_str());
      return 1;
    }
    auto plain = RunOnce(model, tok, pool, *base, prompts, a.gen_tokens, a.json, "no evict");
    if (!plain.ok()) {
      std::fprintf(stderr, "error: %s\n", plain.error().c_str());
      return 1;
    }
    j["no_evict"] = plain->Json(cfg.block_size, usable);
    j["max_concurrent_no_evict"] = plain->max_concurrent;
    j["concurrency_ratio"] =
        static_cast<double>(evict->max_concurrent) / std::max(1, plain->max_concurrent);
    j["decode_tps_no_evict"] = plain->decode_tps;
    j["decode_speedup"] = plain->decode_tps > 0 ? evict->decode_tps / plain->decode_tps : 0.0;
    j["output_speedup"] = plain->output_tps > 0 ? evict->output_tps / plain->output_tps : 0.0;
  }
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("evicted %lld positions in %lld compactions; %lld blocks freed (freed ratio %.3f)\n",
              static_cast<long long>(evict->evicted_tokens),
              static_cast<long long>(evict->compactions),
              static_cast<long long>(evict->blocks_freed), evict->FreedRatio(cfg.block_size));
  std::printf(
      "| run | max concurrent | peak blocks/seq | preemptions | output t/s | decode t/s |\n"
      "|---|---|---|---|---|---|\n");
  std::printf("| --kv-budget %s | %d | %d | %lld | %.1f | %.1f |\n",
              cfg.eviction.budget.ToString().c_str(), evict->max_concurrent,
              evict->peak_blocks_per_seq, static_cast<long long>(evict->preemptions),
              evict->output_tps, evict->decode_tps);
  if (j.contains("no_evict")) {
    const nlohmann::json& p = j["no_evict"];
    std::printf("| no eviction | %d | %d | %lld | %.1f | %.1f |\n",
                p["max_concurrent"].get<int32_t>(), p["peak_blocks_per_seq"].get<int32_t>(),
                static_cast<long long>(p["preemptions"].get<int64_t>()),
                p["output_tps"].get<double>(), p["decode_tps"].get<double>());
    std::printf("eviction vs none: %.2fx concurrent sequences, %.2fx decode t/s\n",
                j["concurrency_ratio"].get<double>(), j["decode_speedup"].get<double>());
  }
  return 0;
}

}  // namespace

Runner AddEvictBenchCommand(CLI::App* bench) {
  auto a = std::make_shared<EvictArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "evict", "Token eviction at a fixed KV memory: blocks freed, concurrency, decode t/s");
  cmd->add_option("-m,--model", a->model, "GGUF model file");
  AddModelFlags(cmd, &a->model_options);
  cmd->add_option("--requests", a->requests, "Requests")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--concurrency", a->concurrency, "Requests running at once (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(0, kMaxParallelSequences));
  cmd->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length (random tokens)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--gen-tokens", a->gen_tokens, "Tokens generated per request (EOS ignored)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("-d,--depth", a->depth,
                  "Prompt length, as --prompt-tokens (the depth decoding "
                  "starts at)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--kv-budget", a->engine.kv_budget,
                  "Positions each sequence keeps, or N% of its length")
      ->capture_default_str();
  cmd->add_option("--kv-sink", a->engine.kv_sink, "First positions never evicted")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-window", a->engine.kv_window, "Recent positions never evicted")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--evict-policy", a->engine.evict_policy, "streaming, keydiff, h2o, snapkv, tri")
      ->capture_default_str()
      ->check(CLI::IsMember({"keydiff", "streaming", "h2o", "snapkv", "tri"}));
  cmd->add_option("--evict-every", a->engine.evict_every,
                  "Decode steps between evictions (0: a block past the budget)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-memory", a->kv_memory,
                  "KV pool of both runs (default: 4 requests at full length without eviction)");
  cmd->add_option("--cache-type-k", a->engine.cache_type_k, "KV cache type of keys; also -ctk")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", a->engine.cache_type_v, "KV cache type of values; also -ctv")
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->engine.max_batch_tokens, "Tokens per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("-t,--threads", a->threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("-s,--seed", a->seed, "Prompt seed")->capture_default_str();
  cmd->add_flag("--skip-baseline", a->skip_baseline, "Only the run with eviction");
  cmd->add_flag("--json", a->json, "Print one JSON object (stdout holds only it)");
  return [a, cmd]() -> int { return cmd->parsed() ? RunEvict(*a) : -1; };
}

}  // namespace kvs::cli
