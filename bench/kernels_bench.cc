// Kernel microbenchmarks (Google Benchmark): matrix products of the shapes llama-1b multiplies,
// per weight type, for one token (decode) and a 512-token prefill, in the layout the model
// loader gives each type. Prints GFLOP/s (and GB/s of weights for decode); nothing is asserted.
//   build/bench/kernels_bench --benchmark_filter=MatMul --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/aligned.h"
#include "core/page_memory.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/kv_quant.h"
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
  for (DType t :
       {DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    // One thread on an L3-resident matrix (13.8 MiB at Q6_K): the kernel's own speed, apart
    // from memory; then two threads as decode and prefill run.
    b->Args({static_cast<int64_t>(t), 1, 1});
    for (int64_t tokens : {1, 64, 512}) b->Args({static_cast<int64_t>(t), tokens, 2});
  }
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_MatMul)->Apply(Args);

// The same products as a forward pass meets them: 16 distinct matrices (128-144 MiB of weights,
// four times the L3), run one after another, so every weight comes from memory as in a batched
// decode step. args {type, tokens}.
void BM_MatMulStream(benchmark::State& state) {
  const auto type = static_cast<DType>(state.range(0));
  const int64_t tokens = state.range(1), rows = 8192, cols = 2048;
  constexpr int kMatrices = 16;
  std::vector<Fixture> f;
  for (int i = 0; i < kMatrices; ++i) f.push_back(Make(type, rows, cols, tokens));
  ThreadPool pool(2);
  for (auto _ : state) {
    for (Fixture& m : f) {
      MatMul(m.w, m.x.data(), tokens, m.out.data(), pool);
      benchmark::DoNotOptimize(m.out.data());
    }
  }
  state.SetLabel(std::string(DTypeName(type)));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * rows * cols * tokens * kMatrices * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
}
BENCHMARK(BM_MatMulStream)
    ->ArgsProduct({{static_cast<int64_t>(DType::kQ4_0), static_cast<int64_t>(DType::kQ8_0)},
                   {16, 64}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One decode step's attention over a deep context in llama-1b's geometry (8 KV heads of 64,
// 4 query heads each), KV in layer after layer of blocks as KvStorage lays them out (huge pages,
// a block's heads side by side), so the keys come from memory, not cache: args {type, context,
// tokens per sequence, split}. One token is decode (4 queries per KV head); 5 is the
// verification of 4 drafts (20 queries per KV head). split 0: a job per KV head (Attend); 1: a
// job per key partition, all heads walked together (AttendPartition, then MergePartitions), as
// the forward pass runs a long sequence's decode.
void BM_Attend(benchmark::State& state) {
  const auto type = static_cast<KvType>(state.range(0));
  const int32_t n_ctx = static_cast<int32_t>(state.range(1));
  const int32_t n_tokens = static_cast<int32_t>(state.range(2));
  const bool split = state.range(3) != 0;
  constexpr int32_t kHeads = 8, kGroup = 4, kDim = 64, kLayers = 16;
  const int32_t n_blocks = n_ctx / kKvBlockTokens;
  const size_t head_bytes = KvHeadBlockBytes(type, kDim);
  const size_t layer_bytes = 2 * head_bytes * kHeads * n_blocks;
  // With 4 KiB pages every block of a head (n_head_kv head blocks apart) would be a TLB miss.
  Expected<PageMemory> memory = AllocatePages(layer_bytes * kLayers, PageSize::kHuge);
  if (!memory.ok()) {
    state.SkipWithError(memory.error().c_str());
    return;
  }
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> row(kDim);
  for (int32_t l = 0; l < kLayers; ++l) {
    uint8_t* base = memory->data() + l * layer_bytes;
    for (int32_t b = 0; b < n_blocks * kHeads; ++b) {
      for (int32_t p = 0; p < kKvBlockTokens; ++p) {
        for (float& x : row) x = dist(rng);
        StoreKey(type, base + b * head_bytes, kDim, p, row.data());
        StoreValue(type, base + (n_blocks * kHeads + b) * head_bytes, kDim, p, row.data());
      }
    }
  }
  std::vector<int32_t> ids(n_blocks);
  for (int32_t b = 0; b < n_blocks; ++b) ids[b] = b;
  const int32_t n_q = n_tokens * kGroup;
  std::vector<float> q(static_cast<size_t>(kHeads) * n_q * kDim), out(q.size());
  for (float& x : q) x = dist(rng);
  ThreadPool pool(2);
  const AttentionShape shape{kDim, kDim, 0.125f};
  const int32_t n_parts = KeyPartitions(n_ctx);
  const size_t stride = AttentionPartialStride(shape), rows = static_cast<size_t>(kHeads) * n_q;
  std::vector<float> part_o(n_parts * rows * stride), part_m(n_parts * rows),
      part_l(n_parts * rows);
  std::vector<int32_t> n_keys_all(n_q);
  for (int32_t i = 0; i < n_q; ++i) n_keys_all[i] = n_ctx - n_tokens + 1 + i / kGroup;
  std::vector<const float*> q_all(rows);
  for (size_t r = 0; r < rows; ++r) q_all[r] = q.data() + r * kDim;
  int32_t layer = 0;
  for (auto _ : state) {
    const uint8_t* base = memory->data() + layer * layer_bytes;
    if (split) {
      std::vector<KvHeadView> views(kHeads);
      for (int32_t g = 0; g < kHeads; ++g) {
        KvHeadView& kv = views[g];
        kv.k_base = base + g * head_bytes;
        kv.v_base = base + (static_cast<size_t>(n_blocks) * kHeads + g) * head_bytes;
        kv.k_block_stride = kv.v_block_stride = kHeads * head_bytes;
        kv.block_ids = ids.data();
        kv.k_type = kv.v_type = type;
      }
      pool.ParallelFor(n_parts, 1, [&](int, size_t begin, size_t end) {
        for (size_t p = begin; p < end; ++p) {
          AttendPartition(shape, views.data(), kHeads, q_all.data(), n_keys_all.data(), n_q,
                          static_cast<int32_t>(p),
                          {part_o.data() + p * rows * stride, part_m.data() + p * rows,
                           part_l.data() + p * rows});
        }
      });
      for (size_t r = 0; r < rows; ++r) {
        MergePartitions(shape, type, KeyPartitions(n_keys_all[r % n_q]), part_o.data() + r * stride,
                        rows * stride, part_m.data() + r, part_l.data() + r, rows,
                        out.data() + r * kDim);
      }
      benchmark::DoNotOptimize(out.data());
      layer = (layer + 1) % kLayers;
      continue;
    }
    pool.ParallelFor(kHeads, 1, [&](int, size_t begin, size_t end) {
      for (size_t g = begin; g < end; ++g) {
        KvHeadView kv;
        kv.k_base = base + g * head_bytes;
        kv.v_base = base + (static_cast<size_t>(n_blocks) * kHeads + g) * head_bytes;
        kv.k_block_stride = kv.v_block_stride = kHeads * head_bytes;
        kv.block_ids = ids.data();
        kv.k_type = kv.v_type = type;
        const float* qp[64];
        float* op[64];
        int32_t n_keys[64];
        for (int32_t i = 0; i < n_q; ++i) {
          qp[i] = q.data() + (g * n_q + i) * kDim;
          op[i] = out.data() + (g * n_q + i) * kDim;
          n_keys[i] = n_ctx - n_tokens + 1 + i / kGroup;
        }
        Attend(shape, kv, qp, n_keys, n_q, op);
      }
    });
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
  }
  state.SetLabel(std::string(KvTypeName(type)) + (split ? " split-K" : " per head"));
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(layer_bytes) * state.iterations(),
                         benchmark::Counter::kIsRate, benchmark::Counter::OneK::kIs1000);
}

void AttendArgs(benchmark::internal::Benchmark* b) {
  for (KvType t : {KvType::kF16, KvType::kQ8_0, KvType::kQ4_0}) {
    for (int64_t tokens : {1, 5}) {
      for (int64_t split : {0, 1}) b->Args({static_cast<int64_t>(t), 16384, tokens, split});
    }
    // 16 layers of 1,024 keys (32 MiB in f16): from L3 rather than memory, what the kernel
    // computes per byte when memory is not what it waits on.
    b->Args({static_cast<int64_t>(t), 1024, 1, 0});
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_Attend)->Apply(AttendArgs);

}  // namespace
}  // namespace kvs

BENCHMARK_MAIN();
