// The compute-peak loops (`bench compute`) against their scalar twins: the vector loops do the
// multiply-adds they are counted for.
#include "kernels/compute_peak.h"

#include <gtest/gtest.h>

namespace kvs {
namespace {

TEST(ComputePeak, Int8LoopMatchesItsScalarTwin) {
  for (const uint32_t seed : {0u, 1u, 77u, 4096u}) {
    for (const int64_t iterations : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{1000}}) {
      EXPECT_EQ(Int8MacLoop(iterations, seed), Int8MacLoopScalar(iterations, seed))
          << "seed " << seed << ", " << iterations << " iterations";
    }
  }
  // Enough iterations that the int32 lanes wrap, as vpdpbusd's do.
  EXPECT_EQ(Int8MacLoop(100000, 5), Int8MacLoopScalar(100000, 5));
  EXPECT_NE(Int8MacLoop(10, 5), Int8MacLoop(11, 5));
}

TEST(ComputePeak, F32LoopMatchesItsScalarTwinBitForBit) {
  for (const uint32_t seed : {0u, 3u, 1000u}) {
    for (const int64_t iterations : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{500}}) {
      EXPECT_EQ(F32MacLoop(iterations, seed), F32MacLoopScalar(iterations, seed))
          << "seed " << seed << ", " << iterations << " iterations";
    }
  }
  EXPECT_NE(F32MacLoop(10, 3), F32MacLoop(11, 3));
}

}  // namespace
}  // namespace kvs
