#include "model/forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "kernels/repack.h"
#include "tensor/quantize.h"

namespace kvs {

ForwardPass::ForwardPass(const Model& model, ThreadPool& pool)
    : model_(model), c_(model.config()), pool_(pool) {
  for (const RopeSpec& r : c_.ropes) rope_stride_ = std::max(rope_stride_, r.n_rot);
}

void ForwardPass::Reserve(int32_t n) {
  if (n <= reserved_tokens_) return;
  const size_t N = n;
  x_.Resize(N * c_.n_embd);
  xn_.Resize(N * c_.n_embd);
  q_.Resize(N * c_.q_dim());
  k_.Resize(N * c_.k_dim());
  v_.Resize(N * c_.v_dim());
  att_.Resize(N * c_.n_head * c_.head_dim_v);
  gate_.Resize(N * c_.n_ff);
  up_.Resize(N * c_.n_ff);
  proj_.Resize(N * c_.n_embd);
  rope_.Resize(c_.ropes.size() * N * rope_stride_);
  reserved_tokens_ = n;
}

Status ForwardPass::Validate(const RaggedBatch& b, std::span<const KvLayerView> kv) const {
  const int32_t n = b.n_tokens();
  if (n <= 0) return Status::Error("forward pass needs at least one token");
  // One table per KV group, or one that every group reads (a sequence that never frees blocks
  // before a window: perplexity, calibrations, drafters).
  if (b.positions.size() != b.tokens.size() ||
      (b.slots.size() != 1 && b.slots.size() != c_.kv_groups.size())) {
    return Status::Error("batch: tokens and positions differ in length, or slots in groups");
  }
  for (const std::vector<int64_t>& slots : b.slots) {
    if (slots.size() != b.tokens.size()) {
      return Status::Error("batch: tokens and slots differ in length");
    }
  }
  if (static_cast<int32_t>(kv.size()) != c_.n_layer) {
    return Status::Error("batch: the KV cache has a different number of layers than the model");
  }
  for (int32_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= c_.n_vocab) {
      return Status::Error(
          StrFormat("token id %d is outside the vocabulary (0..%d)", b.tokens[i], c_.n_vocab - 1));
    }
  }
  int32_t next = 0;
  for (const BatchSequence& s : b.sequences) {
    const int64_t end = static_cast<int64_t>(s.n_cached) + s.n_tokens;
    if (s.first_token != next || s.n_tokens <= 0 || s.n_cached < 0 ||
        s.kv_blocks.size() != b.slots.size()) {
      return Status::Error("batch: a sequence's token range or block lists are inconsistent");
    }
    for (const std::vector<int32_t>& blocks : s.kv_blocks) {
      if (end > static_cast<int64_t>(blocks.size()) * kKvBlockTokens) {
        return Status::Error("batch: a sequence's block list does not cover its tokens");
      }
    }
    next += s.n_tokens;
  }
  if (next != n) return Status::Error("batch: sequences do not cover the tokens exactly");
  const bool rope_keys = kv[0].NeedsRopeTable();
  for (const BatchSequence& s : b.sequences) {
    const int32_t n_keys = s.n_cached + s.n_tokens;
    if (!s.key_positions.empty()) {
      if (static_cast<int32_t>(s.key_positions.size()) != n_keys) {
        return Status::Error("batch: a sequence's key positions do not cover its keys");
      }
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        if (s.key_positions[s.n_cached + i] != b.positions[s.first_token + i]) {
          return Status::Error("batch: a token's position differs from its key's position");
        }
      }
    } else if (rope_keys) {
      // Keys whose coding depends on RoPE are found by slot: slot i must be position i.
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        if (b.positions[s.first_token + i] != s.n_cached + i) {
          return Status::Error("batch: positions differ from slots but no key positions given");
        }
      }
    }
  }
  for (int32_t p : b.positions) {
    if (p < 0) return Status::Error("batch: negative position");
  }
  if (rope_keys && b.max_position >= kv[0].rope_positions) {
    return Status::Error(
        StrFormat("batch: position %d is past the KV storage's RoPE table (%d positions reserved)",
                  b.max_position, kv[0].rope_positions));
  }
  for (int32_t row : b.logit_rows) {
    if (row < 0 || row >= n) return Status::Error("batch: logit row out of range");
  }
  return Status::Ok();
}

