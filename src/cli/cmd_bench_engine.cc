// Engine benchmarks:
//   `kvserve bench memory`: one long-tailed workload at a fixed KV budget, served by a
//   contiguous cache that reserves the whole context per request and by the paged pool;
//   fragmentation, concurrency and throughput of each.
//   `kvserve bench throughput`: offline throughput of N requests at concurrency C.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <random>

#include <nlohmann/json.hpp>

#include "api/engine_setup.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "engine/engine.h"
#include "kvserve/kvserve.h"

namespace kvs::cli {
namespace {

// ---- bench memory -------------------------------------------------------------------------

struct MemoryArgs {
  std::string model;
  int32_t requests = 200;
  int32_t n_ctx = 2048;
  double kv_contexts = 8;  // KV budget in full contexts
  int32_t max_seqs = 256;
  int32_t max_batch_tokens = 512;
  int32_t block_size = 16;
  int32_t prompt_median = 128;
  int32_t output_median = 96;
  double sigma = 1.0;
  uint64_t seed = 42;
  int32_t threads = ThreadPool::DefaultThreadCount();
  bool json = false;
  bool verbose = false;
  kvserve::ModelOptions model_options;
};

struct Job {
  std::vector<int32_t> prompt;
  int32_t max_tokens;
};

// Prompt and output lengths drawn from log-normal distributions (long-tailed: most requests
// are short, a few are long), clamped so that every request fits the context.
std::vector<Job> MakeWorkload(const MemoryArgs& a, int32_t n_vocab) {
  std::mt19937_64 rng(a.seed);
  std::lognormal_distribution<double> prompt_len(std::log(a.prompt_median), a.sigma);
  std::lognormal_distribution<double> output_len(std::log(a.output_median), a.sigma);
  std::uniform_int_distribution<int32_t> token(3, n_vocab - 1);
  std::vector<Job> jobs;
  for (int32_t i = 0; i < a.requests; ++i) {
    const int32_t p = std::clamp<int32_t>(std::lround(prompt_len(rng)), 4, a.n_ctx / 2);
    const int32_t o = std::clamp<int32_t>(std::lround(output_len(rng)), 4, a.n_ctx - p - 1);
    Job job{std::vector<int32_t>(p), o};
    for (int32_t& t : job.prompt) t = token(rng);
    jobs.push_back(std::move(job));
  }
  return jobs;
}

struct MemoryResult {
  double fragmentation_pct = 0;     // time-averaged reserved-but-unused share of reserved KV
  double waste_blocks_per_seq = 0;  // time-averaged unused positions per running sequence / B
  int32_t max_concurrent = 0;
  double mean_concurrent = 0;  // time-averaged running sequences
  double wall_s = 0;
  double output_tps = 0, total_tps = 0;
  int64_t steps = 0, preemptions = 0;

