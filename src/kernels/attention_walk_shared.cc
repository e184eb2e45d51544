// The parts of the attention walks shared by every instruction-set level, and WalkFor's
// dispatch to the level in force.
#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/attention_walk.h"
#include "kernels/isa_dispatch.h"
#include "kernels/kv_quant.h"
#include "kernels/ops.h"

namespace kvs::attention_internal {

int32_t MaxKeys(const int32_t* n_keys, int n) {
  int32_t m = 0;
  for (int i = 0; i < n; ++i) {
    KVS_CHECK(n_keys[i] >= 1);
    m = std::max(m, n_keys[i]);
  }
  return m;
}

void CheckKeyRanges(const int32_t* n_keys, const int32_t* first_key, int n) {
  if (first_key == nullptr) return;
  for (int i = 0; i < n; ++i) KVS_CHECK(first_key[i] >= 0 && first_key[i] < n_keys[i]);
}

int32_t MinFirstKey(const int32_t* first_key, int n) {
  if (first_key == nullptr) return 0;
  int32_t m = first_key[0];
  for (int i = 0; i < n; ++i) {
    KVS_CHECK(first_key[i] >= 0);
    m = std::min(m, first_key[i]);
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

WalkFn WalkFor(const KvHeadView& kv, int n) {
  KVS_DISPATCH(WalkFor(kv, n));
}

}  // namespace kvs::attention_internal
