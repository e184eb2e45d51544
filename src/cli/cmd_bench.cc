// `kvserve bench speed`: prefill and decode tokens/s, like llama-bench's pp/tg tests (-d: after
// a context of that many tokens; -ctk/-ctv: the KV cache types). `kvserve bench bandwidth`: the
// read bandwidth of memory like the weights' (huge pages), decode's roofline.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <utility>

#include <nlohmann/json.hpp>

#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/page_memory.h"
#include "core/thread_pool.h"
#include "engine/engine_builder.h"
#include "kernels/compute_peak.h"
#include "kernels/cpu_isa.h"
#include "kernels/kv_types.h"
#include "tokenizer/tokenizer.h"

namespace kvs::cli {
namespace {

struct SpeedArgs {
  std::string model;
  int32_t n_prompt = 512;
  int32_t n_gen = 128;
  int32_t threads = ThreadPool::DefaultThreadCount();
  int32_t reps = 5;
  int32_t depth = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  std::string kv_calibration;
  bool json = false;
  kvserve::ModelOptions model_options;
  EngineFlags spec;  // --spec-type and the draft flags (the rest of it unused)
};

struct MeanStd {
  double mean = 0, stddev = 0;
};

MeanStd Summarize(const std::vector<double>& v) {
  MeanStd s;
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= v.size();
  if (v.size() > 1) {
    double var = 0;
    for (double x : v) var += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(var / (v.size() - 1));
  }
  return s;
}

int RunSpeed(const SpeedArgs& a) {
  if (a.spec.options.spec_type == "none") {
    if (!a.spec.draft_model_path.empty()) {
      // -md alone means --spec-type draft, as everywhere else (it was silently ignored).
      SpeedArgs with_draft = a;
      with_draft.spec.options.spec_type = "draft";
      return RunSpeed(with_draft);
    }
    // Draft flags without --spec-type are an error, not ignored (nothing to load here).
    EngineFlags flags = a.spec;
    if (!ResolveSpecFlags(&flags)) return 1;
  }
  if (a.spec.options.spec_type != "none") {
    // The decode test with speculation: through the engine, against the engine without it.
    // It times tokens after the first: one generated token has no speed to compare.
    if (a.n_gen < 2) {
      std::fprintf(stderr,
                   "error: bench speed --spec-type runs the decode test only: it needs -n 2 or "
                   "more (-n %d)\n",
                   a.n_gen);
      return 1;
    }
    SpecBenchArgs s;
    s.model = a.model;
    s.model_options = a.model_options;
    s.engine = a.spec;
    s.engine.options.threads = a.threads;
    s.engine.options.cache_type_k = a.cache_type_k;
    s.engine.options.cache_type_v = a.cache_type_v;
    s.engine.options.kv_calibration_file = a.kv_calibration;
    s.n_gen = a.n_gen;
    s.depth = a.depth;
    s.reps = a.reps;
    s.json = a.json;
    return RunSpecBench(std::move(s));
  }
  std::string path = a.model;
  if (!ResolveModelPath(path)) return 1;
  auto model = Model::Load(path, {.check_tensors = a.model_options.check_tensors});
  if (!model) {
    std::fprintf(stderr, "error: %s\n", model.error().c_str());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  KvTypes types;
  for (auto [name, type] :
       {std::pair{&a.cache_type_k, &types.k}, std::pair{&a.cache_type_v, &types.v}}) {
    auto parsed = ParseKvType(*name);
    if (!parsed) {
      std::fprintf(stderr, "error: %s\n", parsed.error().c_str());
      return 1;
    }
    *type = *parsed;
  }
  if (Status st = ModelKvGeometry(c, kKvBlockTokens, types).Validate(); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 1;
  }
  const int32_t threads = ThreadPool::ResolveThreadCount(a.threads);
  ThreadPool pool(threads);
  const int32_t n_ctx = a.depth + std::max(a.n_prompt, a.n_gen) + 1;
  auto tok = Tokenizer::FromGguf((*model)->file());
  KvFormatOptions kv = KvFormatWithTypes(types);
  if (!a.kv_calibration.empty()) {
    if (!tok) {
      std::fprintf(stderr, "error: %s\n", tok.error().c_str());
      return 1;
    }
    if (Status st = UseCalibrationFile(a.kv_calibration, **tok, &kv); !st.ok()) {
      std::fprintf(stderr, "error: %s\n", st.message().c_str());
      return 1;
    }
  }
  auto made = EngineBuilder(**model, tok ? tok->get() : nullptr, pool, std::move(kv)).Single(n_ctx);
  if (!made) {
    std::fprintf(stderr, "error: %s\n", made.error().c_str());
    return 1;
  }
  SingleSequence& forward = **made;
  std::vector<float> logits(c.n_vocab);
  // Random tokens, as llama-bench uses: the content does not change the work done.
  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(std::max({a.n_prompt, a.depth, 1}));
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % c.n_vocab);
  // The context the tests run after: filled once, untimed; each test then writes (and rewrites)
  // the positions after it.
  if (a.depth > 0) {
    if (!a.json) std::fprintf(stderr, "filling a context of %d tokens\n", a.depth);
    for (int32_t pos = 0; pos < a.depth; pos += 512) {
      const int32_t n = std::min(512, a.depth - pos);
      Status st = forward.Run(prompt.data() + pos, n, pos, 1, logits.data());
      if (!st.ok()) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
      }
    }
  }