  nlohmann::json Json() const {
    return {{"fragmentation_pct", fragmentation_pct},
            {"waste_blocks_per_seq", waste_blocks_per_seq},
            {"max_concurrent", max_concurrent},
            {"mean_concurrent", mean_concurrent},
            {"wall_s", wall_s},
            {"output_tps", output_tps},
            {"total_tps", total_tps},
            {"steps", steps},
            {"preemptions", preemptions}};
  }
};

Expected<MemoryResult> ServeWorkload(const Model& model, const std::vector<Job>& jobs,
                                     const MemoryArgs& a, bool contiguous, ThreadPool& pool) {
  // f32 K/V, a pool of exactly the bytes of kv_contexts full contexts in every layer: a model of
  // several KV groups (sliding windows) has blocks of fewer layers (kv_slabs), so more of them.
  kvserve::EngineOptions eo;
  eo.n_ctx = a.n_ctx;
  eo.n_parallel = a.max_seqs;
  eo.max_batch_tokens = a.max_batch_tokens;
  eo.block_size = a.block_size;
  eo.cache_type_k = eo.cache_type_v = "f32";
  eo.reserve_full_context = contiguous;
  const ModelConfig& c = model.config();
  const PoolShape shape{
      static_cast<int32_t>(a.kv_contexts * a.n_ctx / a.block_size * c.n_layer / c.kv_slabs()) + 1};
  KVS_ASSIGN_OR_RETURN(EngineSetup setup, ResolveEngineOptions(eo, model, nullptr, shape));
  KVS_ASSIGN_OR_RETURN(LocalEngine local, BuildLocalEngine(std::move(setup), model, nullptr, pool));
  Engine& engine = *local.engine;
  int64_t output_tokens = 0, prompt_tokens = 0;
  for (const Job& job : jobs) {
    RequestOptions o;
    o.sampling.temperature = 0;
    o.max_tokens = job.max_tokens;
    prompt_tokens += static_cast<int64_t>(job.prompt.size());
    auto id = engine.Submit(job.prompt, o, [&](const TokenEvent& e) {
      if (e.token >= 0) ++output_tokens;
    });
    if (!id.ok()) return id.status();
  }
  MemoryResult r;
  double waste_time = 0, reserved_time = 0, seq_time = 0, time = 0;
  const auto t0 = Clock::now();
  int64_t last_report = 0;
  while (engine.HasWork()) {
    const auto ts = Clock::now();
    EngineStepStats s;
    KVS_RETURN_IF_ERROR(engine.Step(&s));
    const double dt = Since(ts);
    if (a.verbose) {
      std::fprintf(stderr, "step %lld: %d tokens, %d running, %d waiting, %d preempted, %.4f s\n",
                   static_cast<long long>(r.steps), s.n_tokens, s.n_running, s.n_waiting,
                   s.n_preempted, dt);
    }
    // The KV state a step leaves is what the next step's time is spent holding; weighting each
    // step's end state by its own duration is the same up to one step.
    waste_time += static_cast<double>(s.reserved_positions - s.used_positions) * dt;
    reserved_time += static_cast<double>(s.reserved_positions) * dt;
    seq_time += s.n_running * dt;
    time += dt;
    r.max_concurrent = std::max(r.max_concurrent, s.n_running);
    r.preemptions += s.n_preempted;
    ++r.steps;
    if (!a.json && output_tokens - last_report >= 20000) {
      last_report = output_tokens;
      std::fprintf(stderr, "  %s: %lld tokens generated, %d running, %d waiting\n",
                   contiguous ? "contiguous" : "paged", static_cast<long long>(output_tokens),
                   s.n_running, s.n_waiting);
    }
  }
  r.wall_s = Since(t0);
  r.fragmentation_pct = reserved_time > 0 ? 100.0 * waste_time / reserved_time : 0;
  r.waste_blocks_per_seq = seq_time > 0 ? waste_time / seq_time / a.block_size : 0;
  r.mean_concurrent = time > 0 ? seq_time / time : 0;
  r.output_tps = output_tokens / r.wall_s;
  r.total_tps = (output_tokens + prompt_tokens) / r.wall_s;
  return r;
}

int RunMemory(const MemoryArgs& a) {
  std::string path = a.model;
  if (!ResolveModelPath(path)) return 1;
  auto model = Model::Load(path, {.check_tensors = a.model_options.check_tensors});
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.error().c_str());
    return 1;
  }
  if (a.kv_contexts < 1) {
    std::fprintf(stderr, "error: --kv-contexts must be at least 1 (one full context)\n");
    return 1;
  }
  const std::vector<Job> jobs = MakeWorkload(a, (*model)->config().n_vocab);
  int64_t sum_p = 0, sum_o = 0;
  for (const Job& j : jobs) {
    sum_p += static_cast<int64_t>(j.prompt.size());
    sum_o += j.max_tokens;
  }
  ThreadPool pool(ThreadPool::ResolveThreadCount(a.threads));
  nlohmann::json out;
  out["workload"] = {{"requests", a.requests},
                     {"n_ctx", a.n_ctx},
                     {"kv_budget_positions", static_cast<int64_t>(a.kv_contexts * a.n_ctx)},
                     {"block_size", a.block_size},
                     {"prompt",
                      {{"distribution", "lognormal"},
                       {"median", a.prompt_median},
                       {"sigma", a.sigma},
                       {"mean", double(sum_p) / a.requests}}},
                     {"output",
                      {{"distribution", "lognormal"},
                       {"median", a.output_median},
                       {"sigma", a.sigma},
                       {"mean", double(sum_o) / a.requests}}},
                     {"seed", a.seed},
                     {"model", path}};
  MemoryResult res[2];
  for (int mode = 0; mode < 2; ++mode) {
    if (!a.json)
      std::fprintf(stderr, "serving with the %s cache...\n", mode ? "paged" : "contiguous");
    auto r = ServeWorkload(**model, jobs, a, /*contiguous=*/mode == 0, pool);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.error().c_str());
      return 1;
    }
    res[mode] = *r;
  }
  out["contiguous"] = res[0].Json();
  out["paged"] = res[1].Json();
  out["concurrency_ratio"] = double(res[1].max_concurrent) / std::max(1, res[0].max_concurrent);
  out["throughput_ratio"] = res[1].output_tps / res[0].output_tps;
  if (a.json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf(
      "workload: %d requests, prompt mean %.0f / output mean %.0f tokens (log-normal, "
      "medians %d / %d, sigma %.2f, seed %llu), context %d, KV budget %.0f positions\n",
      a.requests, double(sum_p) / a.requests, double(sum_o) / a.requests, a.prompt_median,
      a.output_median, a.sigma, static_cast<unsigned long long>(a.seed), a.n_ctx,
      a.kv_contexts * a.n_ctx);
  std::printf(
      "| cache | fragmentation | waste (blocks/seq) | max concurrent | mean concurrent | "
      "output t/s | total t/s | preemptions |\n|---|---|---|---|---|---|---|---|\n");
  for (int mode = 0; mode < 2; ++mode) {
    const MemoryResult& r = res[mode];
    std::printf("| %s | %.1f%% | %.2f | %d | %.1f | %.1f | %.1f | %lld |\n",
                mode ? "paged" : "contiguous", r.fragmentation_pct, r.waste_blocks_per_seq,
                r.max_concurrent, r.mean_concurrent, r.output_tps, r.total_tps,
                static_cast<long long>(r.preemptions));
  }
  std::printf("paged vs contiguous: %.2fx concurrency, %.2fx output throughput\n",
              out["concurrency_ratio"].get<double>(), out["throughput_ratio"].get<double>());
  return 0;
}