Status ForwardPass::Run(const RaggedBatch& b, std::span<const KvLayerView> kv, float* logits) {
  KVS_RETURN_IF_ERROR(Validate(b, kv));
  const int32_t n = b.n_tokens();
  const int32_t n_out = static_cast<int32_t>(b.logit_rows.size());
  Reserve(std::max(n, n_out));
  Layers(b, kv);
  if (n_out == 0) return Status::Ok();
  const ModelWeights& w = model_.weights();
  // xn_ row j is the normalized residual of logit row j (rows may repeat or come in any order).
  for (int32_t j = 0; j < n_out; ++j) {
    RmsNorm(x_.data() + static_cast<size_t>(b.logit_rows[j]) * c_.n_embd, w.output_norm.data(),
            c_.n_embd, c_.rms_eps, xn_.data() + static_cast<size_t>(j) * c_.n_embd);
  }
  MatMul(w.output, xn_.data(), n_out, logits, pool_);
  if (c_.final_logit_softcap > 0) {
    const float cap = c_.final_logit_softcap;
    const size_t n_logits = static_cast<size_t>(n_out) * c_.n_vocab;
    for (size_t i = 0; i < n_logits; ++i) logits[i] = cap * std::tanh(logits[i] / cap);
  }
  return Status::Ok();
}

template <typename Fn>
void ForwardPass::ForEachToken(int32_t n, const Fn& fn) {
  if (n == 1) {
    fn(0);
    return;
  }
  pool_.ParallelFor(static_cast<size_t>(n), 1, [&](int, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) fn(static_cast<int32_t>(i));
  });
}

void ForwardPass::Layers(const RaggedBatch& b, std::span<const KvLayerView> kv) {
  const ModelWeights& w = model_.weights();
  const int32_t n = b.n_tokens();
  for (int32_t i = 0; i < n; ++i) {
    float* xi = x_.data() + static_cast<size_t>(i) * c_.n_embd;
    ReadRow(w.token_embd, b.tokens[i], xi);
    if (c_.embedding_scale != 1.f) {
      for (int32_t d = 0; d < c_.n_embd; ++d) xi[d] *= c_.embedding_scale;
    }
  }
  // Each RoPE's angles once per token; a layer reads the table of its own.
  for (size_t r = 0; r < c_.ropes.size(); ++r) {
    const RopeParams rope = model_.Rope(static_cast<int32_t>(r));
    float* table = RopeTable(static_cast<int32_t>(r), 0);
    for (int32_t i = 0; i < n; ++i) {
      RopeAngles(b.positions[i], rope, table + static_cast<size_t>(i) * rope_stride_);
    }
  }
  // Runs of tokens that write into the same kernel block (of every group) go to one thread:
  // quantized codes of neighbouring positions share bytes.
  write_runs_.clear();
  for (int32_t i = 0; i < n; ++i) {
    bool starts = i == 0;
    for (const std::vector<int64_t>& slots : b.slots) {
      starts = starts || slots[i] / kKvBlockTokens != slots[i - 1] / kKvBlockTokens;
    }
    if (starts) write_runs_.push_back(i);
  }
  write_runs_.push_back(n);
  // Sequences whose keys sit at other positions than their slots: their keys' RoPE rows, in slot
  // order, for the key codings that depend on RoPE (KvHeadView::rope_table).
  key_rope_.assign(b.sequences.size(), {});
  if (kv[0].NeedsRopeTable()) {
    for (size_t si = 0; si < b.sequences.size(); ++si) {
      const std::vector<int32_t>& positions = b.sequences[si].key_positions;
      if (positions.empty()) continue;
      GatherKeyRope(kv[0], positions, &key_rope_[si]);
    }
  }
  // The attention jobs depend on the batch alone: planned once for every layer.
  PlanAttention(b, AttentionShape{c_.head_dim_k, c_.head_dim_v, c_.attention_scale()});
  for (int32_t l = 0; l < c_.n_layer; ++l) {
    AttentionSublayer(b, l, kv[l]);
    FeedForwardSublayer(b, l);
  }
}

void ForwardPass::NormRows(int32_t n, const float* in, const std::vector<float>& weight,
                           float* out) {
  const int32_t d = c_.n_embd;
  ForEachToken(n, [&](int32_t i) {
    const size_t at = static_cast<size_t>(i) * d;
    RmsNorm(in + at, weight.data(), d, c_.rms_eps, out + at);
  });
}

