// Inside the attention kernel (attention.h): the walk of query tiles over a range of key blocks,
// leaving each query's unnormalised partial state, and what the walks and the reference share.
// Attend and AttendPartition (attention.cc) drive the walks and merge their partial states.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/attention.h"
#include "kernels/isa_dispatch.h"

namespace kvs::attention_internal {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Queries of one KV head that walk its key blocks together (attention.h).
inline constexpr int kWalkQueries = 32;

// Largest of n_keys[0, n) (each >= 1).
int32_t MaxKeys(const int32_t* n_keys, int n);
// Query i's first key (0 without a window: first_key null), and the smallest of n queries'.
inline int32_t FirstKey(const int32_t* first_key, int i) {
  return first_key ? first_key[i] : 0;
}
int32_t MinFirstKey(const int32_t* first_key, int n);
// Checks 0 <= first_key[i] < n_keys[i] (an empty window would have no softmax).
void CheckKeyRanges(const int32_t* n_keys, const int32_t* first_key, int n);

// Per query, the coefficients of q·R(p)·m in the RoPE table's rows (kv.k_offset set): for each
// rotated pair (a, b) q_a m_a + q_b m_b on its cos row and q_b m_a - q_a m_b on its sin row.
void OffsetCoefficients(const KvHeadView& kv, const float* q, float* coef);
// q·R(p)·m for key position pos, from the query's coefficients.
double OffsetScore(const KvHeadView& kv, const float* coef, int32_t pos);
// Key j of a head stored whitened (key_whitening.h), as the model wrote it.
void LoadWhitenedKey(const KvHeadView& kv, int32_t hk, int32_t j, float* key);

// One KV head's queries: q[n] in the basis its keys are stored in (rotated types: rotated),
// coef[n][n_rot] when kv.k_offset is set (else null).
struct WalkHead {
  const KvHeadView* kv = nullptr;
  const float* const* q = nullptr;
  const float* coef = nullptr;
};

// Query i of head h (row h * n + i) over one range of keys: o[hv_pad] = sum_j exp(s_j - m) v_j,
// m = max_j s_j, l = sum_j exp(s_j - m) (s: the scaled scores). A query without keys in the
// range has m = -inf, l = 0, o = 0.
struct Partials {
  float* o = nullptr;  // [rows][hv_pad]
  float* m = nullptr;  // [rows]
  float* l = nullptr;  // [rows]
};

// Walks the queries of n_heads heads (n <= kWalkQueries each; query i of every head sees keys
// [FirstKey(first_key, i), n_keys[i])) over key blocks [b0, b1), the heads' tiles side by side
// block by block, so that heads whose blocks are adjacent in memory are read as one stream.
// Blocks before the smallest first key's are not read.
using WalkFn = void (*)(const AttentionShape& shape, const WalkHead* heads, int n_heads,
                        const int32_t* n_keys, const int32_t* first_key, int n, int32_t b0,
                        int32_t b1, const Partials& out);
// The walk for the heads' key coding (the first head's; all heads share it) and for n queries.
WalkFn WalkFor(const KvHeadView& kv, int n);

// WalkFor of each instruction-set level (attention_walk.cc, compiled once per level).
#define KVS_DECLARE_WALK_LEVEL(ns)             \
  namespace ns {                               \
  WalkFn WalkFor(const KvHeadView& kv, int n); \
  }
KVS_FOR_EACH_ISA_NAMESPACE(KVS_DECLARE_WALK_LEVEL)
#undef KVS_DECLARE_WALK_LEVEL

}  // namespace kvs::attention_internal