// ---- bench throughput ---------------------------------------------------------------------

struct ThroughputArgs {
  std::string model;
  int32_t requests = 64;
  int32_t concurrency = 16;
  int32_t prompt_tokens = 128;
  int32_t gen_tokens = 128;
  uint64_t seed = 42;
  bool json = false;
  EngineFlags engine;
  kvserve::ModelOptions model_options;
};

int RunThroughput(ThroughputArgs a) {
  std::string path = a.model;
  if (!ResolveModelPath(path)) return 1;
  if (!ResolveKvMemory(&a.engine)) return 1;
  if (!ResolveSpecFlags(&a.engine)) return 1;
  std::string error;
  auto model = kvserve::Model::Load(path, a.model_options, &error);
  if (!model) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  kvserve::EngineOptions& eo = a.engine.options;
  eo.n_parallel = a.concurrency;
  eo.n_ctx = a.prompt_tokens + a.gen_tokens + 1;
  auto engine = kvserve::Engine::Start(model, eo, &error);
  if (!engine) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  std::mt19937_64 rng(a.seed);
  std::uniform_int_distribution<int32_t> token(3, model->n_vocab() - 1);
  std::mutex mu;
  std::condition_variable done;
  int32_t finished = 0;
  std::vector<double> first_token(a.requests + 1, -1), token_times;
  std::string failure;
  kvserve::GenerationOptions g;
  g.max_tokens = a.gen_tokens;
  g.ignore_eos = true;
  g.temperature = 0;
  const auto t0 = Clock::now();
  for (int32_t i = 0; i < a.requests; ++i) {
    std::vector<int32_t> prompt(a.prompt_tokens);
    for (int32_t& t : prompt) t = token(rng);
    const uint64_t id = engine->Submit(
        std::move(prompt), g,
        [&, i](const kvserve::TokenEvent& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (e.token >= 0) {
            const double t = Since(t0);
            token_times.push_back(t);
            if (first_token[i] < 0) first_token[i] = t;
          }
          if (e.finished) {
            if (e.finish_reason == "error") failure = e.error;
            ++finished;
            done.notify_all();
          }
        },
        &error);
    if (id == 0) {
      std::fprintf(stderr, "error: %s\n", error.c_str());
      return 1;
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  done.wait(lock, [&] { return finished == a.requests; });
  const double wall = Since(t0);
  if (!failure.empty()) {
    std::fprintf(stderr, "error: %s\n", failure.c_str());
    return 1;
  }
  const int64_t n_out = static_cast<int64_t>(token_times.size());
  double ttft = 0, last_first = 0;
  for (int32_t i = 0; i < a.requests; ++i) {
    ttft += first_token[i];
    last_first = std::max(last_first, first_token[i]);
  }
  ttft /= a.requests;
  // Aggregate decode rate: tokens after every request has its first token, over that window
  // (with requests == concurrency: all sequences decoding together, as llama-batched-bench's
  // S_TG measures).
  int64_t decode_tokens = 0;
  for (double t : token_times) decode_tokens += t > last_first ? 1 : 0;
  const double decode_tps = wall > last_first ? decode_tokens / (wall - last_first) : 0;
  const kvserve::EngineStats s = engine->stats();
  nlohmann::json j = {{"model", path},
                      {"requests", a.requests},
                      {"concurrency", a.concurrency},
                      {"prompt_tokens", a.prompt_tokens},
                      {"gen_tokens", a.gen_tokens},
                      {"max_batch_tokens", eo.max_batch_tokens},
                      {"max_step_ms", eo.max_step_ms},
                      {"threads", engine->options().threads},
                      {"wall_s", wall},
                      {"output_tokens", n_out},
                      {"output_tps", n_out / wall},
                      {"total_tps", (n_out + int64_t{a.requests} * a.prompt_tokens) / wall},
                      {"decode_tps", decode_tps},
                      {"mean_ttft_s", ttft},
                      {"preemptions", s.preemptions},
                      {"steps", s.steps}};
  if (a.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%d requests (%d prompt + %d generated tokens each) at concurrency %d: %.2f s\n",
                a.requests, a.prompt_tokens, a.gen_tokens, a.concurrency, wall);
    std::printf(
        "output %.1f t/s, total %.1f t/s, aggregate decode %.1f t/s, mean TTFT %.3f s, "
        "%lld steps, %lld preemptions\n",
        n_out / wall, (n_out + int64_t{a.requests} * a.prompt_tokens) / wall, decode_tps, ttft,
        static_cast<long long>(s.steps), static_cast<long long>(s.preemptions));
  }
  return 0;
}

}  // namespace

