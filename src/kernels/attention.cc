#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/aligned.h"
#include "core/check.h"

#if defined(__AVX512F__)
#define KVS_ATTENTION_AVX512 1
#include "kernels/simd.h"
#endif

namespace kvs {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int32_t MaxKeys(const int32_t* n_keys, int n) {
  int32_t m = 0;
  for (int i = 0; i < n; ++i) {
    KVS_CHECK(n_keys[i] >= 1);
    m = std::max(m, n_keys[i]);
  }
  return m;
}

#if KVS_ATTENTION_AVX512

inline __mmask16 FirstLanes(int32_t n) {
  return n >= 16  ? static_cast<__mmask16>(0xffff)
         : n <= 0 ? static_cast<__mmask16>(0)
                  : static_cast<__mmask16>((1u << n) - 1);
}

// Q queries over every key block they need. o holds Q rows of the output accumulator, each
// padded to a multiple of 16 floats.
template <int Q>
void AttendTile(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                const int32_t* n_keys, float* const* out, float* o) {
  const int32_t hk = shape.head_dim_k, hv = shape.head_dim_v;
  const int32_t hv_pad = (hv + 15) / 16 * 16;
  const int32_t max_keys = MaxKeys(n_keys, Q);
  float m[Q], l[Q];
  for (int i = 0; i < Q; ++i) {
    m[i] = kNegInf;
    l[i] = 0.0f;
  }
  std::fill(o, o + Q * hv_pad, 0.0f);
  alignas(64) float p[Q][16];

  for (int32_t blk = 0; blk * kKvBlockTokens < max_keys; ++blk) {
    const float* kb = KeyBlock(kv, blk);
    const float* vb = ValueBlock(kv, blk);
    // Scores: two partial sums per query keep eight FMA chains in flight.
    __m512 s0[Q], s1[Q];
    for (int i = 0; i < Q; ++i) s0[i] = s1[i] = _mm512_setzero_ps();
    int32_t d = 0;
    for (; d + 2 <= hk; d += 2) {
      const __m512 k0 = _mm512_loadu_ps(kb + d * kKvBlockTokens);
      const __m512 k1 = _mm512_loadu_ps(kb + (d + 1) * kKvBlockTokens);
      for (int i = 0; i < Q; ++i) {
        s0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), k0, s0[i]);
        s1[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d + 1]), k1, s1[i]);
      }
    }
    if (d < hk) {
      const __m512 k0 = _mm512_loadu_ps(kb + d * kKvBlockTokens);
      for (int i = 0; i < Q; ++i) s0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), k0, s0[i]);
    }
    // Online softmax: rescale what came before by exp(old max - new max).
    float alpha[Q];
    for (int i = 0; i < Q; ++i) {
      const __mmask16 valid = FirstLanes(n_keys[i] - blk * kKvBlockTokens);
      if (valid == 0) {
        alpha[i] = 1.0f;
        _mm512_store_ps(p[i], _mm512_setzero_ps());
        continue;
      }
      const __m512 s = _mm512_mask_mov_ps(
          _mm512_set1_ps(kNegInf), valid,
          _mm512_mul_ps(_mm512_add_ps(s0[i], s1[i]), _mm512_set1_ps(shape.scale)));
      const float m_new = std::max(m[i], _mm512_reduce_max_ps(s));
      alpha[i] = std::exp(m[i] - m_new);  // 0 on the first block (m = -inf)
      const __m512 pv =
          _mm512_maskz_mov_ps(valid, simd::ExpNonPositive(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
      l[i] = l[i] * alpha[i] + _mm512_reduce_add_ps(pv);
      m[i] = m_new;
      _mm512_store_ps(p[i], pv);
    }
    // o = alpha * o + p . V, 64 output dims at a time.
    const int32_t n_rows = std::min(kKvBlockTokens, max_keys - blk * kKvBlockTokens);
    for (int32_t c0 = 0; c0 < hv; c0 += 64) {
      const int n_vec = std::min(4, (hv - c0 + 15) / 16);
      __mmask16 vmask[4];
      for (int v = 0; v < 4; ++v) vmask[v] = FirstLanes(hv - c0 - 16 * v);
      __m512 acc[Q][4];
      for (int i = 0; i < Q; ++i) {
        const __m512 a = _mm512_set1_ps(alpha[i]);
        for (int v = 0; v < 4; ++v) {
          if (v < n_vec) acc[i][v] = _mm512_mul_ps(a, _mm512_load_ps(o + i * hv_pad + c0 + 16 * v));
        }
      }
      for (int32_t j = 0; j < n_rows; ++j) {
        const float* row = vb + j * hv + c0;
        __m512 vr[4];
        for (int v = 0; v < 4; ++v) {
          if (v < n_vec) vr[v] = _mm512_maskz_loadu_ps(vmask[v], row + 16 * v);
        }
        for (int i = 0; i < Q; ++i) {
          const __m512 pj = _mm512_set1_ps(p[i][j]);
          for (int v = 0; v < 4; ++v) {
            if (v < n_vec) acc[i][v] = _mm512_fmadd_ps(pj, vr[v], acc[i][v]);
          }
        }
      }
      for (int i = 0; i < Q; ++i) {
        for (int v = 0; v < 4; ++v) {
          if (v < n_vec) _mm512_store_ps(o + i * hv_pad + c0 + 16 * v, acc[i][v]);
        }
      }
    }
  }
  for (int i = 0; i < Q; ++i) {
    const float inv = 1.0f / l[i];
    for (int32_t d2 = 0; d2 < hv; ++d2) out[i][d2] = o[i * hv_pad + d2] * inv;
  }
}