void ForwardPass::AddSublayerOutput(int32_t n, const LayerSpec& spec,
                                    const std::vector<float>& post_norm) {
  if (spec.norms == NormPlacement::kPreAndPost) NormRows(n, proj_.data(), post_norm, proj_.data());
  AddInPlace(x_.data(), proj_.data(), static_cast<int64_t>(n) * c_.n_embd);
}

void ForwardPass::AttentionSublayer(const RaggedBatch& b, int32_t l, const KvLayerView& kv) {
  const LayerSpec& spec = c_.layers[l];
  const LayerWeights& L = model_.weights().layers[l];
  const int32_t n = b.n_tokens();
  const int32_t n_rot = c_.ropes[spec.rope].n_rot;
  const bool neox = c_.ropes[spec.rope].neox;
  NormRows(n, x_.data(), L.attn_norm, xn_.data());
  const MatMulOutput qkv[] = {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}};
  MatMulSharedInput(qkv, xn_.data(), n, pool_);
  const float* rope_table = RopeTable(spec.rope, 0);
  ForEachToken(n, [&](int32_t i) {
    float* qi = q_.data() + static_cast<size_t>(i) * c_.q_dim();
    float* ki = k_.data() + static_cast<size_t>(i) * c_.k_dim();
    float* vi = v_.data() + static_cast<size_t>(i) * c_.v_dim();
    if (!L.bq.empty()) AddInPlace(qi, L.bq.data(), c_.q_dim());
    if (!L.bk.empty()) AddInPlace(ki, L.bk.data(), c_.k_dim());
    if (!L.bv.empty()) AddInPlace(vi, L.bv.data(), c_.v_dim());
    const float* cs = rope_table + static_cast<size_t>(i) * rope_stride_;
    for (int32_t h = 0; h < c_.n_head; ++h) {
      float* qh = qi + static_cast<size_t>(h) * c_.head_dim_k;
      if (spec.qk_norm) RmsNorm(qh, L.q_norm.data(), c_.head_dim_k, c_.rms_eps, qh);
      ApplyRope(qh, cs, n_rot, neox);
    }
    for (int32_t h = 0; h < c_.n_head_kv; ++h) {
      float* kh = ki + static_cast<size_t>(h) * c_.head_dim_k;
      if (spec.qk_norm) RmsNorm(kh, L.k_norm.data(), c_.head_dim_k, c_.rms_eps, kh);
      ApplyRope(kh, cs, n_rot, neox);
    }
  });
  if (query_tap_) query_tap_(l, b, q_.data());
  // The layer's KV group: its blocks, and for a sliding window the first key each query reads.
  const int32_t g = b.slots.size() == 1 ? 0 : spec.kv_group;
  WriteKv(b, kv, g);
  Attention(b, kv, g, c_.kv_groups[spec.kv_group]);
  AccumulateAttentionMass(b, kv, g);
  MatMul(L.wo, att_.data(), n, proj_.data(), pool_);
  AddSublayerOutput(n, spec, L.attn_post_norm);
}

void ForwardPass::FeedForwardSublayer(const RaggedBatch& b, int32_t l) {
  const LayerSpec& spec = c_.layers[l];
  const LayerWeights& L = model_.weights().layers[l];
  const int32_t n = b.n_tokens();
  NormRows(n, x_.data(), L.ffn_norm, xn_.data());
  const MatMulOutput gate_up[] = {{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}};
  MatMulSharedInput(gate_up, xn_.data(), n, pool_);
  const bool gelu = spec.feed_forward == FeedForwardKind::kGeGluTanh;
  ForEachToken(n, [&](int32_t i) {
    float* g = gate_.data() + static_cast<size_t>(i) * c_.n_ff;
    const float* u = up_.data() + static_cast<size_t>(i) * c_.n_ff;
    gelu ? GeGluTanh(g, u, g, c_.n_ff) : SwiGlu(g, u, g, c_.n_ff);
  });
  MatMul(L.w_down, gate_.data(), n, proj_.data(), pool_);
  AddSublayerOutput(n, spec, L.ffn_post_norm);
}

