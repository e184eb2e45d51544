#include "model/forward.h"

#include <algorithm>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/ops.h"
#include "kernels/repack.h"
#include "tensor/quantize.h"

namespace kvs {

ForwardPass::ForwardPass(const Model& model, ThreadPool& pool)
    : model_(model), c_(model.config()), pool_(pool) {}

void ForwardPass::Reserve(int32_t n, int32_t n_ctx) {
  if (n <= reserved_tokens_ && n_ctx <= reserved_ctx_) return;
  n = std::max(n, reserved_tokens_);
  n_ctx = std::max(n_ctx, reserved_ctx_);
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
  rope_.Resize(N * c_.n_rot);
  reserved_tokens_ = n;
  reserved_ctx_ = n_ctx;
}

Status ForwardPass::Run(const int32_t* tokens, int32_t n, int32_t pos0, SimpleKvCache& cache,
                        int32_t n_out, float* logits) {
  if (n <= 0) return Status::Error("forward pass needs at least one token");
  if (n_out < 0 || n_out > n) return Status::Error("n_out out of range");
  if (pos0 < 0 || static_cast<int64_t>(pos0) + n > cache.n_ctx()) {
    return Status::Error(StrFormat("context full: positions %d..%d exceed the context size %d",
                                   pos0, pos0 + n - 1, cache.n_ctx()));
  }
  for (int32_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= c_.n_vocab) {
      return Status::Error(
          StrFormat("token id %d is outside the vocabulary (0..%d)", tokens[i], c_.n_vocab - 1));
    }
  }
  const ModelWeights& w = model_.weights();
  for (int32_t start = 0; start < n; start += kMaxUbatch) {
    const int32_t len = std::min(kMaxUbatch, n - start);
    Reserve(len, cache.n_ctx());
    RunUbatch(tokens + start, len, pos0 + start, cache);
    // Logits for the rows of this ubatch that fall in the last n_out tokens.
    const int32_t first_out = n - n_out;
    const int32_t lo = std::max(first_out, start), hi = start + len;
    if (lo >= hi) continue;
    for (int32_t i = lo; i < hi; ++i) {
      const float* xi = x_.data() + static_cast<size_t>(i - start) * c_.n_embd;
      RmsNorm(xi, w.output_norm.data(), c_.n_embd, c_.rms_eps,
              xn_.data() + static_cast<size_t>(i - lo) * c_.n_embd);
    }
    MatMul(w.output, xn_.data(), hi - lo, logits + static_cast<size_t>(lo - first_out) * c_.n_vocab,
           pool_);
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

void ForwardPass::RunUbatch(const int32_t* tokens, int32_t n, int32_t pos0, SimpleKvCache& cache) {
  const ModelWeights& w = model_.weights();
  const int32_t d = c_.n_embd;
  float* x = x_.data();
  float* xn = xn_.data();

  for (int32_t i = 0; i < n; ++i) {
    ReadRow(w.token_embd, tokens[i], x + static_cast<size_t>(i) * d);
  }
  RopeParams rope{c_.n_rot, c_.rope_freq_base, c_.rope_freq_scale, c_.rope_neox,
                  w.rope_freqs.empty() ? nullptr : w.rope_freqs.data()};
  for (int32_t i = 0; i < n; ++i)
    RopeAngles(pos0 + i, rope, rope_.data() + static_cast<size_t>(i) * c_.n_rot);

  for (int32_t l = 0; l < c_.n_layer; ++l) {
    const LayerWeights& L = w.layers[l];
    ForEachToken(n, [&](int32_t i) {
      RmsNorm(x + static_cast<size_t>(i) * d, L.attn_norm.data(), d, c_.rms_eps,
              xn + static_cast<size_t>(i) * d);
    });
    MatMul(L.wq, xn, n, q_.data(), pool_);
    MatMul(L.wk, xn, n, k_.data(), pool_);
    MatMul(L.wv, xn, n, v_.data(), pool_);
    ForEachToken(n, [&](int32_t i) {
      float* qi = q_.data() + static_cast<size_t>(i) * c_.q_dim();
      float* ki = k_.data() + static_cast<size_t>(i) * c_.k_dim();
      float* vi = v_.data() + static_cast<size_t>(i) * c_.v_dim();
      if (!L.bq.empty()) AddInPlace(qi, L.bq.data(), c_.q_dim());
      if (!L.bk.empty()) AddInPlace(ki, L.bk.data(), c_.k_dim());
      if (!L.bv.empty()) AddInPlace(vi, L.bv.data(), c_.v_dim());
      const float* cs = rope_.data() + static_cast<size_t>(i) * c_.n_rot;
      for (int32_t h = 0; h < c_.n_head; ++h) {
        float* qh = qi + static_cast<size_t>(h) * c_.head_dim_k;
        if (!L.q_norm.empty()) RmsNorm(qh, L.q_norm.data(), c_.head_dim_k, c_.rms_eps, qh);
        ApplyRope(qh, cs, c_.n_rot, c_.rope_neox);
      }
      for (int32_t h = 0; h < c_.n_head_kv; ++h) {
        float* kh = ki + static_cast<size_t>(h) * c_.head_dim_k;
        if (!L.k_norm.empty()) RmsNorm(kh, L.k_norm.data(), c_.head_dim_k, c_.rms_eps, kh);
        ApplyRope(kh, cs, c_.n_rot, c_.rope_neox);
      }
      cache.Write(l, pos0 + i, ki, vi);
    });
    Attention(l, n, pos0, cache);
    MatMul(L.wo, att_.data(), n, proj_.data(), pool_);
    AddInPlace(x, proj_.data(), static_cast<int64_t>(n) * d);

    ForEachToken(n, [&](int32_t i) {
      RmsNorm(x + static_cast<size_t>(i) * d, L.ffn_norm.data(), d, c_.rms_eps,
              xn + static_cast<size_t>(i) * d);
    });
    MatMul(L.w_gate, xn, n, gate_.data(), pool_);
    MatMul(L.w_up, xn, n, up_.data(), pool_);
    ForEachToken(n, [&](int32_t i) {
      float* g = gate_.data() + static_cast<size_t>(i) * c_.n_ff;
      SwiGlu(g, up_.data() + static_cast<size_t>(i) * c_.n_ff, g, c_.n_ff);
    });
    MatMul(L.w_down, gate_.data(), n, proj_.data(), pool_);
    AddInPlace(x, proj_.data(), static_cast<int64_t>(n) * d);
  }
}

void ForwardPass::Attention(int32_t layer, int32_t n, int32_t pos0, const SimpleKvCache& cache) {
  const int32_t group = c_.n_head / c_.n_head_kv;
  const AttentionShape shape{c_.head_dim_k, c_.head_dim_v,
                             1.f / std::sqrt(static_cast<float>(c_.head_dim_k))};
  // A KV head's queries are its group's heads for every token, token-major, so that a kernel
  // tile of four holds queries that see (nearly) the same keys. Jobs are chunks of them in
  // head-major order: a thread's contiguous share is whole heads, each with the same causal
  // triangle of work, and a head's keys stay in cache across its chunks.
  const int32_t n_queries = n * group;
  const int32_t chunks_per_head = (n_queries + kQueriesPerJob - 1) / kQueriesPerJob;
  pool_.ParallelFor(
      static_cast<size_t>(c_.n_head_kv) * chunks_per_head, 1, [&](int, size_t begin, size_t end) {
        for (size_t job = begin; job < end; ++job) {
          const int32_t g = static_cast<int32_t>(job / chunks_per_head);
          const int32_t first = static_cast<int32_t>(job % chunks_per_head) * kQueriesPerJob;
          const int32_t count = std::min(kQueriesPerJob, n_queries - first);
          const float* q[kQueriesPerJob];
          float* out[kQueriesPerJob];
          int32_t n_keys[kQueriesPerJob];
          for (int32_t k = 0; k < count; ++k) {
            const int32_t i = (first + k) / group;
            const int32_t h = g * group + (first + k) % group;
            q[k] = q_.data() + static_cast<size_t>(i) * c_.q_dim() +
                   static_cast<size_t>(h) * c_.head_dim_k;
            out[k] = att_.data() + static_cast<size_t>(i) * c_.n_head * c_.head_dim_v +
                     static_cast<size_t>(h) * c_.head_dim_v;
            n_keys[k] = pos0 + i + 1;  // causal: itself and everything before
          }
          Attend(shape, cache.Head(layer, g), q, n_keys, count, out);
        }
      });
}

}  // namespace kvs