  std::vector<double> pp, tg;
  // One untimed warm-up of each test pages the weights in and sizes the buffers.
  for (int32_t rep = -1; rep < a.reps; ++rep) {
    if (a.n_prompt > 0) {
      auto t0 = std::chrono::steady_clock::now();
      Status st = forward.Run(prompt.data(), a.n_prompt, a.depth, 1, logits.data());
      if (!st.ok()) {
        std::fprintf(stderr, "error: %s\n", st.message().c_str());
        return 1;
      }
      if (rep >= 0) pp.push_back(a.n_prompt / Since(t0));
    }
    if (a.n_gen > 0) {
      auto t0 = std::chrono::steady_clock::now();
      int32_t token = prompt[0];
      for (int32_t i = 0; i < a.n_gen; ++i) {
        Status st = forward.Run(&token, 1, a.depth + i, 1, logits.data());
        if (!st.ok()) {
          std::fprintf(stderr, "error: %s\n", st.message().c_str());
          return 1;
        }
        token = static_cast<int32_t>(rng() % c.n_vocab);
      }
      if (rep >= 0) tg.push_back(a.n_gen / Since(t0));
    }
    if (!a.json && rep >= 0) std::fprintf(stderr, "rep %d/%d done\n", rep + 1, a.reps);
  }
  MeanStd p = Summarize(pp), g = Summarize(tg);
  // A decoded token reads every weight once and the K/V of its whole context (on average the
  // depth plus half the generated tokens).
  const double weight_bytes = static_cast<double>((*model)->WeightBytesPerToken());
  const double kv_bytes =
      ModelKvGeometry(c, kKvBlockTokens, types).BytesPerToken() * (a.depth + a.n_gen / 2.0);
  const double bytes = weight_bytes + kv_bytes;
  if (a.json) {
    nlohmann::json j = {{"model", path},
                        {"n_threads", threads},
                        {"reps", a.reps},
                        {"depth", a.depth},
                        {"cache_type_k", a.cache_type_k},
                        {"cache_type_v", a.cache_type_v},
                        {"pp_tokens", a.n_prompt},
                        {"pp_tps", p.mean},
                        {"pp_tps_stddev", p.stddev},
                        {"tg_tokens", a.n_gen},
                        {"tg_tps", g.mean},
                        {"tg_tps_stddev", g.stddev},
                        {"weight_bytes_per_token", weight_bytes},
                        {"kv_bytes_per_token", kv_bytes},
                        {"tg_gbps", g.mean * bytes / 1e9}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    const std::string at = a.depth > 0 ? " @ d" + std::to_string(a.depth) : "";
    std::printf("| model | threads | K/V | test | t/s |\n|---|---|---|---|---|\n");
    if (a.n_prompt > 0) {
      std::printf("| %s | %d | %s/%s | pp%d%s | %.2f ± %.2f |\n", c.name.c_str(), threads,
                  a.cache_type_k.c_str(), a.cache_type_v.c_str(), a.n_prompt, at.c_str(), p.mean,
                  p.stddev);
    }
    if (a.n_gen > 0) {
      std::printf("| %s | %d | %s/%s | tg%d%s | %.2f ± %.2f |\n", c.name.c_str(), threads,
                  a.cache_type_k.c_str(), a.cache_type_v.c_str(), a.n_gen, at.c_str(), g.mean,
                  g.stddev);
      std::printf("decode reads %.3f GB per token (weights %.3f, K/V %.3f): %.1f GB/s\n",
                  bytes / 1e9, weight_bytes / 1e9, kv_bytes / 1e9, g.mean * bytes / 1e9);
    }
  }
  return 0;
}

// Read bandwidth: every thread sums its share of a buffer far larger than the caches, the
// same access pattern as decode streaming the weights. Best of several passes. The buffer is
// allocated as the weights are (AllocatePages: huge pages by default), so that the figure is
// the roofline of the memory decode actually reads; --pages small gives 4 KiB pages.
int RunBandwidth(int32_t requested_threads, int32_t size_mib, const std::string& pages, bool json) {
  const int32_t threads = ThreadPool::ResolveThreadCount(requested_threads);
  const size_t n = static_cast<size_t>(size_mib) << 18;  // floats
  const size_t bytes = n * sizeof(float);
  auto mem = AllocatePages(bytes, pages == "small" ? PageSize::kSmall : PageSize::kHuge);
  if (!mem) {
    std::fprintf(stderr, "error: cannot allocate %d MiB: %s\n", size_mib, mem.error().c_str());
    return 1;
  }
  float* buf = reinterpret_cast<float*>(mem->data());
  ThreadPool pool(threads);
  // The first touch allocates the pages, huge or small.
  pool.ParallelFor(n, 1 << 14, [&](int, size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) buf[i] = static_cast<float>(i & 1023);
  });
  const int64_t huge_bytes = HugePageBytes(buf, bytes);
  const double huge_pct = huge_bytes < 0 ? -1 : 100.0 * huge_bytes / bytes;
  const std::string policy = TransparentHugePagePolicy();
  std::vector<double> sums(threads);
  double best = 0;
  for (int pass = 0; pass < 8; ++pass) {
    auto t0 = std::chrono::steady_clock::now();
    pool.ParallelFor(n, 1 << 14, [&](int t, size_t b, size_t e) {
      float acc[64] = {};  // four vectors of partial sums: the adds never wait on each other
      for (size_t i = b; i + 64 <= e; i += 64) {
        for (int k = 0; k < 64; ++k) acc[k] += buf[i + k];
      }
      double total = 0;
      for (float v : acc) total += v;
      sums[t] += total;  // keeps the loads alive
    });
    best = std::max(best, bytes / Since(t0) / 1e9);
  }
  if (json) {
    nlohmann::json j = {{"threads", threads},
                        {"buffer_mib", size_mib},
                        {"pages", pages},
                        {"thp_policy", policy},
                        {"read_gbps", best}};
    // null when /proc/self/smaps cannot be read
    j["huge_page_pct"] = huge_pct < 0 ? nlohmann::json() : nlohmann::json(huge_pct);
    std::printf("%s\n", j.dump().c_str());
  } else {
    const std::string share =
        huge_pct < 0 ? "share in huge pages unknown" : StrFormat("%.0f%% in huge pages", huge_pct);
    std::printf(
        "read bandwidth, %d thread(s), %d MiB buffer, %s pages (%s; THP policy %s): %.1f GB/s "
        "(checksum %g)\n",
        threads, size_mib, pages.c_str(), share.c_str(), policy.c_str(), best, sums[0]);
  }
  // Asked for huge pages and did not get most of them: the figure is a 4 KiB-page one.
  if (pages == "huge" && huge_pct >= 0 && huge_pct < 90) {
    std::fprintf(stderr,
                 "warning: the kernel backed only %.0f%% of the buffer with huge pages (THP "
                 "policy %s); the weights read into memory likely get few too\n",
                 huge_pct, policy.c_str());
  }
  return 0;
}

// The compute roofline: every thread runs the multiply-add loops of kernels/compute_peak.h at
// once; best of five passes each. A multiply-add counts as two operations in OPS and FLOPS.
int RunCompute(int32_t requested_threads, bool json) {
  if (!ComputePeakHasAvx2Fma()) {
    // The scalar twins compute the loops' results in closed form (they exist to check the
    // vector loops): timing them would report a peak that no kernel reaches.
    std::fprintf(stderr,
                 "error: bench compute measures AVX-512 VNNI and AVX2/AVX-512 FMA loops, and the "
                 "level in force is %s (KVSERVE_ISA, or a CPU without them); no loop of this "
                 "level is timed\n",
                 std::string(IsaName(ActiveIsa())).c_str());
    return 2;
  }
  // At the avx2 level only the f32 loop is timed: AVX2 has no vpdpbusd (its kernels multiply
  // int8 by maddubs + madd), and the int8 loop there is its closed-form twin.
  const bool int8_timed = ComputePeakHasAvx512();
  const int32_t threads = ThreadPool::ResolveThreadCount(requested_threads);
  const int64_t iterations = int64_t{1} << 24;
  ThreadPool pool(threads);
  std::vector<double> sink(threads);
  const auto best_rate = [&](auto loop, int64_t macs_per_iteration) {
    double best = 0;
    for (int pass = 0; pass < 5; ++pass) {
      const auto t0 = std::chrono::steady_clock::now();
      pool.ParallelFor(threads, 1, [&](int t, size_t, size_t) {
        sink[t] += static_cast<double>(loop(iterations, static_cast<uint32_t>(pass * 64 + t)));
      });
      best = std::max(best, threads * iterations * macs_per_iteration / Since(t0));
    }
    return best;
  };
  const double int8 = int8_timed ? best_rate(Int8MacLoop, kInt8MacsPerIteration) : 0.0;
  const double f32 = best_rate(F32MacLoop, kF32MacsPerIteration);
  const char* isa = int8_timed ? "avx512-vnni" : "avx2-fma";
  if (json) {
    nlohmann::json j = {{"threads", threads},          {"isa", isa},
                        {"int8_gmacs", nullptr},       {"int8_tops", nullptr},
                        {"f32_gflops", 2 * f32 / 1e9}, {"f32_gmacs", f32 / 1e9}};
    if (int8_timed) {
      j["int8_gmacs"] = int8 / 1e9;
      j["int8_tops"] = 2 * int8 / 1e12;
    }
    std::printf("%s\n", j.dump().c_str());
  } else if (int8_timed) {
    std::printf(
        "compute peak, %d thread(s), %s: int8 (vpdpbusd) %.0f GMAC/s = %.2f TOPS; f32 "
        "(vfmadd) %.0f GMAC/s = %.0f GFLOPS (checksum %g)\n",
        threads, isa, int8 / 1e9, 2 * int8 / 1e12, f32 / 1e9, 2 * f32 / 1e9, sink[0]);
  } else {
    std::printf(
        "compute peak, %d thread(s), %s: f32 (vfmadd, 256-bit) %.0f GMAC/s = %.0f GFLOPS; int8 "
        "not timed at this level (no vpdpbusd) (checksum %g)\n",
        threads, isa, f32 / 1e9, 2 * f32 / 1e9, sink[0]);
  }
  return 0;
}

}  // namespace