#else  // portable: the same online softmax, one query and one key at a time

template <int Q>
void AttendTile(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                const int32_t* n_keys, float* const* out, float* o) {
  const int32_t hk = shape.head_dim_k, hv = shape.head_dim_v;
  for (int i = 0; i < Q; ++i) {
    float m = kNegInf, l = 0.0f;
    std::fill(o, o + hv, 0.0f);
    for (int32_t j = 0; j < n_keys[i]; ++j) {
      const float* kb = KeyBlock(kv, j / kKvBlockTokens);
      float s = 0.0f;
      for (int32_t d = 0; d < hk; ++d) s += q[i][d] * kb[d * kKvBlockTokens + j % kKvBlockTokens];
      s *= shape.scale;
      const float m_new = std::max(m, s);
      const float alpha = std::exp(m - m_new), pj = std::exp(s - m_new);
      const float* vr = ValueBlock(kv, j / kKvBlockTokens) + (j % kKvBlockTokens) * hv;
      for (int32_t d = 0; d < hv; ++d) o[d] = o[d] * alpha + pj * vr[d];
      l = l * alpha + pj;
      m = m_new;
    }
    for (int32_t d = 0; d < hv; ++d) out[i][d] = o[d] / l;
  }
}

#endif

}  // namespace

void Attend(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
            const int32_t* n_keys, int n_queries, float* const* out) {
  constexpr int kTile = 4;
  const size_t o_floats = kTile * static_cast<size_t>((shape.head_dim_v + 15) / 16 * 16);
  thread_local AlignedPtr<float> o_buffer;
  thread_local size_t o_capacity = 0;
  if (o_floats > o_capacity) {
    o_buffer = AllocateAligned<float>(o_floats);
    o_capacity = o_floats;
  }
  float* o = o_buffer.get();
  int i = 0;
  for (; i + kTile <= n_queries; i += kTile) {
    AttendTile<kTile>(shape, kv, q + i, n_keys + i, out + i, o);
  }
  switch (n_queries - i) {
    case 3:
      AttendTile<3>(shape, kv, q + i, n_keys + i, out + i, o);
      break;
    case 2:
      AttendTile<2>(shape, kv, q + i, n_keys + i, out + i, o);
      break;
    case 1:
      AttendTile<1>(shape, kv, q + i, n_keys + i, out + i, o);
      break;
    default:
      break;
  }
}

void AttendReference(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                     const int32_t* n_keys, int n_queries, float* const* out) {
  const int32_t hk = shape.head_dim_k, hv = shape.head_dim_v;
  for (int i = 0; i < n_queries; ++i) {
    KVS_CHECK(n_keys[i] >= 1);
    std::vector<double> s(static_cast<size_t>(n_keys[i]));
    for (int32_t j = 0; j < n_keys[i]; ++j) {
      const float* kb = KeyBlock(kv, j / kKvBlockTokens);
      double dot = 0.0;
      for (int32_t d = 0; d < hk; ++d)
        dot += static_cast<double>(q[i][d]) * kb[d * kKvBlockTokens + j % kKvBlockTokens];
      s[j] = dot * shape.scale;
    }
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0.0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int32_t d = 0; d < hv; ++d) {
      double acc = 0.0;
      for (int32_t j = 0; j < n_keys[i]; ++j) {
        acc += s[j] * ValueBlock(kv, j / kKvBlockTokens)[(j % kKvBlockTokens) * hv + d];
      }
      out[i][d] = static_cast<float>(acc / sum);
    }
  }
}

}  // namespace kvs
