// One forward pass over a ragged batch, each layer run as its LayerSpec (model/layer_spec.h)
// says: the tokens of many sequences go through every matmul together; attention runs per
// sequence over its blocks of the paged cache.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/aligned.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kernels/kv_layer.h"
#include "model/batch.h"
#include "model/weights.h"

namespace kvs {

class ForwardPass {
 public:
  // Attention queries per pool job (a multiple of the kernel's tile of four).
  static constexpr int32_t kQueriesPerJob = 32;
  // A sequence with at most this many queries per KV head (a decode or two) runs split-K once
  // its keys span two partitions (ForwardPass::Attention).
  static constexpr int32_t kSplitQueries = 8;
  // KV heads per AttendPartition call of a split job.
  static constexpr int32_t kMaxSplitHeads = 16;

  ForwardPass(const Model& model, ThreadPool& pool);

  // Runs the batch, writing each token's K/V into its slot of `kv` (one view per layer), and
  // writes logits[logit_rows.size()][n_vocab]. Scratch memory grows to the largest batch seen.
  Status Run(const RaggedBatch& batch, std::span<const KvLayerView> kv, float* logits);

  // Called once per layer with the batch's queries q[n_tokens][n_head][head_dim_k], after RoPE
  // (turned by batch.positions): what a calibration that needs query statistics reads (the
  // tri eviction policy). Null: no call.
  using QueryTap = std::function<void(int32_t layer, const RaggedBatch& batch, const float* q)>;
  void set_query_tap(QueryTap tap) { query_tap_ = std::move(tap); }

 private:
  Status Validate(const RaggedBatch& batch, std::span<const KvLayerView> kv) const;
  void Layers(const RaggedBatch& batch, std::span<const KvLayerView> kv);
  // One layer's two halves, each as its LayerSpec says: x_ += attention(norm(x_)), then
  // x_ += feed_forward(norm(x_)).
  void AttentionSublayer(const RaggedBatch& batch, int32_t layer, const KvLayerView& kv);
  void FeedForwardSublayer(const RaggedBatch& batch, int32_t layer);
  // out = RmsNorm(in) row by row ([n][n_embd]; in place where out is in), for the batch's n tokens.
  void NormRows(int32_t n, const float* in, const std::vector<float>& weight, float* out);
  // x_ += a sublayer's output proj_, normalized first where the layer has post-norms.
  void AddSublayerOutput(int32_t n, const LayerSpec& spec, const std::vector<float>& post_norm);
  // RoPE r's cos/sin row of token i (rope_).
  float* RopeTable(int32_t r, size_t i) {
    return rope_.data() + (static_cast<size_t>(r) * reserved_tokens_ + i) * rope_stride_;
  }
  // Stores the ubatch's K/V (k_, v_) into its slots of one layer.
  // Of the layer's KV group kv_group (its blocks in the batch), with that group's window.
  void WriteKv(const RaggedBatch& batch, const KvLayerView& kv, int32_t kv_group);
  void Attention(const RaggedBatch& batch, const KvLayerView& kv, int32_t kv_group,
                 const KvGroupSpec& window);
  // The batch's attention jobs (chunks_, split_chunks_, split_jobs_, job_order_), the same for
  // every layer (Layers plans them once), and the partial rows the split jobs fill.
  void PlanAttention(const RaggedBatch& batch, const AttentionShape& shape);
  // Each split query's partials merged into its output, in partition order.
  void MergeSplitPartials(const RaggedBatch& batch, const KvLayerView& kv,
                          const AttentionShape& shape);
  struct SplitJobSpec;
  // One split-K job: partition job.part of a sequence's keys for n_heads KV heads from
  // job.first_head, into the partials.
  void SplitJob(const RaggedBatch& batch, const KvLayerView& kv, int32_t kv_group,
                const KvGroupSpec& window, const AttentionShape& shape, const SplitJobSpec& job,
                int32_t n_heads);
  // Adds the attention the observed queries of each sequence that asks for it
  // (BatchSequence::attention_mass) gave its keys, summed over heads, for one layer.
  void AccumulateAttentionMass(const RaggedBatch& batch, const KvLayerView& kv, int32_t kv_group);
  void Reserve(int32_t n);
  // Query head h of the ubatch's token i (q_), and where its attention output goes (att_).
  float* QueryRow(size_t i, int32_t h) {
    return q_.data() + i * c_.q_dim() + static_cast<size_t>(h) * c_.head_dim_k;
  }
  float* OutputRow(size_t i, int32_t h) {
    return att_.data() + (i * c_.n_head + static_cast<size_t>(h)) * c_.head_dim_v;
  }
  // Runs fn(i) for every token of the ubatch, split over the pool when there are several.
  template <typename Fn>
  void ForEachToken(int32_t n, const Fn& fn);

  const Model& model_;
  const ModelConfig& c_;
  ThreadPool& pool_;
  int32_t reserved_tokens_ = 0;
  // Attention jobs of the current batch: (sequence, first query) per chunk of kQueriesPerJob.
  struct AttentionChunk {
    int32_t seq;
    int32_t first_query;
  };
  std::vector<AttentionChunk> chunks_;
  // Split-K sequences of the current batch: their partition count and first partial row (rows
  // [part][n_head_kv][queries per head] from there), and the jobs over them.
  struct SplitChunk {
    int32_t seq;
    int32_t parts;
    size_t first_row;
  };
  struct SplitJobSpec {
    int32_t chunk;  // index into split_chunks_
    int32_t part;
    int32_t first_head;
  };
  std::vector<SplitChunk> split_chunks_;
  std::vector<SplitJobSpec> split_jobs_;
  std::vector<size_t> job_order_;  // attention jobs in pool order (split jobs spread out)
  size_t partial_rows_ = 0;        // PlanAttention's: rows of partial_o_ in use
  int32_t heads_per_job_ = 1;      // PlanAttention's: KV heads per split job
  AlignedBuffer partial_o_;        // [rows][AttentionPartialStride] partial outputs
  std::vector<float> partial_ml_;  // [rows] maxima, then [rows] sums
  // Token ranges [write_runs_[r], write_runs_[r + 1]) whose slots share a kernel block.
  std::vector<int32_t> write_runs_;
  AlignedBuffer x_;          // [n][n_embd] residual stream
  AlignedBuffer xn_;         // [n][n_embd] normalized input of a sublayer
  AlignedBuffer q_;          // [n][n_head * head_dim_k]
  AlignedBuffer k_;          // [n][n_head_kv * head_dim_k]
  AlignedBuffer v_;          // [n][n_head_kv * head_dim_v]
  AlignedBuffer att_;        // [n][n_head * head_dim_v]
  AlignedBuffer gate_;       // [n][n_ff]
  AlignedBuffer up_;         // [n][n_ff]
  AlignedBuffer proj_;       // [n][max(n_embd, ...)] output of wo / w_down
  AlignedBuffer rope_;       // [n_ropes][reserved_tokens_][rope_stride_] cos/sin per RoPE and token
  int32_t rope_stride_ = 0;  // the largest n_rot of the model's RoPEs
  // Per sequence of the batch: its keys' RoPE rows in slot order, where its key positions are
  // not its slots (BatchSequence::key_positions) and the key coding depends on RoPE; else empty.
  std::vector<std::vector<float>> key_rope_;
  std::vector<float> mass_scratch_;  // [n_head_kv][keys] per-head partial attention mass
  QueryTap query_tap_;
};

}  // namespace kvs