void ForwardPass::WriteKv(const RaggedBatch& b, const KvLayerView& kv, int32_t group) {
  const std::vector<int64_t>& slots = b.slots[group];
  const size_t n_runs = write_runs_.size() - 1;
  auto write_run = [&](size_t r) {
    for (int32_t i = write_runs_[r]; i < write_runs_[r + 1]; ++i) {
      kvs::WriteKv(kv, slots[i], b.positions[i], k_.data() + static_cast<size_t>(i) * c_.k_dim(),
                   v_.data() + static_cast<size_t>(i) * c_.v_dim());
    }
  };
  if (n_runs == 1) {
    write_run(0);
    return;
  }
  pool_.ParallelFor(n_runs, 1, [&](int, size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) write_run(r);
  });
}

void ForwardPass::Attention(const RaggedBatch& b, const KvLayerView& kv, int32_t kv_group,
                            const KvGroupSpec& window) {
  const int32_t group = c_.n_head / c_.n_head_kv;
  const AttentionShape shape{c_.head_dim_k, c_.head_dim_v, c_.attention_scale()};
  // A sequence's queries for one KV head are its group's heads for every token, token-major, so
  // that a kernel tile of four holds queries that see (nearly) the same keys. Chunks of them:
  //  - a decode-like chunk (at most kSplitQueries queries a head) runs a job per (key partition,
  //    group of KV heads) (attention.h), the group's heads walked side by side and the partials
  //    merged afterwards: a block's heads are adjacent, so the walk reads whole blocks as one
  //    stream, not one head's slice of each scattered block (a 64-sequence decode step ran ~3%
  //    faster so), and a long sequence's partitions (split-K) keep every thread reading;
  //  - any other runs per (KV head, chunk) in head-major order: a thread's contiguous share is
  //    whole heads, and a head's keys stay in cache across the chunks of one sequence.
  // Both compute each query the same way (attention.h): which path a query takes, and what else
  // is in the batch, does not change its output.
  const size_t n_chunks = chunks_.size();
  const size_t n_head_jobs = c_.n_head_kv * n_chunks;
  const size_t n_jobs = n_head_jobs + split_jobs_.size();
  const int32_t heads_per_job = heads_per_job_;
  pool_.ParallelFor(n_jobs, 1, [&](int, size_t begin, size_t end) {
    for (size_t slot = begin; slot < end; ++slot) {
      const size_t job = job_order_.empty() ? slot : job_order_[slot];
      if (job >= n_head_jobs) {
        SplitJob(b, kv, kv_group, window, shape, split_jobs_[job - n_head_jobs], heads_per_job);
        continue;
      }
      const int32_t g = static_cast<int32_t>(job / n_chunks);
      const AttentionChunk& chunk = chunks_[job % n_chunks];
      const BatchSequence& seq = b.sequences[chunk.seq];
      const int32_t count = std::min(kQueriesPerJob, seq.n_tokens * group - chunk.first_query);
      const float* q[kQueriesPerJob];
      float* out[kQueriesPerJob];
      int32_t n_keys[kQueriesPerJob];
      int32_t first_key[kQueriesPerJob];
      for (int32_t k = 0; k < count; ++k) {
        const int32_t t = (chunk.first_query + k) / group;  // token within the sequence
        const size_t i = static_cast<size_t>(seq.first_token + t);
        const int32_t h = g * group + (chunk.first_query + k) % group;
        q[k] = QueryRow(i, h);
        out[k] = OutputRow(i, h);
        n_keys[k] = seq.n_cached + t + 1;                  // causal: itself and everything before
        first_key[k] = window.FirstKey(seq.n_cached + t);  // slots are positions here
      }
      const std::vector<float>& key_rope = key_rope_[chunk.seq];
      Attend(
          shape,
          kv.Head(g, seq.kv_blocks[kv_group].data(), key_rope.empty() ? nullptr : key_rope.data()),
          q, n_keys, count, out, window.sliding() ? first_key : nullptr);
    }
  });
  MergeSplitPartials(b, kv, shape);
}

