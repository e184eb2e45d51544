// Reproducible test data shared by the kernel tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace kvs::testing {

// n samples of N(0, sigma^2) from a fixed seed: the same vector on every run and machine.
inline std::vector<float> GaussianVector(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

}  // namespace kvs::testing
