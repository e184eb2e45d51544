// Small int-list helpers for tests that spell out exact position and block lists.
#pragma once

#include <cstdint>
#include <vector>

namespace kvs::testing {

inline std::vector<int32_t> Range(int32_t from, int32_t to) {  // [from, to)
  std::vector<int32_t> out;
  for (int32_t i = from; i < to; ++i) out.push_back(i);
  return out;
}

inline std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace kvs::testing