void ForwardPass::PlanAttention(const RaggedBatch& b, const AttentionShape& shape) {
  const int32_t group = c_.n_head / c_.n_head_kv;
  chunks_.clear();
  split_chunks_.clear();
  split_jobs_.clear();
  size_t partial_rows = 0;
  for (int32_t s = 0; s < static_cast<int32_t>(b.sequences.size()); ++s) {
    const BatchSequence& seq = b.sequences[s];
    const int32_t n_queries = seq.n_tokens * group;
    const int32_t parts = KeyPartitions(seq.n_cached + seq.n_tokens);
    if (n_queries <= kSplitQueries) {
      split_chunks_.push_back({s, parts, partial_rows});
      partial_rows += static_cast<size_t>(parts) * c_.n_head_kv * n_queries;
      continue;
    }
    for (int32_t first = 0; first < n_queries; first += kQueriesPerJob) {
      chunks_.push_back({s, first});
    }
  }
  // Split jobs: all heads together, unless too few partitions to keep every thread busy.
  size_t split_parts = 0;
  for (const SplitChunk& sc : split_chunks_) split_parts += sc.parts;
  int32_t head_groups = 1;
  while (head_groups < c_.n_head_kv &&
         split_parts * head_groups < 2 * static_cast<size_t>(pool_.size())) {
    do ++head_groups;
    while (c_.n_head_kv % head_groups != 0);
  }
  const int32_t heads_per_job = c_.n_head_kv / head_groups;
  heads_per_job_ = heads_per_job;
  for (int32_t c = 0; c < static_cast<int32_t>(split_chunks_.size()); ++c) {
    for (int32_t p = 0; p < split_chunks_[c].parts; ++p) {
      for (int32_t hg = 0; hg < head_groups; ++hg)
        split_jobs_.push_back({c, p, hg * heads_per_job});
    }
  }
  const size_t stride = AttentionPartialStride(shape);
  if (partial_rows > 0) {
    partial_o_.Resize(partial_rows * stride);
    partial_ml_.resize(2 * partial_rows);
  }
  partial_rows_ = partial_rows;
  const size_t n_chunks = chunks_.size();
  const size_t n_head_jobs = c_.n_head_kv * n_chunks;
  // The pool hands each thread a contiguous range of equally many jobs: spread the (heavy) split
  // jobs evenly through the list, or a long sequence's work would all land on the last thread.
  job_order_.clear();
  const size_t n_jobs = n_head_jobs + split_jobs_.size();
  if (!split_jobs_.empty()) {
    size_t head_job = 0;
    for (size_t k = 0; k < split_jobs_.size(); ++k) {
      const size_t at = (k * n_jobs) / split_jobs_.size();  // where split job k goes
      while (job_order_.size() < at) job_order_.push_back(head_job++);
      job_order_.push_back(n_head_jobs + k);
    }
    while (head_job < n_head_jobs) job_order_.push_back(head_job++);
  }
}

void ForwardPass::MergeSplitPartials(const RaggedBatch& b, const KvLayerView& kv,
                                     const AttentionShape& shape) {
  if (split_chunks_.empty()) return;
  const int32_t group = c_.n_head / c_.n_head_kv;
  const size_t stride = AttentionPartialStride(shape);
  const size_t partial_rows = partial_rows_;
  // Each split query's partials merged in partition order: a job per (chunk, KV head).
  const size_t merge_jobs = split_chunks_.size() * c_.n_head_kv;
  pool_.ParallelFor(merge_jobs, 1, [&](int, size_t begin, size_t end) {
    for (size_t job = begin; job < end; ++job) {
      const SplitChunk& sc = split_chunks_[job / c_.n_head_kv];
      const int32_t g = static_cast<int32_t>(job % c_.n_head_kv);
      const BatchSequence& seq = b.sequences[sc.seq];
      const int32_t n = seq.n_tokens * group;
      const size_t part_rows = static_cast<size_t>(c_.n_head_kv) * n;
      for (int32_t k = 0; k < n; ++k) {
        const int32_t t = k / group;
        const size_t i = static_cast<size_t>(seq.first_token + t);
        const int32_t h = g * group + k % group;
        const size_t row = sc.first_row + static_cast<size_t>(g) * n + k;
        MergePartitions(shape, kv.v_type, KeyPartitions(seq.n_cached + t + 1),
                        partial_o_.data() + row * stride, part_rows * stride,
                        partial_ml_.data() + row, partial_ml_.data() + partial_rows + row,
                        part_rows, OutputRow(i, h));
      }
    }
  });
}

