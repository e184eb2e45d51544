// Kernel microbenchmarks (Google Benchmark): matrix products of the shapes llama-1b multiplies,
// per weight type, for one token (decode) and a 512-token prefill, in the layout the model
// loader gives each type. Prints GFLOP/s (and GB/s of weights for decode); nothing is asserted.
//   build/bench/kernels_bench --benchmark_filter=MatMul --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/repack.h"
#include "tensor/quantize.h"

namespace kvs {
namespace {

struct Fixture {
  std::vector<uint8_t> bytes;
  MatrixView w;
  std::vector<float> x, out;
};

Fixture Make(DType t, int64_t rows, int64_t cols, int64_t tokens) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  Fixture f;
  f.bytes = QuantizeMatrix(t, values.data(), rows, cols);
  f.w = MatrixView{t, f.bytes.data(), rows, cols, RowBytes(t, static_cast<size_t>(cols))};
  if (CanInterleave(f.w)) InterleaveRows(&f.w, f.bytes.data());
  f.x.resize(static_cast<size_t>(tokens * cols));
  for (float& v : f.x) v = dist(rng);
  f.out.resize(static_cast<size_t>(tokens * rows));
  return f;
}

void BM_MatMul(benchmark::State& state) {
  const auto type = static_cast<DType>(state.range(0));
  const int64_t tokens = state.range(1), rows = 8192, cols = 2048;
  Fixture f = Make(type, rows, cols, tokens);
  ThreadPool pool(static_cast<int>(state.range(2)));
  for (auto _ : state) {
    MatMul(f.w, f.x.data(), tokens, f.out.data(), pool);
    benchmark::DoNotOptimize(f.out.data());
  }
  state.SetLabel(std::string(DTypeName(type)) + (f.w.layout == WeightLayout::kRows ? "" : " il16"));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * rows * cols * tokens * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(f.bytes.size()) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
}

void Args(benchmark::internal::Benchmark* b) {
  for (DType t : {DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K}) {
    for (int64_t tokens : {1, 512}) b->Args({static_cast<int64_t>(t), tokens, 2});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_MatMul)->Apply(Args);

}  // namespace
}  // namespace kvs

BENCHMARK_MAIN();
