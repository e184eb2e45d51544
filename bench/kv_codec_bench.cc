// Transform codec microbenchmarks (Google Benchmark, issue #23): encoding and decoding one pool
// block of llama-1b's KV shape (16 layers, 8 KV heads, head_dim 64, 16 positions) at tc:BITS into
// f16 and q8_0 pools, on 1 and 2 threads, with a basis fitted to synthetic vectors whose
// variance falls off as trained models' do. Prints MB/s of f16-equivalent KV; nothing asserted.
//   build/bench/kv_codec_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "engine/kv_transforms.h"
#include "engine/transform_codec.h"
#include "kernels/kv_layer.h"
#include "kv/kv_storage.h"

namespace kvs {
namespace {

constexpr int32_t kLayers = 16, kHeads = 8, kDim = 64;

// Vectors with variance 2^(-i/6) along random directions: a spectrum like trained keys'; or
// (flat) of equal variance, like a random-weight model's, where every component gets bits and
// decoding does the most multiply-adds.
std::shared_ptr<const KvTransforms> MakeSyntheticFit(bool flat) {
  {
    std::mt19937 rng(7);
    std::normal_distribution<float> g(0.0f, 1.0f);
    auto t = std::make_shared<KvTransforms>();
    t->n_layer = kLayers;
    t->n_head_kv = kHeads;
    t->head_dim_k = t->head_dim_v = kDim;
    constexpr int32_t n = 512;
    std::vector<float> x(static_cast<size_t>(n) * kDim);
    for (int32_t h = 0; h < kLayers * kHeads; ++h) {
      for (auto* heads : {&t->keys, &t->values}) {
        for (int32_t j = 0; j < n; ++j) {
          for (int32_t d = 0; d < kDim; ++d)
            x[j * kDim + d] = g(rng) * (flat ? 1.0f : std::exp2(-d / 12.0f));
        }
        heads->push_back(FitHeadTransform(x.data(), n, kDim, kDim));
      }
    }
    t->digest = {1, 2};
    return t;
  }
}
std::shared_ptr<const KvTransforms> SyntheticFit(bool flat) {
  static const std::shared_ptr<const KvTransforms> fits[2] = {MakeSyntheticFit(false),
                                                              MakeSyntheticFit(true)};
  return fits[flat ? 1 : 0];
}

void BM_TransformCodec(benchmark::State& state) {
  const double bits = static_cast<double>(state.range(0));
  const KvType type = state.range(1) == 0 ? KvType::kF16 : KvType::kQ8_0;
  const int32_t threads = static_cast<int32_t>(state.range(2));
  const bool decode = state.range(3) == 1;
  const bool flat = state.range(4) == 1;
  KvGeometry g{kLayers, kHeads, kDim, kDim, 16, type, type};
  KvRope rope;
  rope.n_rot = kDim;
  KvFormatPtr format = PlainKvFormat(g, rope);
  TransformCodecOptions o;
  o.bits = bits;
  o.decode_threads = threads;
  auto codec = TransformCodec::Make(format, SyntheticFit(flat), o);
  // A block of the pool's type holding random vectors.
  KvStorage storage(format, 2);
  std::mt19937 rng(3);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> k(kHeads * kDim), v(kHeads * kDim);
  for (int32_t l = 0; l < kLayers; ++l) {
    for (int32_t j = 0; j < 16; ++j) {
      for (float& f : k) f = gauss(rng);
      for (float& f : v) f = gauss(rng);
      WriteKv(storage.layers()[l], 16 + j, 100 + j, k.data(), v.data());
    }
  }
  std::vector<uint8_t> block, out;
  (void)storage.ReadBlock(1, &block);
  auto payload = (*codec)->Encode(block, 96);
  for (auto _ : state) {
    if (decode) {
      benchmark::DoNotOptimize((*codec)->Decode(*payload, &out).ok());
    } else {
      benchmark::DoNotOptimize((*codec)->Encode(block, 96).ok());
    }
  }
  const double f16_bytes = 2.0 * kLayers * kHeads * 2 * kDim * 16;
  state.counters["f16_MB/s"] =
      benchmark::Counter(f16_bytes * state.iterations() / 1e6, benchmark::Counter::kIsRate);
  state.SetLabel(StrFormat("tc:%g %s %s %d thread(s)%s", bits,
                           type == KvType::kF16 ? "f16" : "q8_0", decode ? "decode" : "encode",
                           threads, flat ? ", flat spectrum" : ""));
}
BENCHMARK(BM_TransformCodec)
    ->ArgsProduct({{1, 2, 4}, {0, 1}, {1, 2}, {0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace kvs

BENCHMARK_MAIN();
