#include "kernels/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/aligned.h"
#include "core/check.h"
#include "kernels/kv_quant.h"
#include "tensor/dtype.h"

#if defined(__AVX512F__)
#define KVS_ATTENTION_AVX512 1
#include "kernels/kv_codecs_avx512.h"
#endif

namespace kvs {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Queries that walk a head's key blocks together (attention.h).
constexpr int kWalkQueries = 32;

int32_t MaxKeys(const int32_t* n_keys, int n) {
  int32_t m = 0;
  for (int i = 0; i < n; ++i) {
    KVS_CHECK(n_keys[i] >= 1);
    m = std::max(m, n_keys[i]);
  }
  return m;
}

// Per query, the coefficients of q·R(p)·m in the RoPE table's rows: for each rotated pair (a, b)
// q_a m_a + q_b m_b on its cos row and q_b m_a - q_a m_b on its sin row. Dims past n_rot add the
// same q·m to every score, which softmax ignores.
void OffsetCoefficients(const KvHeadView& kv, const float* q, float* coef) {
  const int32_t half = kv.n_rot / 2;
  const float* m = kv.k_offset;
  for (int32_t i = 0; i < half; ++i) {
    const auto [a, b] = RopePairDims(i, kv.n_rot, kv.rope_neox);
    coef[i] = q[a] * m[a] + q[b] * m[b];
    coef[half + i] = q[b] * m[a] - q[a] * m[b];
  }
}

// q·R(p)·m for key position pos, from the query's coefficients.
double OffsetScore(const KvHeadView& kv, const float* coef, int32_t pos) {
  const float* block = RopeTableBlock(kv.rope_table, kv.n_rot, pos / kKvBlockTokens);
  double s = 0.0;
  for (int32_t r = 0; r < kv.n_rot; ++r) {
    s += static_cast<double>(coef[r]) * block[r * kKvBlockTokens + pos % kKvBlockTokens];
  }
  return s;
}

// Key j of a head stored whitened (key_whitening.h), as the model wrote it: unwhitened, then
// turned by RoPE to position j.
void LoadWhitenedKey(const KvHeadView& kv, int32_t hk, int32_t j, float* key) {
  float stored[kMaxWhitenedHeadDim], cos_sin[kMaxWhitenedHeadDim];
  const uint8_t* kb = KeyBlock(kv, j / kKvBlockTokens);
  for (int32_t d = 0; d < hk; ++d) stored[d] = LoadKey(kv.k_type, kb, hk, d, j % kKvBlockTokens);
  UnwhitenKey(*kv.k_whitening, hk, stored, key);
  RopeFromTable(kv.rope_table, kv.n_rot, j, cos_sin);
  ApplyRope(key, cos_sin, kv.n_rot, kv.rope_neox);
}

#if KVS_ATTENTION_AVX512

using kv_simd::FirstLanes;

template <class Codec>
Codec MakeCodec(KvType t) {
  if constexpr (std::is_constructible_v<Codec, KvType>) {
    return Codec(t);
  } else {
    return Codec();
  }
}

// s[i] = the 16 raw scores q[i] . k of one key block (before the softmax scale). group is the
// dims per scale (0: no scales, one pass over all dims).
template <class Codec, int Q>
void ScoreBlock(KvType t, const uint8_t* kb, int32_t hk, int32_t group, const float* const* q,
                __m512* s) {
  const Codec codec = MakeCodec<Codec>(t);
  constexpr size_t kRow = 16 * Codec::kBits / 8;
  const int32_t g_len = group == 0 ? hk : group;
  const uint8_t* scales = kb + hk * kRow;
  for (int i = 0; i < Q; ++i) s[i] = _mm512_setzero_ps();
  for (int32_t g0 = 0; g0 < hk; g0 += g_len) {
    // Two partial sums per query keep eight FMA chains in flight.
    __m512 a0[Q], a1[Q];
    for (int i = 0; i < Q; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
    const int32_t end = g0 + g_len;
    int32_t d = g0;
    for (; d + 2 <= end; d += 2) {
      const __m512 k0 = codec.Keys(kb + d * kRow);
      const __m512 k1 = codec.Keys(kb + (d + 1) * kRow);
      for (int i = 0; i < Q; ++i) {
        a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), k0, a0[i]);
        a1[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d + 1]), k1, a1[i]);
      }
    }
    if (d < end) {
      const __m512 k0 = codec.Keys(kb + d * kRow);
      for (int i = 0; i < Q; ++i) a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(q[i][d]), k0, a0[i]);
    }
    if (group == 0) {
      for (int i = 0; i < Q; ++i) s[i] = _mm512_add_ps(a0[i], a1[i]);
    } else {
      const __m512 scale = _mm512_mul_ps(simd::Halves16(scales + (g0 / g_len) * 32),
                                         _mm512_set1_ps(Codec::kScaleMul));
      for (int i = 0; i < Q; ++i) s[i] = _mm512_fmadd_ps(_mm512_add_ps(a0[i], a1[i]), scale, s[i]);
    }
  }
}