Runner AddEngineBenchCommands(CLI::App* bench) {
  auto m = std::make_shared<MemoryArgs>();
  CLI::App* memory = bench->add_subcommand(
      "memory", "Paged vs contiguous KV: fragmentation, concurrency and throughput");
  memory->add_option("-m,--model", m->model, "GGUF model file");
  AddModelFlags(memory, &m->model_options);
  memory->add_option("--requests", m->requests, "Requests in the workload")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  memory->add_option("-c,--ctx-size", m->n_ctx, "Context per request (what contiguous reserves)")
      ->capture_default_str()
      ->check(CLI::Range(32, 1 << 20));
  memory->add_option("--kv-contexts", m->kv_contexts, "KV budget, in full contexts")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  memory->add_option("--parallel", m->max_seqs, "Most sequences running at once (also -np)")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxParallelSequences));
  memory->add_option("--max-batch-tokens", m->max_batch_tokens, "Tokens per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  memory->add_option("--block-size", m->block_size, "Positions per block")
      ->capture_default_str()
      ->check(CLI::Range(16, 1024));
  memory->add_option("--prompt-median", m->prompt_median, "Median prompt length")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  memory->add_option("--output-median", m->output_median, "Median output length")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  memory->add_option("--sigma", m->sigma, "Log-normal sigma of both lengths")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 4.0));
  memory->add_option("-s,--seed", m->seed, "Workload seed")->capture_default_str();
  memory->add_option("-t,--threads", m->threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  memory->add_flag("--json", m->json, "Print one JSON object");
  memory->add_flag("-v,--verbose", m->verbose, "Print every step on stderr");

  auto t = std::make_shared<ThroughputArgs>();
  CLI::App* throughput =
      bench->add_subcommand("throughput",
                            "Offline throughput: N requests at concurrency C (no step target "
                            "unless --max-step-ms is given)");
  throughput->add_option("-m,--model", t->model, "GGUF model file");
  AddModelFlags(throughput, &t->model_options);
  throughput->add_option("--requests", t->requests, "Requests")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  throughput->add_option("--concurrency", t->concurrency, "Requests running at once (-np)")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxParallelSequences));
  throughput->add_option("--prompt-tokens", t->prompt_tokens, "Prompt length (random tokens)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  throughput
      ->add_option("--gen-tokens", t->gen_tokens, "Tokens generated per request (EOS ignored)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  throughput->add_option("-s,--seed", t->seed, "Prompt seed")->capture_default_str();
  throughput->add_flag("--json", t->json, "Print one JSON object");
  // An offline batch has no one waiting between tokens: no step target by default, so prompts
  // take the whole --max-batch-tokens and all sequences decode together (as vLLM sizes its
  // offline LLM class's batches apart from its API server's). --max-step-ms still applies.
  t->engine.options.max_step_ms = 0;
  AddEngineFlags(throughput, &t->engine, /*default_parallel=*/16);
  throughput->remove_option(throughput->get_option("--parallel"));
  throughput->remove_option(throughput->get_option("--ctx-size"));

  return [m, memory, t, throughput]() -> int {
    if (memory->parsed()) return RunMemory(*m);
    if (throughput->parsed()) return RunThroughput(*t);
    return -1;
  };
}

}  // namespace kvs::cli