Runner AddBenchCommand(CLI::App& root) {
  CLI::App* bench = root.add_subcommand(
      "bench", "Benchmarks (speed, bandwidth, compute, memory, throughput, serve, spec, evict)");
  bench->require_subcommand(1);
  auto a = std::make_shared<SpeedArgs>();
  CLI::App* speed = bench->add_subcommand(
      "speed",
      "Prefill and decode tokens/s, like llama-bench (with --spec-type: the decode test with "
      "speculation against the same engine without it, as bench spec)");
  speed->add_option("-m,--model", a->model, "GGUF model file");
  AddModelFlags(speed, &a->model_options);
  speed->add_option("-p,--n-prompt", a->n_prompt, "Prompt tokens for the prefill test (0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  speed->add_option("-n,--n-gen", a->n_gen, "Tokens for the decode test (0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  speed->add_option("-t,--threads", a->threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  speed->add_option("-r,--repetitions", a->reps, "Repetitions of each test")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  speed
      ->add_option("-d,--n-depth", a->depth,
                   "Tokens of context already in the cache when each test runs")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  speed->add_option("--cache-type-k", a->cache_type_k, "KV cache type of keys; also -ctk")
      ->capture_default_str();
  speed->add_option("--cache-type-v", a->cache_type_v, "KV cache type of values; also -ctv")
      ->capture_default_str();
  speed->add_option("--kv-calibration", a->kv_calibration, kKvCalibrationHelp);
  speed->add_flag("--json", a->json, "Print one JSON object");
  a->spec.options.spec_type = "none";
  AddSpecFlags(speed, &a->spec);
  struct BandwidthArgs {
    int32_t threads = ThreadPool::DefaultThreadCount();
    int32_t size_mib = 1024;
    std::string pages = "huge";
    bool json = false;
  };
  auto bw = std::make_shared<BandwidthArgs>();
  CLI::App* bandwidth =
      bench->add_subcommand("bandwidth", "Memory read bandwidth (the decode roofline)");
  bandwidth->add_option("-t,--threads", bw->threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  bandwidth->add_option("--size-mib", bw->size_mib, "Buffer size in MiB")
      ->capture_default_str()
      ->check(CLI::Range(64, 65536));
  bandwidth
      ->add_option("--pages", bw->pages,
                   "Page size of the buffer: huge (transparent huge pages, as the weights are "
                   "read into) or small (4 KiB)")
      ->capture_default_str()
      ->check(CLI::IsMember({"huge", "small"}));
  bandwidth->add_flag("--json", bw->json, "Print one JSON object");
  auto cp = std::make_shared<std::pair<int32_t, bool>>(ThreadPool::DefaultThreadCount(), false);
  CLI::App* compute = bench->add_subcommand(
      "compute", "Multiply-add peak of this CPU, int8 (VNNI) and f32 (FMA): the compute roofline");
  compute->add_option("-t,--threads", cp->first, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  compute->add_flag("--json", cp->second, "Print one JSON object");
  Runner engine_benches = AddEngineBenchCommands(bench);
  Runner serve_bench = AddServeBenchCommand(bench);
  Runner spec_bench = AddSpecBenchCommand(bench);
  Runner evict_bench = AddEvictBenchCommand(bench);
  return [a, speed, bw, bandwidth, cp, compute, engine_benches, serve_bench, spec_bench,
          evict_bench]() -> int {
    if (const int rc = evict_bench(); rc >= 0) return rc;
    if (const int rc = engine_benches(); rc >= 0) return rc;
    if (const int rc = spec_bench(); rc >= 0) return rc;
    if (const int rc = serve_bench(); rc >= 0) return rc;
    if (bandwidth->parsed()) return RunBandwidth(bw->threads, bw->size_mib, bw->pages, bw->json);
    if (compute->parsed()) return RunCompute(cp->first, cp->second);
    if (!speed->parsed()) return 1;
    return RunSpeed(*a);
  };
}

}  // namespace kvs::cli
