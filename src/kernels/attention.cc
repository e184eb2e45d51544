#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/aligned.h"
#include "core/check.h"
#include "kernels/attention_walk.h"
#include "kernels/kv_quant.h"
#include "tensor/dtype.h"

namespace kvs {

void FillRopeTable(const RopeParams& rope, int32_t first_block, int32_t n_blocks, float* table) {
  std::vector<float> cos_sin(rope.n_rot);
  for (int32_t b = first_block; b < first_block + n_blocks; ++b) {
    float* block = table + static_cast<size_t>(b) * rope.n_rot * kKvBlockTokens;
    for (int32_t lane = 0; lane < kKvBlockTokens; ++lane) {
      RopeAngles(b * kKvBlockTokens + lane, rope, cos_sin.data());
      for (int32_t r = 0; r < rope.n_rot; ++r) block[r * kKvBlockTokens + lane] = cos_sin[r];
    }
  }
}

void RopeFromTable(const float* table, int32_t n_rot, int32_t pos, float* cos_sin) {
  const float* block = RopeTableBlock(table, n_rot, pos / kKvBlockTokens);
  for (int32_t r = 0; r < n_rot; ++r) cos_sin[r] = block[r * kKvBlockTokens + pos % kKvBlockTokens];
}

using namespace attention_internal;

namespace {

// Per-thread scratch that only grows.
template <class T>
T* Scratch(AlignedPtr<T>& buffer, size_t& capacity, size_t n) {
  if (n > capacity) {
    buffer = AllocateAligned<T>(n);
    capacity = n;
  }
  return buffer.get();
}

// One head's queries (n of them) made ready to walk, in `buffers`: rotated into the keys' basis
// when the K type is rotated, with the RoPE-offset coefficients when keys are stored less R(p)·m.
struct PreparedQueries {
  std::vector<float> rotated, coef;
  std::vector<const float*> pointers;
};

WalkHead Prepare(const AttentionShape& shape, const KvHeadView& kv, const float* const* q_in, int n,
                 PreparedQueries& buffers) {
  if (kv.k_whitening != nullptr) {
    KVS_CHECK(kv.rope_table != nullptr && kv.n_rot > 0 && kv.n_rot <= shape.head_dim_k &&
              shape.head_dim_k <= kMaxWhitenedHeadDim && kv.k_offset == nullptr);
  }
  WalkHead head{&kv, q_in, nullptr};
  // Keys stored less R(p)·m: the coefficients of the scores' missing part, from the queries as
  // given (m is in the unrotated basis).
  if (kv.k_offset != nullptr) {
    KVS_CHECK(kv.rope_table != nullptr && kv.n_rot > 0 && kv.n_rot <= shape.head_dim_k);
    buffers.coef.resize(static_cast<size_t>(n) * kv.n_rot);
    for (int j = 0; j < n; ++j) {
      OffsetCoefficients(kv, q_in[j], buffers.coef.data() + static_cast<size_t>(j) * kv.n_rot);
    }
    head.coef = buffers.coef.data();
  }
  // Rotated keys need the queries in the same basis (q.k is unchanged by the rotation).
  if (KvTypeIsRotated(kv.k_type) && kv.k_whitening == nullptr) {
    const int32_t hk = shape.head_dim_k;
    buffers.rotated.resize(static_cast<size_t>(n) * hk);
    buffers.pointers.resize(n);
    for (int j = 0; j < n; ++j) {
      float* r = buffers.rotated.data() + static_cast<size_t>(j) * hk;
      std::copy(q_in[j], q_in[j] + hk, r);
      RotateForward(r, hk);
      buffers.pointers[j] = r;
    }
    head.q = buffers.pointers.data();
  }
  return head;
}

}  // namespace

void Attend(const AttentionShape& shape, const KvHeadView& kv, const float* const* q_in,
            const int32_t* n_keys, int n_queries, float* const* out, const int32_t* first_key) {
  const size_t hv_pad = AttentionPartialStride(shape);
  thread_local PreparedQueries prepared;
  CheckKeyRanges(n_keys, first_key, n_queries);
  const WalkHead all = Prepare(shape, kv, q_in, n_queries, prepared);
  thread_local AlignedPtr<float> o_buffer, ml_buffer;
  thread_local size_t o_capacity = 0, ml_capacity = 0;
  for (int i = 0; i < n_queries; i += kWalkQueries) {
    const int n = std::min(kWalkQueries, n_queries - i);
    const int32_t n_parts = KeyPartitions(MaxKeys(n_keys + i, n));
    // Every partition's partials [part][query], then each query's merged in partition order:
    // the same arithmetic as AttendPartition + MergePartitions on other threads.
    const size_t rows = static_cast<size_t>(n_parts) * n;
    float* o = Scratch(o_buffer, o_capacity, rows * hv_pad);
    float* ml = Scratch(ml_buffer, ml_capacity, 2 * rows);
    const WalkHead head{&kv, all.q + i,
                        all.coef ? all.coef + static_cast<size_t>(i) * kv.n_rot : nullptr};
    const WalkFn walk = WalkFor(kv, n);
    const int32_t* first = first_key ? first_key + i : nullptr;
    for (int32_t p = 0; p < n_parts; ++p) {
      const size_t row0 = static_cast<size_t>(p) * n;
      walk(shape, &head, 1, n_keys + i, first, n, p * kKeyPartitionBlocks,
           (p + 1) * kKeyPartitionBlocks, {o + row0 * hv_pad, ml + row0, ml + rows + row0});
    }
    for (int j = 0; j < n; ++j) {
      MergePartitions(shape, kv.v_type, KeyPartitions(n_keys[i + j]), o + j * hv_pad, n * hv_pad,
                      ml + j, ml + rows + j, n, out[i + j]);
    }
  }
}

void AttendPartition(const AttentionShape& shape, const KvHeadView* heads, int n_heads,
                     const float* const* q, const int32_t* n_keys, int n, int32_t part,
                     const AttentionPartials& out, const int32_t* first_key) {
  KVS_CHECK(n >= 1 && n <= kWalkQueries && n_heads >= 1 && part >= 0);
  CheckKeyRanges(n_keys, first_key, n);
  thread_local std::vector<PreparedQueries> prepared;
  thread_local std::vector<WalkHead> walk_heads;
  if (prepared.size() < static_cast<size_t>(n_heads)) prepared.resize(n_heads);
  walk_heads.resize(n_heads);
  for (int h = 0; h < n_heads; ++h) {
    walk_heads[h] = Prepare(shape, heads[h], q + static_cast<size_t>(h) * n, n, prepared[h]);
  }
  WalkFor(heads[0], n)(shape, walk_heads.data(), n_heads, n_keys, first_key, n,
                       part * kKeyPartitionBlocks, (part + 1) * kKeyPartitionBlocks,
                       {out.o, out.m, out.l});
}

void MergePartitions(const AttentionShape& shape, KvType v_type, int32_t n_parts, const float* o,
                     size_t o_stride, const float* m, const float* l, size_t ml_stride,
                     float* out) {
  KVS_CHECK(n_parts >= 1);
  const int32_t hv = shape.head_dim_v;
  // A running merge in partition order; partition 0 alone is o / l exactly.
  float m_run = m[0], l_run = l[0];
  std::copy(o, o + hv, out);
  for (int32_t p = 1; p < n_parts; ++p) {
    const float m_p = m[p * ml_stride], m_new = std::max(m_run, m_p);
    // Exactly 1 for the larger maximum, without the call: exp(inf - inf) would be NaN when
    // both maxima are infinite (an f16 key overflow).
    const float a = m_run == m_new ? 1.0f : std::exp(m_run - m_new);
    const float b = m_p == m_new ? 1.0f : std::exp(m_p - m_new);
    const float* o_p = o + p * o_stride;
    for (int32_t d = 0; d < hv; ++d) out[d] = out[d] * a + o_p[d] * b;
    l_run = l_run * a + l[p * ml_stride] * b;
    m_run = m_new;
  }
  const float inv = 1.0f / l_run;
  for (int32_t d = 0; d < hv; ++d) out[d] *= inv;
  // Values stored rotated give a rotated weighted sum: rotate it back.
  if (KvTypeIsRotated(v_type)) RotateBack(out, hv);
}

namespace {

// Query q's softmax over keys [first, n_keys), in double, by the head's key coding (weights of
// keys before first: 0).
std::vector<double> SoftmaxReference(const AttentionShape& shape, const KvHeadView& kv,
                                     const float* q, int32_t n_keys, int32_t first = 0) {
  KVS_CHECK(n_keys >= 1 && first >= 0 && first < n_keys);
  const int32_t hk = shape.head_dim_k;
  std::vector<float> qi(q, q + hk), coef(kv.n_rot);
  if (kv.k_offset != nullptr) OffsetCoefficients(kv, q, coef.data());
  const bool whitened = kv.k_whitening != nullptr;
  if (KvTypeIsRotated(kv.k_type) && !whitened) RotateForward(qi.data(), hk);
  std::vector<double> s(static_cast<size_t>(n_keys), -std::numeric_limits<double>::infinity());
  std::vector<float> key(hk);
  for (int32_t j = first; j < n_keys; ++j) {
    const uint8_t* kb = KeyBlock(kv, j / kKvBlockTokens);
    if (whitened) {
      LoadWhitenedKey(kv, hk, j, key.data());
    } else {
      for (int32_t d = 0; d < hk; ++d) key[d] = LoadKey(kv.k_type, kb, hk, d, j % kKvBlockTokens);
    }
    double dot = 0.0;
    for (int32_t d = 0; d < hk; ++d) dot += static_cast<double>(qi[d]) * key[d];
    if (kv.k_offset != nullptr) dot += OffsetScore(kv, coef.data(), j);
    s[j] = dot * shape.scale;
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0.0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (double& x : s) x /= sum;
  return s;
}

}  // namespace

void AttendReference(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                     const int32_t* n_keys, int n_queries, float* const* out,
                     const int32_t* first_key) {
  const int32_t hv = shape.head_dim_v;
  for (int i = 0; i < n_queries; ++i) {
    const int32_t first = FirstKey(first_key, i);
    const std::vector<double> p = SoftmaxReference(shape, kv, q[i], n_keys[i], first);
    for (int32_t d = 0; d < hv; ++d) {
      double acc = 0.0;
      for (int32_t j = first; j < n_keys[i]; ++j) {
        acc += p[j] *
               LoadValue(kv.v_type, ValueBlock(kv, j / kKvBlockTokens), hv, j % kKvBlockTokens, d);
      }
      out[i][d] = static_cast<float>(acc);
    }
    if (KvTypeIsRotated(kv.v_type)) RotateBack(out[i], hv);
  }
}

void AttentionMass(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                   const int32_t* n_keys, int n_queries, float* mass) {
  if (n_queries <= 0) return;
  // The keys are decoded once (LoadKeys: as the model wrote them) for all the queries; a key
  // coding's constant offset, which LoadKeys leaves out, shifts a query's scores alike, which
  // softmax ignores. Then plain float loops the compiler vectorizes.
  const int32_t hk = shape.head_dim_k, max_keys = MaxKeys(n_keys, n_queries);
  std::vector<float> keys(static_cast<size_t>(max_keys) * hk), s(max_keys);
  LoadKeys(kv, hk, max_keys, keys.data());
  for (int i = 0; i < n_queries; ++i) {
    const int32_t n = n_keys[i];
    float mx = kNegInf;
    for (int32_t j = 0; j < n; ++j) {
      const float* k = keys.data() + static_cast<size_t>(j) * hk;
      float dot = 0.0f;
      for (int32_t d = 0; d < hk; ++d) dot += q[i][d] * k[d];
      s[j] = dot * shape.scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0.0;
    for (int32_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
    const float inv = static_cast<float>(1.0 / sum);
    for (int32_t j = 0; j < n; ++j) mass[j] += s[j] * inv;
  }
}

void LoadKeys(const KvHeadView& kv, int32_t hk, int32_t n_keys, float* keys) {
  std::vector<float> offset(hk), cos_sin(std::max(kv.n_rot, 1));
  for (int32_t j = 0; j < n_keys; ++j) {
    float* key = keys + static_cast<size_t>(j) * hk;
    if (kv.k_whitening != nullptr) {
      LoadWhitenedKey(kv, hk, j, key);
      continue;
    }
    const uint8_t* kb = KeyBlock(kv, j / kKvBlockTokens);
    const int32_t p = j % kKvBlockTokens;
    if (kv.k_type == KvType::kF16) {
      // The common case read directly: a dimension's row holds 16 f16 codes.
      const uint16_t* rows = reinterpret_cast<const uint16_t*>(kb);
      for (int32_t d = 0; d < hk; ++d) key[d] = F16ToF32(rows[d * kKvBlockTokens + p]);
    } else if (kv.k_type == KvType::kF32) {
      const float* rows = reinterpret_cast<const float*>(kb);
      for (int32_t d = 0; d < hk; ++d) key[d] = rows[d * kKvBlockTokens + p];
    } else {
      for (int32_t d = 0; d < hk; ++d) key[d] = LoadKey(kv.k_type, kb, hk, d, p);
    }
    if (KvTypeIsRotated(kv.k_type)) RotateBack(key, hk);
    if (kv.k_offset != nullptr) {
      // Stored less R(p)·m: add m turned to the key's position back.
      std::copy(kv.k_offset, kv.k_offset + hk, offset.begin());
      RopeFromTable(kv.rope_table, kv.n_rot, j, cos_sin.data());
      ApplyRope(offset.data(), cos_sin.data(), kv.n_rot, kv.rope_neox);
      for (int32_t d = 0; d < hk; ++d) key[d] += offset[d];
    }
  }
}

}  // namespace kvs