// One KV head's blocks for kernel tests: a pool with three spare blocks the head does not use,
// every byte 0xff (NaN in the float types, so a kernel that reads a block it should not shows
// it), and the head's n_written positions in shuffled blocks (tables are not in pool order).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"

namespace kvs::testing {

// Sizes *k_pool and *v_pool for head blocks of k_bytes and v_bytes, fills them with 0xff, and
// returns the head's block ids (one per 16 positions), shuffled with rng.
inline std::vector<int32_t> ShuffledHeadPool(int32_t n_written, size_t k_bytes, size_t v_bytes,
                                             std::mt19937& rng, std::vector<uint8_t>* k_pool,
                                             std::vector<uint8_t>* v_pool) {
  const int32_t n_blocks = (n_written + kKvBlockTokens - 1) / kKvBlockTokens;
  const int32_t pool_blocks = n_blocks + 3;
  k_pool->assign(pool_blocks * k_bytes, 0xff);
  v_pool->assign(pool_blocks * v_bytes, 0xff);
  std::vector<int32_t> ids(pool_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(n_blocks);
  return ids;
}

// One KV head in a pool of blocks whose physical order is shuffled, as a paged cache's is, in
// any K/V types. Blocks the head does not use hold 0xff bytes (NaN in the float types): a kernel
// must never let them reach an output; `spare` names one. `keys`/`values` keep the unquantized
// data (N(0, 1), keys times key_scale).
struct TestKvHead {
  int32_t hk, hv;
  KvType k_type, v_type;
  std::vector<uint8_t> k_pool, v_pool;
  std::vector<int32_t> ids;
  int32_t spare = -1;
  std::vector<std::vector<float>> keys, values;  // [pos][dim]
  KvHeadView view;

  TestKvHead(int32_t hk_, int32_t hv_, int32_t n_written, uint32_t seed, float key_scale = 1.0f,
             KvType k_type_ = KvType::kF32, KvType v_type_ = KvType::kF32)
      : hk(hk_), hv(hv_), k_type(k_type_), v_type(v_type_) {
    const size_t k_bytes = KvHeadBlockBytes(k_type, hk), v_bytes = KvHeadBlockBytes(v_type, hv);
    std::mt19937 rng(seed);
    ids = ShuffledHeadPool(n_written, k_bytes, v_bytes, rng, &k_pool, &v_pool);
    for (int32_t b = 0; spare < 0; ++b) {
      if (std::find(ids.begin(), ids.end(), b) == ids.end()) spare = b;
    }
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int32_t pos = 0; pos < n_written; ++pos) {
      keys.emplace_back(hk);
      values.emplace_back(hv);
      for (float& x : keys.back()) x = key_scale * dist(rng);
      for (float& x : values.back()) x = dist(rng);
    }
    Rewrite();
    view = KvHeadView{k_pool.data(), v_pool.data(), k_bytes, v_bytes, ids.data(), k_type, v_type};
  }
  // Stores position pos's key and value into its block.
  void Store(int32_t pos, const float* k, const float* v) {
    const size_t block = static_cast<size_t>(ids[pos / kKvBlockTokens]);
    StoreKey(k_type, k_pool.data() + block * KvHeadBlockBytes(k_type, hk), hk, pos % kKvBlockTokens,
             k);
    StoreValue(v_type, v_pool.data() + block * KvHeadBlockBytes(v_type, hv), hv,
               pos % kKvBlockTokens, v);
  }
  // Stores keys/values (again) into the pool.
  void Rewrite() {
    for (int32_t pos = 0; pos < static_cast<int32_t>(keys.size()); ++pos) {
      Store(pos, keys[pos].data(), values[pos].data());
    }
  }
  AttentionShape shape() const {
    return AttentionShape{hk, hv, 1.0f / std::sqrt(static_cast<float>(hk))};
  }
};

}  // namespace kvs::testing