// The 16 keys of a whitened key block as f32 [hk][16] in tile: stored coordinates (codes times
// scales), unwhitened (hk broadcast FMAs per dim), turned by RoPE from the table's rows.
template <class Codec>
void DecodeWhitenedBlock(KvType t, const uint8_t* kb, int32_t hk, int32_t group,
                         const KvHeadView& kv, int32_t blk, float* tile) {
  const Codec codec = MakeCodec<Codec>(t);
  constexpr size_t kRow = 16 * Codec::kBits / 8;
  const uint8_t* scales = kb + hk * kRow;
  __m512 y[kMaxWhitenedHeadDim], k[kMaxWhitenedHeadDim];
  for (int32_t j = 0; j < hk; ++j) {
    const __m512 scale =
        _mm512_mul_ps(simd::Halves16(scales + (j / group) * 32), _mm512_set1_ps(Codec::kScaleMul));
    y[j] = _mm512_mul_ps(codec.Keys(kb + j * kRow), scale);
  }
  const KeyWhitening& w = *kv.k_whitening;
  for (int32_t d = 0; d < hk; ++d) {
    __m512 acc = _mm512_set1_ps(w.mean[d]);
    for (int32_t j = 0; j < hk; ++j) {
      acc = _mm512_fmadd_ps(_mm512_set1_ps(w.from_coords[d * hk + j]), y[j], acc);
    }
    k[d] = acc;
  }
  const float* rows = RopeTableBlock(kv.rope_table, kv.n_rot, blk);
  const int32_t half = kv.n_rot / 2;
  for (int32_t i = 0; i < half; ++i) {
    const auto [a, b] = RopePairDims(i, kv.n_rot, kv.rope_neox);
    const __m512 c = _mm512_loadu_ps(rows + i * kKvBlockTokens);
    const __m512 sn = _mm512_loadu_ps(rows + (half + i) * kKvBlockTokens);
    const __m512 k_a = k[a], k_b = k[b];
    k[a] = _mm512_fmsub_ps(k_a, c, _mm512_mul_ps(k_b, sn));
    k[b] = _mm512_fmadd_ps(k_a, sn, _mm512_mul_ps(k_b, c));
  }
  for (int32_t d = 0; d < hk; ++d) _mm512_store_ps(tile + d * kKvBlockTokens, k[d]);
}

// Per-lane scale of value dims c.. of a row whose group scales start at row_scales.
inline __m512 ValueLaneScale(const float* row_scales, int32_t c, int32_t group, int32_t hv) {
  if (group >= 16) return _mm512_set1_ps(row_scales[c / group]);
  const float hi = c + 8 < hv ? row_scales[c / 8 + 1] : 0.0f;
  return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(row_scales[c / 8]), _mm512_set1_ps(hi));
}

