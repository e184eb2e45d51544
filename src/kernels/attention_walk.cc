// The walks of attention_walk.h, once per instruction-set level: AVX-512 query tiles over key
// blocks in every KV type, or a portable key-by-key loop.
#include "kernels/attention_walk.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "kernels/kv_quant.h"

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

#if defined(KVS_ISA_AVX512)
#define KVS_ATTENTION_AVX512 1
#include "kernels/kv_codecs_avx512.h"
#endif

namespace kvs::attention_internal::KVS_ISA {

#if KVS_ATTENTION_AVX512

namespace {

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

// o[i] = alpha[i] * o[i] + sum_j p[i][j] * v[j] over value rows lo[i] <= j < rows[i] of a pair of
// blocks (rows 0..15 in vb[0], 16..31 in vb[1]; n_rows: the largest rows[i], vb[1] unread when
// n_rows <= 16; lo[i] > 0 for a sliding window's first pair, and n_rows for a query with no
// keys in the pair; vb[0] unread when every lo[i] >= 16), 64 output dims at a time, the
// accumulators kept in registers across both blocks. o rows are padded to hv_pad floats. Rows past
// a query's own are skipped, not added with weight 0: a value the type stores as Inf (an f16
// overflow) of a later key would make 0 * Inf = NaN for a query that never sees that key, and its
// output would then depend on the queries beside it. kWhole64: hv is a multiple of 64 (every head
// size the bench models have), so each pass takes four full vectors; kGrouped: the type has group
// scales. Both compile-time, so that the row loop is loads, widenings and FMAs with no lane masks
// or branches (the generic form spent more time on them than on the FMAs).
template <class Codec, int Q, bool kWhole64, bool kGrouped>
void AccumulateBlocks(KvType t, const uint8_t* const* vb, int32_t hv, int32_t group,
                      const float (*p)[32], const float* alpha, const int32_t* lo,
                      const int32_t* rows, int32_t n_rows, float* o, int32_t hv_pad) {
  const Codec codec = MakeCodec<Codec>(t);
  const size_t row_bytes = static_cast<size_t>(hv) * Codec::kBits / 8;
  const int32_t n_groups = kGrouped ? hv / group : 0;
  const int n_blocks = n_rows > kKvBlockTokens ? 2 : 1;
  // Rows before every query's first are not read (a window's first pair may start in a block no
  // query of the tile sees, which a sliding group may have freed).
  int32_t first_row = lo[0];
  for (int i = 1; i < Q; ++i) first_row = std::min(first_row, lo[i]);
  // The blocks' value scales [32 rows][n_groups], widened once (kScaleMul folded in).
  alignas(64) float scales[kGrouped ? 2 * 16 * 128 : 16];
  if constexpr (kGrouped) {
    for (int b = first_row / kKvBlockTokens; b < n_blocks; ++b) {
      for (int32_t i = 0; i < n_groups; ++i) {
        _mm512_store_ps(scales + 16 * (b * n_groups + i),
                        _mm512_mul_ps(simd::Halves16(vb[b] + 16 * row_bytes + 32 * i),
                                      _mm512_set1_ps(Codec::kScaleMul)));
      }
    }
  }
  // Rows every query sees take the unmasked FMAs; only a tile's last blocks (and a window's
  // first) have rows some of its queries must skip.
  int32_t all_live = n_rows, all_live_from = 0;
  for (int i = 0; i < Q; ++i) {
    all_live = std::min(all_live, rows[i]);
    all_live_from = std::max(all_live_from, lo[i]);
  }
  for (int32_t c0 = 0; c0 < hv; c0 += 64) {
    const int n_vec = kWhole64 ? 4 : std::min(4, (hv - c0 + 15) / 16);
    __m512 acc[Q][4];
    for (int i = 0; i < Q; ++i) {
      const __m512 a = _mm512_set1_ps(alpha[i]);
      for (int v = 0; v < 4; ++v) {
        if (v < n_vec) acc[i][v] = _mm512_mul_ps(a, _mm512_loadu_ps(o + i * hv_pad + c0 + 16 * v));
      }
    }
    for (int32_t j = first_row; j < n_rows; ++j) {
      const uint8_t* row = vb[j / kKvBlockTokens] + (j % kKvBlockTokens) * row_bytes;
      __m512 vr[4];
      for (int v = 0; v < 4; ++v) {
        if (v >= n_vec) continue;
        const int32_t c = c0 + 16 * v;
        vr[v] = codec.Values(row, c, kWhole64 ? 16 : std::min(16, hv - c));
        if constexpr (kGrouped) {
          vr[v] = _mm512_mul_ps(vr[v], ValueLaneScale(scales + j * n_groups, c, group, hv));
        }
      }
      if (j >= all_live_from && j < all_live) {  // every query sees this row: the plain FMAs
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
        const __mmask16 live = j >= lo[i] && j < rows[i] ? 0xffff : 0;
        for (int v = 0; v < 4; ++v) {
          if (v < n_vec) acc[i][v] = _mm512_mask3_fmadd_ps(pj, vr[v], acc[i][v], live);
        }
      }
    }
    for (int i = 0; i < Q; ++i) {
      for (int v = 0; v < 4; ++v) {
        if (v < n_vec) _mm512_storeu_ps(o + i * hv_pad + c0 + 16 * v, acc[i][v]);
      }
    }
  }
}

template <int Q>
using ScoreFn = void (*)(KvType, const uint8_t*, int32_t, int32_t, const float* const*, __m512*);
template <int Q>
using AccumulateFn = void (*)(KvType, const uint8_t* const*, int32_t, int32_t, const float (*)[32],
                              const float*, const int32_t*, const int32_t*, int32_t, float*,
                              int32_t);

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
AccumulateFn<Q> AccumulateFor(KvType t, int32_t hv) {
  const bool whole64 = hv % 64 == 0, grouped = KvGroupSize(t, hv) != 0;
  // AccumulateBlocks widens a block pair's scales into 2 x 16 x 128 floats.
  KVS_CHECK(!grouped || hv / KvGroupSize(t, hv) <= 128);
  return WithCodec(t, [&]<class C>(std::type_identity<C>) -> AccumulateFn<Q> {
    if (whole64) {
      return grouped ? &AccumulateBlocks<C, Q, true, true> : &AccumulateBlocks<C, Q, true, false>;
    }
    return grouped ? &AccumulateBlocks<C, Q, false, true> : &AccumulateBlocks<C, Q, false, false>;
  });
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
  // first_key: the tile's queries' first keys (null: 0).
  QueryTile(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
            const float* coef, const int32_t* n_keys, const int32_t* first_key, float* o)
      : shape_(shape),
        kv_(kv),
        q_(q),
        n_keys_(n_keys),
        first_key_(first_key),
        min_first_key_(MinFirstKey(first_key, Q)),
        o_(o),
        hv_pad_((shape.head_dim_v + 15) / 16 * 16),
        max_keys_(MaxKeys(n_keys, Q)),
        keys_(kv, shape.head_dim_k, coef),
        accumulate_(AccumulateFor<Q>(kv.v_type, shape.head_dim_v)),
        v_group_(KvGroupSize(kv.v_type, shape.head_dim_v)) {
    for (int i = 0; i < Q; ++i) {
      m_[i] = kNegInf;
      l_[i] = _mm512_setzero_ps();
    }
    std::fill(o, o + Q * hv_pad_, 0.0f);
  }

  int32_t n_blocks() const { return (max_keys_ + kKvBlockTokens - 1) / kKvBlockTokens; }

  // Folds in key blocks blk and blk + 1 (only blk when it is the tile's last or the range's,
  // end); blocks past the tile's keys are skipped, and so is blk when it lies wholly before
  // every query's first key (pairs stay at even blocks, so that a query's arithmetic does not
  // depend on the tile it is in). The softmax state moves once per pair: one
  // horizontal max per query for 32 keys, and the running sum kept as 16 lanes, added across only
  // at the end.
  void Pair(int32_t blk, int32_t end) {
    const int32_t nb = std::min(n_blocks(), end);
    if (blk >= nb) return;
    const int n = blk + 1 < nb ? 2 : 1;
    // A pair wholly before every query's window leaves the state as it is: not read at all.
    if (min_first_key_ >= (blk + n) * kKvBlockTokens) return;
    __m512 s_raw[2][Q];
    const bool read_first = min_first_key_ < (blk + 1) * kKvBlockTokens;
    if (read_first) {
      keys_.Score(blk, q_, s_raw[0]);
    } else {
      for (int i = 0; i < Q; ++i) s_raw[0][i] = _mm512_setzero_ps();  // masked off below
    }
    if (n == 2) {
      keys_.Score(blk + 1, q_, s_raw[1]);
    } else {
      for (int i = 0; i < Q; ++i) s_raw[1][i] = _mm512_setzero_ps();  // masked off below
    }
    // Online softmax: rescale what came before by exp(old max - new max).
    float alpha[Q];
    int32_t lo[Q], rows[Q];
    alignas(64) float p[Q][32];
    const int32_t key0 = blk * kKvBlockTokens;  // the pair's first key
    const __m512 scale = _mm512_set1_ps(shape_.scale), neg_inf = _mm512_set1_ps(kNegInf);
    for (int i = 0; i < Q; ++i) {
      // The query's keys in the pair: rows [lo, rows) of its 32.
      lo[i] = std::clamp(FirstKey(first_key_, i) - key0, 0, n * kKvBlockTokens);
      rows[i] = std::clamp(n_keys_[i] - key0, 0, n * kKvBlockTokens);
      if (rows[i] <= lo[i]) {  // none: no row of the pair is read for it
        lo[i] = n * kKvBlockTokens;
        rows[i] = 0;
        alpha[i] = 1.0f;
        _mm512_store_ps(p[i], _mm512_setzero_ps());
        _mm512_store_ps(p[i] + 16, _mm512_setzero_ps());
        continue;
      }
      const __mmask16 valid0 = FirstLanes(n_keys_[i] - key0) & ~FirstLanes(lo[i]);
      const __mmask16 valid1 = n == 2 ? FirstLanes(n_keys_[i] - key0 - kKvBlockTokens) &
                                            ~FirstLanes(lo[i] - kKvBlockTokens)
                                      : 0;
      const __m512 s0 = _mm512_mask_mov_ps(neg_inf, valid0, _mm512_mul_ps(s_raw[0][i], scale));
      const __m512 s1 = _mm512_mask_mov_ps(neg_inf, valid1, _mm512_mul_ps(s_raw[1][i], scale));
      const float m_new = std::max(m_[i], _mm512_reduce_max_ps(_mm512_max_ps(s0, s1)));
      // 0 on the first block (m = -inf); exactly 1, without the call, while the max holds.
      alpha[i] = m_new == m_[i] ? 1.0f : std::exp(m_[i] - m_new);
      const __m512 m = _mm512_set1_ps(m_new);
      const __m512 p0 = _mm512_maskz_mov_ps(valid0, simd::ExpNonPositive(_mm512_sub_ps(s0, m)));
      const __m512 p1 = _mm512_maskz_mov_ps(valid1, simd::ExpNonPositive(_mm512_sub_ps(s1, m)));
      l_[i] = _mm512_fmadd_ps(l_[i], _mm512_set1_ps(alpha[i]), _mm512_add_ps(p0, p1));
      m_[i] = m_new;
      _mm512_store_ps(p[i], p0);
      _mm512_store_ps(p[i] + 16, p1);
    }
    const int32_t n_rows = std::min(n * kKvBlockTokens, max_keys_ - key0);
    const uint8_t* vb[2] = {read_first ? ValueBlock(kv_, blk) : nullptr,
                            n == 2 ? ValueBlock(kv_, blk + 1) : nullptr};
    accumulate_(kv_.v_type, vb, shape_.head_dim_v, v_group_, p, alpha, lo, rows, n_rows, o_,
                hv_pad_);
  }

  // The partial state: m and l per query (o is already in place).
  void Finish(float* m, float* l) const {
    for (int i = 0; i < Q; ++i) {
      m[i] = m_[i];
      l[i] = _mm512_reduce_add_ps(l_[i]);
    }
  }

 private:
  const AttentionShape& shape_;
  const KvHeadView& kv_;
  const float* const* q_;
  const int32_t* n_keys_;
  const int32_t* first_key_;
  int32_t min_first_key_;
  float* o_;
  int32_t hv_pad_, max_keys_;
  KeyPath<Q> keys_;
  AccumulateFn<Q> accumulate_;
  int32_t v_group_;
  float m_[Q];
  __m512 l_[Q];  // the running sums, 16 lanes each
};

// Per head, tiles of four queries (then one of R < 4, when R > 0) walk the key blocks together:
// a block is fetched once and scored by every tile while it is in L1, so a sequence's k + 1
// verification tokens (k + 1 tiles per KV head) read its KV once, not k + 1 times. The heads'
// tiles go side by side, block by block, as many heads at a time as kWalkTiles allows.
constexpr int kWalkTiles = kWalkQueries / 4;

template <template <int> class KeyPath, int R>
void AttendWalk(const AttentionShape& shape, const WalkHead* heads, int n_heads,
                const int32_t* n_keys, const int32_t* first_key, int n, int32_t b0, int32_t b1,
                const Partials& out) {
  const int32_t hv_pad = (shape.head_dim_v + 15) / 16 * 16;
  const int n4 = n / 4;
  const int heads_at_once = std::max(1, kWalkTiles / (n4 + (R > 0 ? 1 : 0)));
  const size_t k_bytes = KvHeadBlockBytes(heads[0].kv->k_type, shape.head_dim_k);
  const size_t v_bytes = KvHeadBlockBytes(heads[0].kv->v_type, shape.head_dim_v);
  for (int h0 = 0; h0 < n_heads; h0 += heads_at_once) {
    const int hn = std::min(heads_at_once, n_heads - h0);
    std::array<std::optional<QueryTile<4, KeyPath>>, kWalkTiles> tiles;
    std::array<std::optional<QueryTile<R == 0 ? 1 : R, KeyPath>>, kWalkTiles> rests;
    int32_t n_blocks = 0;
    for (int h = 0; h < hn; ++h) {
      const WalkHead& head = heads[h0 + h];
      const size_t row0 = static_cast<size_t>(h0 + h) * n;
      auto coef_of = [&](int first) {
        return head.coef ? head.coef + static_cast<size_t>(first) * head.kv->n_rot : nullptr;
      };
      auto first_of = [&](int first) { return first_key ? first_key + first : nullptr; };
      for (int t = 0; t < n4; ++t) {
        auto& tile = tiles[h * n4 + t].emplace(shape, *head.kv, head.q + 4 * t, coef_of(4 * t),
                                               n_keys + 4 * t, first_of(4 * t),
                                               out.o + (row0 + 4 * t) * hv_pad);
        n_blocks = std::max(n_blocks, tile.n_blocks());
      }
      if constexpr (R > 0) {
        auto& rest =
            rests[h].emplace(shape, *head.kv, head.q + 4 * n4, coef_of(4 * n4), n_keys + 4 * n4,
                             first_of(4 * n4), out.o + (row0 + 4 * n4) * hv_pad);
        n_blocks = std::max(n_blocks, rest.n_blocks());
      }
    }
    const int32_t end = std::min(n_blocks, b1);
    // From the pair (at an even block, as b0 is) that holds the first key any query sees.
    const int32_t start = std::max(b0, MinFirstKey(first_key, n) / kKvBlockTokens / 2 * 2);
    for (int32_t blk = start; blk < end; blk += 2) {
      for (int h = 0; h < hn; ++h) {
        // A head's blocks lie n_head_kv head blocks apart at least (pages apart, in table
        // order): fetch its pair after next ahead of use, head by head, so that the prefetches
        // spread over the work instead of queueing up in a burst.
        const KvHeadView& kv = *heads[h0 + h].kv;
        for (int32_t ahead = blk + kPrefetchBlocks;
             ahead < std::min(blk + kPrefetchBlocks + 2, end); ++ahead) {
          PrefetchBytes(KeyBlock(kv, ahead), k_bytes);
          PrefetchBytes(ValueBlock(kv, ahead), v_bytes);
        }
        for (int t = 0; t < n4; ++t) tiles[h * n4 + t]->Pair(blk, end);
        if constexpr (R > 0) rests[h]->Pair(blk, end);
      }
    }
    for (int h = 0; h < hn; ++h) {
      const size_t row0 = static_cast<size_t>(h0 + h) * n;
      for (int t = 0; t < n4; ++t) {
        tiles[h * n4 + t]->Finish(out.m + row0 + 4 * t, out.l + row0 + 4 * t);
      }
      if constexpr (R > 0) rests[h]->Finish(out.m + row0 + 4 * n4, out.l + row0 + 4 * n4);
    }
  }
}

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

}  // namespace

WalkFn WalkFor(const KvHeadView& kv, int n) {
  if (kv.k_whitening != nullptr) return WalkWithRest<WhitenedKeys>(n % 4);
  if (kv.k_offset != nullptr) return WalkWithRest<RopeOffsetKeys>(n % 4);
  return WalkWithRest<PlainKeys>(n % 4);
}

#else  // portable: the same online softmax, one query and one key at a time

namespace {

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

// Each query of each head on its own, key by key, over keys [16 * b0, 16 * b1): the scalar
// twin (the AVX2 level walks blocks instead, attention_walk_avx2.inc).
[[maybe_unused]] void AttendEach(const AttentionShape& shape, const WalkHead* heads, int n_heads,
                                 const int32_t* n_keys, const int32_t* first_key, int n, int32_t b0,
                                 int32_t b1, const Partials& out) {
  const int32_t hk = shape.head_dim_k, hv = shape.head_dim_v;
  const int32_t hv_pad = (hv + 15) / 16 * 16;
  for (int h = 0; h < n_heads; ++h) {
    const KvHeadView& kv = *heads[h].kv;
    for (int i = 0; i < n; ++i) {
      const size_t row = static_cast<size_t>(h) * n + i;
      float* o = out.o + row * hv_pad;
      float m = kNegInf, l = 0.0f;
      std::fill(o, o + hv_pad, 0.0f);
      const float* coef = heads[h].coef ? heads[h].coef + i * kv.n_rot : nullptr;
      const int32_t end = std::min(n_keys[i], b1 * kKvBlockTokens);
      for (int32_t j = std::max(b0 * kKvBlockTokens, FirstKey(first_key, i)); j < end; ++j) {
        const uint8_t* vb = ValueBlock(kv, j / kKvBlockTokens);
        const float s = PortableScore(kv, hk, heads[h].q[i], coef, j) * shape.scale;
        const float m_new = std::max(m, s);
        const float alpha = std::exp(m - m_new), pj = std::exp(s - m_new);
        for (int32_t d = 0; d < hv; ++d) {
          o[d] = o[d] * alpha + pj * LoadValue(kv.v_type, vb, hv, j % kKvBlockTokens, d);
        }
        l = l * alpha + pj;
        m = m_new;
      }
      out.m[row] = m;
      out.l[row] = l;
    }
  }
}

}  // namespace

#if defined(KVS_ISA_AVX2)

namespace {
#include "kernels/attention_walk_avx2.inc"
}  // namespace

WalkFn WalkFor(const KvHeadView&, int) {
  return &AttendBlocks;
}

#else

WalkFn WalkFor(const KvHeadView&, int) {
  return &AttendEach;
}

#endif

#endif

}  // namespace kvs::attention_internal::KVS_ISA

#include "kernels/isa_end.h"
