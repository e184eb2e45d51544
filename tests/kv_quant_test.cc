// KV cache types: quantize/dequantize of every type, the rotation, and attention over every K/V
// type pair against the scalar twin and against f32 attention over the unquantized data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_layer.h"
#include "kernels/kv_quant.h"
#include "kernels/kv_types.h"
#include "tensor/dtype.h"
#include "testing/random.h"

namespace kvs {
namespace {

std::string Name(KvType t) {
  return std::string(KvTypeName(t));
}

// Relative RMS error each type may make on a Gaussian head vector with one outlier dim (as keys
// have), stored and read back (through the rotation for turbo types). The bounds sit about 1.5x
// above what the codes do: 8-bit ~1-1.6%, 4-bit ~10%, 3-bit ~18%.
double RoundTripBound(KvType t) {
  switch (t) {
    case KvType::kF32:
      return 1e-7;
    case KvType::kF16:
      return 1e-3;
    case KvType::kBF16:
      return 5e-3;
    case KvType::kQ8_0:
      return 0.015;
    case KvType::kInt8:  // one scale for the whole vector, outlier included
      return 0.025;
    case KvType::kFp8:
      return 0.05;
    case KvType::kQ4_0:
      return 0.2;
    case KvType::kTurbo4:
      return 0.15;
    case KvType::kTurbo3:
      return 0.25;
  }
  return 0;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += static_cast<double>(a[i]) * a[i];
  }
  return std::sqrt(num / den);
}

TEST(KvTypes, NamesParseAndBits) {
  for (KvType t : kAllKvTypes) {
    auto parsed = ParseKvType(Name(t));
    ASSERT_TRUE(parsed.ok()) << Name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(*ParseKvType("Q8_0"), KvType::kQ8_0);
  auto bad = ParseKvType("q5_9");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("turbo3"), std::string::npos) << "the error lists the valid types";
  // Bits per element, scales included, at head_dim 64 and 8.
  EXPECT_DOUBLE_EQ(KvBitsPerElement(KvType::kF16, 64), 16.0);
  EXPECT_DOUBLE_EQ(KvBitsPerElement(KvType::kQ8_0, 64), 8.5);
  EXPECT_DOUBLE_EQ(KvBitsPerElement(KvType::kQ4_0, 64), 4.5);
  EXPECT_DOUBLE_EQ(KvBitsPerElement(KvType::kInt8, 64), 8.25);
  EXPECT_DOUBLE_EQ(KvBitsPerElement(KvType::kTurbo4, 64), 4.5);
  EXPECT_DOUBLE_EQ(KvBitsPerElement(KvType::kTurbo3, 64), 3.5);
  EXPECT_DOUBLE_EQ(KvBitsPerElement(KvType::kTurbo3, 8), 5.0);
  EXPECT_TRUE(ValidateKvType(KvType::kQ4_0, 8).ok());
  EXPECT_FALSE(ValidateKvType(KvType::kQ4_0, 12).ok());
  EXPECT_TRUE(ValidateKvType(KvType::kF16, 12).ok());
}

TEST(KvQuant, E4m3RoundTripsEveryCode) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7f) == 0x7f) continue;  // NaN codes are never written
    const float x = E4m3ToF32(static_cast<uint8_t>(b));
    if (x == 0) continue;  // +0 and -0
    EXPECT_EQ(F32ToE4m3(x), b) << x;
  }
  EXPECT_EQ(E4m3ToF32(F32ToE4m3(448.0f)), 448.0f);
  EXPECT_EQ(E4m3ToF32(F32ToE4m3(1000.0f)), 448.0f);  // saturates
  EXPECT_NEAR(E4m3ToF32(F32ToE4m3(0.3f)), 0.3f, 0.3f / 16);
}

TEST(KvQuant, RotationIsOrthogonal) {
  for (int32_t n : {8, 16, 64, 80, 96, 128, 256}) {
    const std::vector<float> q = testing::GaussianVector(n, 1), k = testing::GaussianVector(n, 2);
    std::vector<float> qr = q, kr = k;
    RotateForward(qr.data(), n);
    RotateForward(kr.data(), n);
    double dot = 0, dot_r = 0;
    for (int32_t i = 0; i < n; ++i) {
      dot += static_cast<double>(q[i]) * k[i];
      dot_r += static_cast<double>(qr[i]) * kr[i];
    }
    EXPECT_NEAR(dot_r, dot, 1e-5 * n) << "n " << n;
    EXPECT_GT(RelativeError(q, qr), 0.5) << "the rotation must actually move the vector";
    RotateBack(qr.data(), n);
    EXPECT_LT(RelativeError(q, qr), 1e-6) << "n " << n;
  }
}

TEST(KvQuant, RotationSpreadsAnOutlier) {
  std::vector<float> x(64, 0.0f);
  x[5] = 10.0f;
  RotateForward(x.data(), 64);
  for (float v : x) EXPECT_NEAR(std::fabs(v), 10.0f / 8, 1e-5);
}