// o[i] = alpha[i] * o[i] + sum_j p[i][j] * v[j] over the block's first rows[i] value rows
// (n_rows: the largest), 64 output dims at a time. o rows are padded to hv_pad floats. Rows past
// a query's own are skipped, not added with weight 0: a value the type stores as Inf (an f16
// overflow) of a later key would make 0 * Inf = NaN for a query that never sees that key, and
// its output would then depend on the queries beside it.
template <class Codec, int Q>
void AccumulateBlock(KvType t, const uint8_t* vb, int32_t hv, int32_t group, const float (*p)[16],
                     const float* alpha, const int32_t* rows, int32_t n_rows, float* o,
                     int32_t hv_pad) {
  const Codec codec = MakeCodec<Codec>(t);
  const size_t row_bytes = static_cast<size_t>(hv) * Codec::kBits / 8;
  const int32_t n_groups = group == 0 ? 0 : hv / group;
  // The block's value scales [16 rows][n_groups], widened once (kScaleMul folded in).
  alignas(64) float scales[16 * 128];
  for (int32_t i = 0; i < n_groups; ++i) {
    _mm512_store_ps(scales + 16 * i, _mm512_mul_ps(simd::Halves16(vb + 16 * row_bytes + 32 * i),
                                                   _mm512_set1_ps(Codec::kScaleMul)));
  }
  // Rows below every query's own count take the unmasked FMAs; only a tile's last block has
  // rows some of its queries must skip.
  int32_t all_live = n_rows;
  for (int i = 0; i < Q; ++i) all_live = std::min(all_live, rows[i]);
  for (int32_t c0 = 0; c0 < hv; c0 += 64) {
    const int n_vec = std::min(4, (hv - c0 + 15) / 16);
    __m512 acc[Q][4];
    for (int i = 0; i < Q; ++i) {
      const __m512 a = _mm512_set1_ps(alpha[i]);
      for (int v = 0; v < 4; ++v) {
        if (v < n_vec) acc[i][v] = _mm512_mul_ps(a, _mm512_load_ps(o + i * hv_pad + c0 + 16 * v));
      }
    }
    for (int32_t j = 0; j < n_rows; ++j) {
      const uint8_t* row = vb + j * row_bytes;
      __m512 vr[4];
      for (int v = 0; v < 4; ++v) {
        if (v >= n_vec) continue;
        const int32_t c = c0 + 16 * v;
        vr[v] = codec.Values(row, c, std::min(16, hv - c));
        if (group != 0) {
          vr[v] = _mm512_mul_ps(vr[v], ValueLaneScale(scales + j * n_groups, c, group, hv));
        }
      }
      if (j < all_live) {  // every query sees this row: the plain FMAs
        for (int i = 0; i < Q; ++i) {
          const __m512 pj = _mm512_set1_ps(p[i][j]);
          for (int v = 0; v < 4; ++v) {
            if (v < n_vec) acc[i][v] = _mm512_fmadd_ps(pj, vr[v], acc[i][v]);
          }
        }
        continue;
      }
      for (int i = 0; i < Q; ++i) {
        const __m512 pj = _mm512_set1_ps(p[i][j]);
        const __mmask16 live = j < rows[i] ? 0xffff : 0;
        for (int v = 0; v < 4; ++v) {
          if (v < n_vec) acc[i][v] = _mm512_mask3_fmadd_ps(pj, vr[v], acc[i][v], live);
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

template <int Q>
using ScoreFn = void (*)(KvType, const uint8_t*, int32_t, int32_t, const float* const*, __m512*);
template <int Q>
using AccumulateFn = void (*)(KvType, const uint8_t*, int32_t, int32_t, const float (*)[16],
                              const float*, const int32_t*, int32_t, float*, int32_t);

using DecodeWhitenedFn = void (*)(KvType, const uint8_t*, int32_t, int32_t, const KvHeadView&,
                                  int32_t, float*);

// Calls visit(std::type_identity<Codec>{}) with the codec that reads type t's codes.
template <class Visit>
auto WithCodec(KvType t, Visit visit) {
  switch (t) {
    case KvType::kF32:
      return visit(std::type_identity<kv_simd::F32Codec>{});
    case KvType::kF16:
      return visit(std::type_identity<kv_simd::F16Codec>{});
    case KvType::kBF16:
      return visit(std::type_identity<kv_simd::BF16Codec>{});
    case KvType::kQ8_0:
    case KvType::kInt8:
      return visit(std::type_identity<kv_simd::Int8Codec>{});
    case KvType::kFp8:
      return visit(std::type_identity<kv_simd::Fp8Codec>{});
    case KvType::kQ4_0:
    case KvType::kTurbo4:
      return visit(std::type_identity<kv_simd::Nibble4Codec>{});
    case KvType::kTurbo3:
      return visit(std::type_identity<kv_simd::Bit3Codec>{});
  }
  return decltype(visit(std::type_identity<kv_simd::F32Codec>{})){};
}

template <int Q>
ScoreFn<Q> ScoreFor(KvType t) {
  return WithCodec(t,
                   []<class C>(std::type_identity<C>) -> ScoreFn<Q> { return &ScoreBlock<C, Q>; });
}

template <int Q>
AccumulateFn<Q> AccumulateFor(KvType t) {
  return WithCodec(
      t, []<class C>(std::type_identity<C>) -> AccumulateFn<Q> { return &AccumulateBlock<C, Q>; });
}

DecodeWhitenedFn DecodeWhitenedFor(KvType t) {
  return WithCodec(t, []<class C>(std::type_identity<C>) -> DecodeWhitenedFn {
    return &DecodeWhitenedBlock<C>;
  });
}

constexpr int32_t kPrefetchBlocks = 2;

inline void PrefetchBytes(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// The key paths, one per key coding (KeyCodingKind, kv_layer.h): Score writes the 16 raw scores
// q[i]·k (before the softmax scale) of the head's logical key block blk. The tile is compiled
// once per path, so choosing one costs nothing per block.

// Keys as stored (plain, or less a constant offset, which softmax ignores).
template <int Q>
class PlainKeys {
 public:
  PlainKeys(const KvHeadView& kv, int32_t hk, const float* /*coef*/)
      : kv_(kv), hk_(hk), group_(KvGroupSize(kv.k_type, hk)), score_(ScoreFor<Q>(kv.k_type)) {}
  void Score(int32_t blk, const float* const* q, __m512* s) const {
    score_(kv_.k_type, KeyBlock(kv_, blk), hk_, group_, q, s);
  }

 private:
  const KvHeadView& kv_;
  int32_t hk_, group_;
  ScoreFn<Q> score_;
};

// Keys stored less R(p)·m: the stored part, plus q·R(p)·m from the per-query coefficients
// (OffsetCoefficients) over the block's RoPE rows, n_rot FMAs per query.
template <int Q>
class RopeOffsetKeys {
 public:
  RopeOffsetKeys(const KvHeadView& kv, int32_t hk, const float* coef)
      : stored_(kv, hk, nullptr), kv_(kv), coef_(coef) {}
  void Score(int32_t blk, const float* const* q, __m512* s) const {
    stored_.Score(blk, q, s);
    const float* rows = RopeTableBlock(kv_.rope_table, kv_.n_rot, blk);
    for (int32_t r = 0; r < kv_.n_rot; ++r) {
      const __m512 row = _mm512_loadu_ps(rows + r * kKvBlockTokens);
      for (int i = 0; i < Q; ++i) {
        s[i] = _mm512_fmadd_ps(_mm512_set1_ps(coef_[i * kv_.n_rot + r]), row, s[i]);
      }
    }
  }

 private:
  PlainKeys<Q> stored_;
  const KvHeadView& kv_;
  const float* coef_;
};

// Keys stored whitened: each block decoded to f32 keys at their positions, scored as f32.
template <int Q>
class WhitenedKeys {
 public:
  WhitenedKeys(const KvHeadView& kv, int32_t hk, const float* /*coef*/)
      : kv_(kv),
        hk_(hk),
        group_(KvGroupSize(kv.k_type, hk)),
        decode_(DecodeWhitenedFor(kv.k_type)),
        score_(ScoreFor<Q>(KvType::kF32)) {}
  void Score(int32_t blk, const float* const* q, __m512* s) const {
    alignas(64) float tile[kMaxWhitenedHeadDim * kKvBlockTokens];
    decode_(kv_.k_type, KeyBlock(kv_, blk), hk_, group_, kv_, blk, tile);
    score_(KvType::kF32, reinterpret_cast<const uint8_t*>(tile), hk_, 0, q, s);
  }

 private:
  const KvHeadView& kv_;
  int32_t hk_, group_;
  DecodeWhitenedFn decode_;
  ScoreFn<Q> score_;
};

// The online-softmax state of Q queries (running max m and sum l per query, o: Q rows of the
// output accumulator, each padded to a multiple of 16 floats), folding in one key block at a
// time read by KeyPath. A query's arithmetic is the same whatever tile it is in and whatever
// tiles walk beside it, so decode and the verification of drafts give bit-identical outputs.
template <int Q, template <int> class KeyPath>
class QueryTile {
 public:
  QueryTile(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
            const float* coef, const int32_t* n_keys, float* o)
      : shape_(shape),
        kv_(kv),
        q_(q),
        n_keys_(n_keys),
        o_(o),
        hv_pad_((shape.head_dim_v + 15) / 16 * 16),
        max_keys_(MaxKeys(n_keys, Q)),
        keys_(kv, shape.head_dim_k, coef),
        accumulate_(AccumulateFor<Q>(kv.v_type)),
        v_group_(KvGroupSize(kv.v_type, shape.head_dim_v)) {
    for (int i = 0; i < Q; ++i) {
      m_[i] = kNegInf;
      l_[i] = 0.0f;
    }
    std::fill(o, o + Q * hv_pad_, 0.0f);
  }

  int32_t n_blocks() const { return (max_keys_ + kKvBlockTokens - 1) / kKvBlockTokens; }

  // Folds in key block blk; blocks past the tile's keys are skipped.
  void Block(int32_t blk) {
    if (blk >= n_blocks()) return;
    __m512 s_raw[Q];
    keys_.Score(blk, q_, s_raw);
    // Online softmax: rescale what came before by exp(old max - new max).
    float alpha[Q];
    int32_t rows[Q];
    alignas(64) float p[Q][16];
    for (int i = 0; i < Q; ++i) {
      rows[i] = std::clamp(n_keys_[i] - blk * kKvBlockTokens, 0, kKvBlockTokens);
      const __mmask16 valid = FirstLanes(n_keys_[i] - blk * kKvBlockTokens);
      if (valid == 0) {
        alpha[i] = 1.0f;
        _mm512_store_ps(p[i], _mm512_setzero_ps());
        continue;
      }
      const __m512 s = _mm512_mask_mov_ps(_mm512_set1_ps(kNegInf), valid,
                                          _mm512_mul_ps(s_raw[i], _mm512_set1_ps(shape_.scale)));
      const float m_new = std::max(m_[i], _mm512_reduce_max_ps(s));
      // 0 on the first block (m = -inf); exactly 1, without the call, while the max holds.
      alpha[i] = m_new == m_[i] ? 1.0f : std::exp(m_[i] - m_new);
      const __m512 pv =
          _mm512_maskz_mov_ps(valid, simd::ExpNonPositive(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
      l_[i] = l_[i] * alpha[i] + _mm512_reduce_add_ps(pv);
      m_[i] = m_new;
      _mm512_store_ps(p[i], pv);
    }
    const int32_t n_rows = std::min(kKvBlockTokens, max_keys_ - blk * kKvBlockTokens);
    accumulate_(kv_.v_type, ValueBlock(kv_, blk), shape_.head_dim_v, v_group_, p, alpha, rows,
                n_rows, o_, hv_pad_);
  }

  void Finish(float* const* out) const {
    for (int i = 0; i < Q; ++i) {
      const float inv = 1.0f / l_[i];
      for (int32_t d = 0; d < shape_.head_dim_v; ++d) out[i][d] = o_[i * hv_pad_ + d] * inv;
    }
  }

 private:
  const AttentionShape& shape_;
  const KvHeadView& kv_;
  const float* const* q_;
  const int32_t* n_keys_;
  float* o_;
  int32_t hv_pad_, max_keys_;
  KeyPath<Q> keys_;
  AccumulateFn<Q> accumulate_;
  int32_t v_group_;
  float m_[Q], l_[Q];
};

// Tiles of four queries (then one of R < 4, when R > 0) walk the key blocks together: a block is
// fetched once and scored by every tile while it is in L1, so a sequence's k + 1 verification
// tokens (k + 1 tiles per KV head) read its KV once, not k + 1 times. n <= kWalkQueries; o holds
// n rows of hv_pad floats.
template <template <int> class KeyPath, int R>
void AttendWalk(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                const float* coef, const int32_t* n_keys, int n, float* const* out, float* o) {
  const int32_t hv_pad = (shape.head_dim_v + 15) / 16 * 16;
  const int n4 = n / 4;
  auto coef_of = [&](int first) {
    return coef ? coef + static_cast<size_t>(first) * kv.n_rot : nullptr;
  };
  std::array<std::optional<QueryTile<4, KeyPath>>, kWalkQueries / 4> tiles;
  std::optional<QueryTile<R == 0 ? 1 : R, KeyPath>> rest;
  int32_t n_blocks = 0;
  for (int t = 0; t < n4; ++t) {
    tiles[t].emplace(shape, kv, q + 4 * t, coef_of(4 * t), n_keys + 4 * t, o + 4 * t * hv_pad);
    n_blocks = std::max(n_blocks, tiles[t]->n_blocks());
  }
  if constexpr (R > 0) {
    rest.emplace(shape, kv, q + 4 * n4, coef_of(4 * n4), n_keys + 4 * n4, o + 4 * n4 * hv_pad);
    n_blocks = std::max(n_blocks, rest->n_blocks());
  }
  const size_t k_bytes = KvHeadBlockBytes(kv.k_type, shape.head_dim_k);
  const size_t v_bytes = KvHeadBlockBytes(kv.v_type, shape.head_dim_v);
  for (int32_t blk = 0; blk < n_blocks; ++blk) {
    // A head's blocks lie n_head_kv head blocks apart at least (pages apart, in table order):
    // the hardware prefetcher does not follow, so fetch the block after next ahead of use.
    if (blk + kPrefetchBlocks < n_blocks) {
      PrefetchBytes(KeyBlock(kv, blk + kPrefetchBlocks), k_bytes);
      PrefetchBytes(ValueBlock(kv, blk + kPrefetchBlocks), v_bytes);
    }
    for (int t = 0; t < n4; ++t) tiles[t]->Block(blk);
    if constexpr (R > 0) rest->Block(blk);
  }
  for (int t = 0; t < n4; ++t) tiles[t]->Finish(out + 4 * t);
  if constexpr (R > 0) rest->Finish(out + 4 * n4);
}

using WalkFn = void (*)(const AttentionShape&, const KvHeadView&, const float* const*, const float*,
                        const int32_t*, int, float* const*, float*);

template <template <int> class KeyPath>
WalkFn WalkWithRest(int rest) {
  switch (rest) {
    case 1:
      return &AttendWalk<KeyPath, 1>;
    case 2:
      return &AttendWalk<KeyPath, 2>;
    case 3:
      return &AttendWalk<KeyPath, 3>;
    default:
      return &AttendWalk<KeyPath, 0>;
  }
}

// The walk for the head's key coding (whitened, less a RoPE-turned offset, or as stored) and
// for n queries.
WalkFn WalkFor(const KvHeadView& kv, int n) {
  if (kv.k_whitening != nullptr) return WalkWithRest<WhitenedKeys>(n % 4);
  if (kv.k_offset != nullptr) return WalkWithRest<RopeOffsetKeys>(n % 4);
  return WalkWithRest<PlainKeys>(n % 4);
}

#else  // portable: the same online softmax, one query and one key at a time

// Key j's raw score q·k, by the head's key coding (see the AVX-512 key paths).
float PortableScore(const KvHeadView& kv, int32_t hk, const float* q, const float* coef,
                    int32_t j) {
  float s = 0.0f;
  if (kv.k_whitening != nullptr) {
    float key[kMaxWhitenedHeadDim];
    LoadWhitenedKey(kv, hk, j, key);
    for (int32_t d = 0; d < hk; ++d) s += q[d] * key[d];
    return s;
  }
  const uint8_t* kb = KeyBlock(kv, j / kKvBlockTokens);
  for (int32_t d = 0; d < hk; ++d) s += q[d] * LoadKey(kv.k_type, kb, hk, d, j % kKvBlockTokens);
  if (coef != nullptr) s += static_cast<float>(OffsetScore(kv, coef, j));
  return s;
}

void AttendEach(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                const float* coef, const int32_t* n_keys, int n, float* const* out, float* o) {
  const int32_t hk = shape.head_dim_k, hv = shape.head_dim_v;
  for (int i = 0; i < n; ++i) {
    float m = kNegInf, l = 0.0f;
    std::fill(o, o + hv, 0.0f);
    for (int32_t j = 0; j < n_keys[i]; ++j) {
      const uint8_t* vb = ValueBlock(kv, j / kKvBlockTokens);
      const float s =
          PortableScore(kv, hk, q[i], coef ? coef + i * kv.n_rot : nullptr, j) * shape.scale;
      const float m_new = std::max(m, s);
      const float alpha = std::exp(m - m_new), pj = std::exp(s - m_new);
      for (int32_t d = 0; d < hv; ++d) {
        o[d] = o[d] * alpha + pj * LoadValue(kv.v_type, vb, hv, j % kKvBlockTokens, d);
      }
      l = l * alpha + pj;
      m = m_new;
    }
    for (int32_t d = 0; d < hv; ++d) out[i][d] = o[d] / l;
  }
}

using WalkFn = void (*)(const AttentionShape&, const KvHeadView&, const float* const*, const float*,
                        const int32_t*, int, float* const*, float*);

WalkFn WalkFor(const KvHeadView&, int) {
  return &AttendEach;
}

#endif

}  // namespace

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

void Attend(const AttentionShape& shape, const KvHeadView& kv, const float* const* q_in,
            const int32_t* n_keys, int n_queries, float* const* out) {
  const size_t o_floats = kWalkQueries * static_cast<size_t>((shape.head_dim_v + 15) / 16 * 16);
  thread_local AlignedPtr<float> o_buffer;
  thread_local size_t o_capacity = 0;
  if (o_floats > o_capacity) {
    o_buffer = AllocateAligned<float>(o_floats);
    o_capacity = o_floats;
  }
  float* o = o_buffer.get();
  // Keys stored less R(p)·m: the coefficients of the scores' missing part, from the queries as
  // given (m is in the unrotated basis).
  thread_local std::vector<float> coef_buffer;
  const float* coef = nullptr;
  if (kv.k_whitening != nullptr) {
    KVS_CHECK(kv.rope_table != nullptr && kv.n_rot > 0 && kv.n_rot <= shape.head_dim_k &&
              shape.head_dim_k <= kMaxWhitenedHeadDim && kv.k_offset == nullptr);
  }
  if (kv.k_offset != nullptr) {
    KVS_CHECK(kv.rope_table != nullptr && kv.n_rot > 0 && kv.n_rot <= shape.head_dim_k);
    coef_buffer.resize(static_cast<size_t>(n_queries) * kv.n_rot);
    for (int j = 0; j < n_queries; ++j) {
      OffsetCoefficients(kv, q_in[j], coef_buffer.data() + static_cast<size_t>(j) * kv.n_rot);
    }
    coef = coef_buffer.data();
  }
  // Rotated keys need the queries in the same basis (q.k is unchanged by the rotation).
  thread_local std::vector<float> q_rotated;
  thread_local std::vector<const float*> q_pointers;
  const float* const* q = q_in;
  if (KvTypeIsRotated(kv.k_type) && kv.k_whitening == nullptr) {
    const int32_t hk = shape.head_dim_k;
    q_rotated.resize(static_cast<size_t>(n_queries) * hk);
    q_pointers.resize(n_queries);
    for (int j = 0; j < n_queries; ++j) {
      float* r = q_rotated.data() + static_cast<size_t>(j) * hk;
      std::copy(q_in[j], q_in[j] + hk, r);
      RotateForward(r, hk);
      q_pointers[j] = r;
    }
    q = q_pointers.data();
  }
  for (int i = 0; i < n_queries; i += kWalkQueries) {
    const int n = std::min(kWalkQueries, n_queries - i);
    WalkFor(kv, n)(shape, kv, q + i, coef ? coef + static_cast<size_t>(i) * kv.n_rot : nullptr,
                   n_keys + i, n, out + i, o);
  }
  // Values stored rotated give a rotated weighted sum: rotate it back.
  if (KvTypeIsRotated(kv.v_type)) {
    for (int j = 0; j < n_queries; ++j) RotateBack(out[j], shape.head_dim_v);
  }
}

namespace {

// Query q's softmax over its n_keys keys, in double, by the head's key coding.
std::vector<double> SoftmaxReference(const AttentionShape& shape, const KvHeadView& kv,
                                     const float* q, int32_t n_keys) {
  KVS_CHECK(n_keys >= 1);
  const int32_t hk = shape.head_dim_k;
  std::vector<float> qi(q, q + hk), coef(kv.n_rot);
  if (kv.k_offset != nullptr) OffsetCoefficients(kv, q, coef.data());
  const bool whitened = kv.k_whitening != nullptr;
  if (KvTypeIsRotated(kv.k_type) && !whitened) RotateForward(qi.data(), hk);
  std::vector<double> s(static_cast<size_t>(n_keys));
  std::vector<float> key(hk);
  for (int32_t j = 0; j < n_keys; ++j) {
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
                     const int32_t* n_keys, int n_queries, float* const* out) {
  const int32_t hv = shape.head_dim_v;
  for (int i = 0; i < n_queries; ++i) {
    const std::vector<double> p = SoftmaxReference(shape, kv, q[i], n_keys[i]);
    for (int32_t d = 0; d < hv; ++d) {
      double acc = 0.0;
      for (int32_t j = 0; j < n_keys[i]; ++j) {
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