void ForwardPass::SplitJob(const RaggedBatch& b, const KvLayerView& kv, int32_t kv_group,
                           const KvGroupSpec& window, const AttentionShape& shape,
                           const SplitJobSpec& job, int32_t n_heads) {
  const int32_t group = c_.n_head / c_.n_head_kv;
  const SplitChunk& sc = split_chunks_[job.chunk];
  const BatchSequence& seq = b.sequences[sc.seq];
  const int32_t n = seq.n_tokens * group;  // <= kSplitQueries
  const size_t part_rows = static_cast<size_t>(c_.n_head_kv) * n;
  const std::vector<float>& key_rope = key_rope_[sc.seq];
  KvHeadView views[kMaxSplitHeads];
  const float* q[kMaxSplitHeads * kSplitQueries];
  int32_t n_keys[kSplitQueries];
  int32_t first_key[kSplitQueries];
  for (int32_t k = 0; k < n; ++k) {
    n_keys[k] = seq.n_cached + k / group + 1;
    first_key[k] = window.FirstKey(seq.n_cached + k / group);
  }
  const size_t stride = AttentionPartialStride(shape);
  // Up to kMaxSplitHeads heads per call; rows of head g at (g * n + k) within the partition.
  for (int32_t g0 = job.first_head; g0 < job.first_head + n_heads; g0 += kMaxSplitHeads) {
    const int32_t hn = std::min(kMaxSplitHeads, job.first_head + n_heads - g0);
    for (int32_t h = 0; h < hn; ++h) {
      const int32_t g = g0 + h;
      views[h] =
          kv.Head(g, seq.kv_blocks[kv_group].data(), key_rope.empty() ? nullptr : key_rope.data());
      for (int32_t k = 0; k < n; ++k) {
        const size_t i = static_cast<size_t>(seq.first_token + k / group);
        q[h * n + k] = QueryRow(i, g * group + k % group);
      }
    }
    const size_t row = sc.first_row + job.part * part_rows + static_cast<size_t>(g0) * n;
    const size_t total_rows = partial_ml_.size() / 2;
    AttendPartition(shape, views, hn, q, n_keys, n, job.part,
                    {partial_o_.data() + row * stride, partial_ml_.data() + row,
                     partial_ml_.data() + total_rows + row},
                    window.sliding() ? first_key : nullptr);
  }
}

void ForwardPass::AccumulateAttentionMass(const RaggedBatch& b, const KvLayerView& kv,
                                          int32_t kv_group) {
  const int32_t group = c_.n_head / c_.n_head_kv;
  const AttentionShape shape{c_.head_dim_k, c_.head_dim_v, c_.attention_scale()};
  for (size_t si = 0; si < b.sequences.size(); ++si) {
    const BatchSequence& seq = b.sequences[si];
    if (seq.attention_mass == nullptr || seq.mass_first_token >= seq.n_tokens) continue;
    const int32_t n_keys_all = seq.n_cached + seq.n_tokens;
    const size_t stride = static_cast<size_t>(n_keys_all);
    mass_scratch_.assign(stride * c_.n_head_kv, 0.0f);
    const std::vector<float>& key_rope = key_rope_[si];
    // One job per KV head (its own scratch row): the heads' sums are added in a fixed order
    // afterwards, so the mass does not depend on the thread count.
    pool_.ParallelFor(c_.n_head_kv, 1, [&](int, size_t begin, size_t end) {
      std::vector<const float*> q;
      std::vector<int32_t> n_keys;
      for (size_t g = begin; g < end; ++g) {
        q.clear();
        n_keys.clear();
        for (int32_t t = std::max(0, seq.mass_first_token); t < seq.n_tokens; ++t) {
          const size_t i = static_cast<size_t>(seq.first_token + t);
          for (int32_t j = 0; j < group; ++j) {
            const size_t h = g * group + j;
            q.push_back(QueryRow(i, static_cast<int32_t>(h)));
            n_keys.push_back(seq.n_cached + t + 1);
          }
        }
        const KvHeadView view = kv.Head(static_cast<int32_t>(g), seq.kv_blocks[kv_group].data(),
                                        key_rope.empty() ? nullptr : key_rope.data());
        AttentionMass(shape, view, q.data(), n_keys.data(), static_cast<int>(q.size()),
                      mass_scratch_.data() + g * stride);
      }
    });
    for (int32_t g = 0; g < c_.n_head_kv; ++g) {
      const float* row = mass_scratch_.data() + static_cast<size_t>(g) * stride;
      for (int32_t j = 0; j < n_keys_all; ++j) seq.attention_mass[j] += row[j];
    }
  }
}

}  // namespace kvs