// Every type, key and value layout, several head sizes and every position of a head block.
TEST(KvQuant, StoreLoadRoundTrip) {
  for (KvType t : kAllKvTypes) {
    for (int32_t n : {8, 24, 64, 80, 128}) {
      SCOPED_TRACE(Name(t) + " head_dim " + std::to_string(n));
      std::vector<uint8_t> kb(KvHeadBlockBytes(t, n), 0xAB), vb(KvHeadBlockBytes(t, n), 0xCD);
      std::vector<std::vector<float>> x(16);
      for (int32_t pos = 0; pos < 16; ++pos) {
        x[pos] = testing::GaussianVector(n, 100 * n + pos);
        x[pos][pos % n] *= 6.0f;  // an outlier dim
        StoreKey(t, kb.data(), n, pos, x[pos].data());
        StoreValue(t, vb.data(), n, pos, x[pos].data());
      }
      for (int32_t pos = 0; pos < 16; ++pos) {
        std::vector<float> k_back(n), v_back(n);
        for (int32_t d = 0; d < n; ++d) {
          k_back[d] = LoadKey(t, kb.data(), n, d, pos);
          v_back[d] = LoadValue(t, vb.data(), n, pos, d);
        }
        if (KvTypeIsRotated(t)) {
          RotateBack(k_back.data(), n);
          RotateBack(v_back.data(), n);
        }
        EXPECT_LT(RelativeError(x[pos], k_back), RoundTripBound(t)) << "key pos " << pos;
        EXPECT_EQ(k_back, v_back) << "keys and values code alike, pos " << pos;
      }
    }
  }
}

// f16 stores take the CPU's converter; each element must be the scalar F32ToF16's code, for
// normal, subnormal, overflowing and signed-zero values, whole 16-lane runs and tails alike.
TEST(KvQuant, F16StoresMatchTheScalarConversion) {
  const float specials[] = {
      0.0f,     -0.0f,    1.0f,           -2.5f,           65504.0f, 65519.0f,
      65520.0f, 1e6f,     -1e6f,          6.1e-5f,         6.0e-8f,  2.9e-8f,
      3.0e-8f,  -4.5e-6f, 1.00048828125f, 1.000732421875f, INFINITY, -INFINITY};
  for (int32_t n : {8, 24, 64, 72}) {
    SCOPED_TRACE("head_dim " + std::to_string(n));
    std::vector<uint8_t> kb(KvHeadBlockBytes(KvType::kF16, n)), vb(kb.size());
    std::vector<std::vector<float>> x(16);
    for (int32_t pos = 0; pos < 16; ++pos) {
      x[pos] = testing::GaussianVector(n, 7 * n + pos);
      for (int32_t d = 0; d < n; ++d) {
        if ((d + pos) % 3 == 0) x[pos][d] = specials[(d + pos) % std::size(specials)];
      }
      StoreKey(KvType::kF16, kb.data(), n, pos, x[pos].data());
      StoreValue(KvType::kF16, vb.data(), n, pos, x[pos].data());
    }
    for (int32_t pos = 0; pos < 16; ++pos) {
      for (int32_t d = 0; d < n; ++d) {
        const uint16_t want = F32ToF16(x[pos][d]);
        uint16_t k, v;
        std::memcpy(&k, kb.data() + 32 * d + 2 * pos, 2);
        std::memcpy(&v, vb.data() + KvValueRowBytes(KvType::kF16, n) * pos + 2 * d, 2);
        ASSERT_EQ(k, want) << "key pos " << pos << " dim " << d << " x " << x[pos][d];
        ASSERT_EQ(v, want) << "value pos " << pos << " dim " << d << " x " << x[pos][d];
      }
    }
  }
}

TEST(KvQuant, Turbo4BeatsQ4_0OnKeysWithUnevenChannels) {
  // Keys whose channels differ in scale (0.3x to 4x) from position to position alike. Both types
  // rotate them into near-Gaussian coordinates; there turbo4's Gaussian codebook and
  // error-minimising scale beat q4_0's uniform grid set by each group's extreme value.
  const int32_t n = 64;
  double err_q4 = 0, err_t4 = 0;
  for (int32_t pos = 0; pos < 64; ++pos) {
    std::vector<float> x = testing::GaussianVector(n, 7 + pos);
    for (int32_t d = 0; d < n; ++d) x[d] *= 0.3f + 3.7f * static_cast<float>((d * 37) % n) / n;
    for (KvType t : {KvType::kQ4_0, KvType::kTurbo4}) {
      std::vector<uint8_t> kb(KvHeadBlockBytes(t, n));
      StoreKey(t, kb.data(), n, pos % 16, x.data());
      std::vector<float> back(n);
      for (int32_t d = 0; d < n; ++d) back[d] = LoadKey(t, kb.data(), n, d, pos % 16);
      RotateBack(back.data(), n);
      (t == KvType::kQ4_0 ? err_q4 : err_t4) += RelativeError(x, back);
    }
  }
  EXPECT_LT(err_t4, 0.95 * err_q4);  // about 0.92: 20% less squared error
}

}  // namespace
}  // namespace kvs
