// One KV head's blocks for kernel tests: a pool with three spare blocks the head does not use,
// every byte 0xff (NaN in the float types, so a kernel that reads a block it should not shows
// it), and the head's n_written positions in shuffled blocks (tables are not in pool order).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/attention.h"

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

}  // namespace kvs::testing
