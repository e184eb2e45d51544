// Weight formats and MatMul against their scalar twins.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/matmul_internal.h"
#include "kernels/repack.h"
#include "tensor/dtype.h"
#include "tensor/kquants.h"
#include "tensor/quantize.h"
#include "testing/random.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace kvs {
namespace {

float Bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

[[maybe_unused]] uint32_t BitsOf(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// ---------------------------------------------------------------------------------------------
// F16 / BF16 conversions

TEST(F16, DecodesSpecialValues) {
  EXPECT_EQ(F16ToF32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
}

TEST(F16, EncodesWithRoundToNearestEven) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // halfway, rounds to even = infinity
  EXPECT_EQ(F32ToF16(1e10f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xfc00);
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, even stays down
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, odd goes up
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  // Subnormal results, including the tie at half the smallest subnormal.
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(F32ToF16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 units: tie to even
  EXPECT_EQ(F32ToF16(std::ldexp(1023.5f, -24)), 0x0400);  // rounds up into the normals
  EXPECT_EQ(F32ToF16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  uint16_t nan = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  // A signalling NaN whose payload lives only in the low bits must stay a NaN.
  EXPECT_NE(F32ToF16(Bits(0x7f800001u)) & 0x03ff, 0);
}

TEST(F16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
    } else {
      ASSERT_EQ(F32ToF16(f), h) << h;
    }
  }
}

#if defined(__F16C__)
TEST(F16, MatchesHardwareConversion) {
  std::mt19937 rng(7);
  for (int i = 0; i < 1 << 20; ++i) {
    // Random bit patterns over all exponents, and values dense around the half range.
    float f = (i & 1) ? Bits(rng())
                      : std::ldexp(static_cast<float>(rng() % (1u << 24)),
                                   static_cast<int>(rng() % 48) - 64);
    if (std::isnan(f)) continue;
    uint16_t hw = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(F32ToF16(f), hw) << std::hexfloat << f;
    ASSERT_EQ(BitsOf(F16ToF32(hw)), BitsOf(_cvtsh_ss(hw))) << hw;
  }
}
#endif

TEST(BF16, ConvertsWithRoundToNearestEven) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_EQ(BF16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(F32ToBF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, even stays down
  EXPECT_EQ(F32ToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, odd goes up
  EXPECT_EQ(F32ToBF16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to infinity
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000);
  // Subnormals keep their bits (bf16 has the f32 exponent range).
  EXPECT_EQ(F32ToBF16(Bits(0x00010000u)), 0x0001);
  EXPECT_EQ(BF16ToF32(0x0001), Bits(0x00010000u));
  EXPECT_EQ(F32ToBF16(Bits(0x00008000u)), 0x0000);  // tie to even
  EXPECT_EQ(F32ToBF16(Bits(0x00018000u)), 0x0002);
  // NaNs stay NaN even when the payload is only in the dropped bits.
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(Bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    float f = BF16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBF16(f), h) << h;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Row quantization

std::vector<float> RoundTrip(DType t, const std::vector<float>& x) {
  std::vector<uint8_t> q(RowBytes(t, x.size()));
  QuantizeRow(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
  std::vector<float> y(x.size());
  DequantizeRow(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
  return y;
}

TEST(Quantize, FloatTypesRoundTripWithinTheirPrecision) {
  std::vector<float> x = testing::GaussianVector(4096, 1, 3.0f);
  EXPECT_EQ(RoundTrip(DType::kF32, x), x);
  std::vector<float> h = RoundTrip(DType::kF16, x), b = RoundTrip(DType::kBF16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    // Half a unit in the last place; f16 subnormals (below 2^-14) have a fixed absolute step.
    EXPECT_LE(std::fabs(h[i] - x[i]), std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f)) << i;
    EXPECT_LE(std::fabs(b[i] - x[i]), std::fabs(x[i]) * 0x1p-8f) << i;
  }
}

TEST(Quantize, Q8_0KnownBlock) {
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) * 4.0f;  // -64 .. 60
  x[5] = 127.0f;                                                          // amax -> d = 1
  x[6] = 2.5f;                                                            // ties go away
  x[7] = -2.5f;
  BlockQ8_0 b;
  QuantizeRow(DType::kQ8_0, x.data(), &b, 32);
  EXPECT_EQ(F16ToF32(b.d), 1.0f);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(b.qs[j], static_cast<int8_t>(std::round(x[j]))) << j;
  }
  EXPECT_EQ(b.qs[6], 3);
  EXPECT_EQ(b.qs[7], -3);
}

TEST(Quantize, Q4_0KnownBlock) {
  // The largest magnitude is negative: d = -16 / -8 = 2 and it maps to code 0.
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>((j % 15) - 7) * 2.0f;  // -14 .. 14
  x[3] = -16.0f;
  x[20] = 15.0f;  // 7.5 units: rounds half up to 16 -> clamped to 15
  BlockQ4_0 b;
  QuantizeRow(DType::kQ4_0, x.data(), &b, 32);
  EXPECT_EQ(F16ToF32(b.d), 2.0f);
  EXPECT_EQ(b.qs[3] & 0x0f, 0);
  EXPECT_EQ(b.qs[4] >> 4, 15);  // value 20 is the high nibble of byte 4
  for (int j = 0; j < 32; ++j) {
    int code = j < 16 ? (b.qs[j] & 0x0f) : (b.qs[j - 16] >> 4);
    int want = std::min(15, static_cast<int>(x[j] / 2.0f + 8.5f));
    EXPECT_EQ(code, want) << j;
  }
  // A positive extreme gives a negative scale, and keeps the sign right on the way back.
  for (float& v : x) v = -v;
  std::vector<float> y = RoundTrip(DType::kQ4_0, x);
  EXPECT_EQ(y[3], 16.0f);
  EXPECT_EQ(y[0], x[0]);
}

TEST(Quantize, ZeroBlocksStayZero) {
  std::vector<float> x(64, 0.0f);
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    std::vector<float> y = RoundTrip(t, x);
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
  BlockQ4_0 b;
  QuantizeRow(DType::kQ4_0, x.data(), &b, 32);
  EXPECT_EQ(F16ToF32(b.d), 0.0f);  // -0: the scale is max / -8
  for (uint8_t q : b.qs) EXPECT_EQ(q, 0x88);
}

TEST(Quantize, BlockTypesRoundTripWithinHalfAStep) {
  // Blocks of very different magnitudes, including one far below the rest.
  std::vector<float> x = testing::GaussianVector(32 * 64, 2);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, static_cast<int>(i / 32 % 9) - 4);
  for (size_t i = 32 * 7; i < 32 * 8; ++i) x[i] *= 1e-3f;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    std::vector<float> y = RoundTrip(t, x);
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      // Half a step, plus |q| times the error of the scale's f16 rounding (large where the
      // scale is an f16 subnormal). Q4_0 clamps the far side of its extreme to 7 steps, so its
      // worst case is a whole step.
      const bool q8 = t == DType::kQ8_0;
      const float step = q8 ? amax / 127.0f : amax / 8.0f;
      const float scale_err = std::fabs(F16ToF32(F32ToF16(step)) - step);
      const float bound = q8 ? step * 0.5f + 127 * scale_err : step + 8 * scale_err;
      double sum_err = 0.0;
      for (int j = 0; j < 32; ++j) {
        float err = std::fabs(y[b * 32 + j] - x[b * 32 + j]);
        ASSERT_LE(err, bound) << "block " << b << " value " << j;
        sum_err += err;
      }
      // Most values are interior and round to within half a step.
      EXPECT_LE(sum_err / 32, 0.35 * step + (q8 ? 64 : 4) * scale_err) << "block " << b;
    }
  }
}

TEST(Quantize, MatrixQuantizesEachRow) {
  const int64_t rows = 3, cols = 96;
  std::vector<float> x = testing::GaussianVector(rows * cols, 3);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    std::vector<uint8_t> m = QuantizeMatrix(t, x.data(), rows, cols);
    const size_t rb = RowBytes(t, cols);
    ASSERT_EQ(m.size(), rb * rows);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint8_t> row(rb);
      QuantizeRow(t, x.data() + r * cols, row.data(), cols);
      EXPECT_EQ(0, std::memcmp(row.data(), m.data() + r * rb, rb)) << DTypeName(t) << " row " << r;
    }
  }
}

// The activations' Q8_0 quantization of the level in force (isa_level_test runs this file at
// every level) gives QuantizeRow(kQ8_0)'s codes and scale bit for bit, ties included: values
// exactly halfway between two codes, zeros, one signed extreme, tiny and huge magnitudes.
TEST(Quantize, ActivationsOfTheLevelInForceMatchTheQ8_0Row) {
  const int64_t cols = 32 * 12;
  std::vector<float> x = testing::GaussianVector(cols, 11);
  for (int j = 0; j < 32; ++j) {
    x[32 + j] = (j - 16) + 0.5f;                   // block 1: amax 16.5, ties at many codes
    x[64 + j] = 0.0f;                              // block 2: all zero
    x[96 + j] = j == 7 ? -3.0f : 0.25f * (j % 5);  // block 3: one negative extreme
    x[128 + j] *= 1e-30f;                          // block 4: tiny
    x[160 + j] *= 1e30f;                           // block 5: huge
    x[192 + j] = 127.0f * (j % 2 ? 1 : -1) * (j / 32.0f);
    // Not finite after scaling: code 0 everywhere (a NaN, an Inf, 1 / d overflowing).
    x[256 + j] = 0.1f * (j % 7 - 3);
    x[288 + j] = j == 3 ? -std::numeric_limits<float>::infinity() : 0.5f;
    x[320 + j] = 1e-37f * (j - 9);
    x[352 + j] = std::numeric_limits<float>::quiet_NaN();
  }
  x[256 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<BlockQ8_0> want(cols / 32);
  QuantizeRow(DType::kQ8_0, x.data(), want.data(), cols);
  for (int32_t offset : {0, 8, 128}) {
    std::vector<matmul_internal::ActBlock> got(cols / 32);
    matmul_internal::QuantizeActivationsFlat(x.data(), cols, offset, got.data());
    for (int64_t b = 0; b < cols / 32; ++b) {
      EXPECT_EQ(0, std::memcmp(got[b].qs, want[b].qs, 32)) << "block " << b;
      const float want_scale = F16ToF32(want[b].d);
      EXPECT_TRUE(got[b].scale == want_scale ||
                  (std::isnan(got[b].scale) && std::isnan(want_scale)))
          << "block " << b << ": " << got[b].scale << " vs " << want_scale;
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) sum += want[b].qs[j];
      EXPECT_EQ(got[b].bias, -offset * sum) << "block " << b << " offset " << offset;
    }
  }
}

// The same for the K-quant kernels' 256-value activations (QuantizeActivationsQ8K): the level in
// force against the scalar level's, every byte of every super-block.
TEST(Quantize, Q8KActivationsOfTheLevelInForceMatchTheScalarLevel) {
  const int64_t cols = 256 * 9;
  std::vector<float> x = testing::GaussianVector(cols, 12);
  for (int j = 0; j < 256; ++j) {
    x[256 + j] = (j - 128) * 0.5f;                                          // ties after scaling
    x[512 + j] = 0.0f;                                                      // all zero
    x[768 + j] = j == 9 || j == 200 ? (j == 9 ? 4.0f : -4.0f) : 0.01f * j;  // equal extremes
    x[1024 + j] *= 1e-30f;
    x[1536 + j] = 0.1f * (j % 7 - 3);  // with one NaN below
    x[1792 + j] = j == 40 ? std::numeric_limits<float>::infinity() : 0.25f;
    x[2048 + j] = 1e-37f * (j - 100);  // -127 / max overflows
  }
  x[1536 + 5] = std::numeric_limits<float>::quiet_NaN();
  std::vector<matmul_internal::KAct256> got(cols / 256), want(cols / 256);
  matmul_internal::QuantizeActivationsQ8K(x.data(), cols, got.data());
  matmul_internal::scalar::QuantizeActivationsQ8K(x.data(), cols, want.data());
  for (int64_t b = 0; b < cols / 256; ++b) {
    // Bytes, so that a NaN scale compares equal to itself.
    EXPECT_EQ(0, std::memcmp(&got[b], &want[b], sizeof(got[b]))) << "super-block " << b;
    for (int i = 0; i < 256; ++i) {
      if (!std::isfinite(x[256 * b + i])) {
        EXPECT_EQ(got[b].qs[i], 0) << "super-block " << b << " value " << i;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// MatMul

const DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                           DType::kQ5_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
// Formats whose kernels may round the activations to Q8_0 first.
const DType kBlockTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0,
                             DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
const DType kKQuantTypes[] = {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

bool IsBlockType(DType t) {
  return std::find(std::begin(kBlockTypes), std::end(kBlockTypes), t) != std::end(kBlockTypes);
}

bool IsKQuant(DType t) {
  return std::find(std::begin(kKQuantTypes), std::end(kKQuantTypes), t) != std::end(kKQuantTypes);
}

// K-quant rows run against Q8_0 activations only where matmul_kquant.cc has a kernel for their
// type at the level in force (AVX-512: Q4_K, Q5_K, Q6_K; AVX2: Q5_K); otherwise MatMul
// dequantizes the rows and multiplies f32 activations.
bool KQuantsQuantizeActivations(DType t) {
  return matmul_internal::KQuantKernelAvailable(t);
}

// K-quant rows are whole 256-value super-blocks; tests written for other widths take the next
// multiple of 256 for them.
int64_t ColsFor(DType t, int64_t cols) {
  return IsKQuant(t) ? (cols + 255) / 256 * 256 : cols;
}

struct TestMatrix {
  std::vector<uint8_t> bytes;
  std::vector<float> values;  // dequantized: what MatMul is meant to multiply by
  MatrixView view;
};

// Rows get scales over four decades so that per-row (and per-block) scaling is exercised.
// row_bytes may exceed the packed size to check that kernels honour the stride.
TestMatrix MakeMatrix(DType t, int64_t rows, int64_t cols, uint32_t seed, size_t pad = 0) {
  std::vector<float> w = testing::GaussianVector(static_cast<size_t>(rows * cols), seed);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] *= std::pow(10.0f, (r % 5) - 2.0f);
  TestMatrix m;
  const size_t packed = RowBytes(t, static_cast<size_t>(cols));
  m.view = MatrixView{t, nullptr, rows, cols, packed + pad};
  m.bytes.assign(m.view.row_bytes * rows, 0xab);
  m.values.resize(w.size());
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* dst = m.bytes.data() + r * m.view.row_bytes;
    QuantizeRow(t, w.data() + r * cols, dst, cols);
    DequantizeRow(t, dst, m.values.data() + r * cols, cols);
  }
  m.view.data = m.bytes.data();
  return m;
}

std::vector<float> Activations(int64_t n_tokens, int64_t cols, uint32_t seed) {
  std::vector<float> x = testing::GaussianVector(static_cast<size_t>(n_tokens * cols), seed);
  // A few large outliers per token, as real activations have; they set the block scales.
  for (int64_t t = 0; t < n_tokens; ++t) x[t * cols + (t * 7) % cols] *= 20.0f;
  return x;
}

// Checks out against ref for each (token, row). Float weights: f32 accumulation error only,
// relative to sum |w||x|. Block weights: the activations are rounded to Q8_0 first, which moves
// each x by at most 0.57 of its block's step (see BlockTypesRoundTripWithinHalfAStep), so the
// bound sums that over the row's blocks.
void ExpectClose(const TestMatrix& m, const std::vector<float>& x, int64_t n_tokens,
                 const std::vector<float>& out, const std::vector<float>& ref, bool x_quantized) {
  const int64_t rows = m.view.rows, cols = m.view.cols;
  const bool blocks = IsBlockType(m.view.type) && !x_quantized;
  // Interleaved K-quants quantize activations per 256 values (Q8_K), the others per 32.
  const int64_t act_block =
      m.view.layout == WeightLayout::kInterleaved16 && IsKQuant(m.view.type) ? 256 : 32;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* xt = x.data() + t * cols;
    for (int64_t r = 0; r < rows; ++r) {
      const float* wr = m.values.data() + r * cols;
      double mag = 0.0, act_err = 0.0;
      for (int64_t b = 0; b < cols; b += act_block) {
        double wsum = 0.0, amax = 0.0;
        for (int64_t c = b; c < std::min(cols, b + act_block); ++c) {
          mag += std::fabs(static_cast<double>(wr[c]) * xt[c]);
          wsum += std::fabs(wr[c]);
          amax = std::max(amax, static_cast<double>(std::fabs(xt[c])));
        }
        act_err += wsum * amax / 127.0 * (0.5 + 127 * 0x1p-11);
      }
      const double tol = 5e-6 * mag + (blocks ? act_err : 0.0) + 1e-30;
      const size_t i = static_cast<size_t>(t * rows + r);
      ASSERT_NEAR(out[i], ref[i], tol)
          << "token " << t << " row " << r << " (|w||x| = " << mag << ")";
    }
  }
}

struct Shape {
  int64_t rows, cols;
};

// Repacks m into the interleaved layout in place (its values stay the file layout's).
void Interleave(TestMatrix& m) {
  ASSERT_TRUE(CanInterleave(m.view)) << DTypeName(m.view.type);
  InterleaveRows(&m.view, m.bytes.data());
  ASSERT_EQ(m.view.layout, WeightLayout::kInterleaved16);
}

void CheckShapes(DType t, const std::vector<Shape>& shapes, const std::vector<int64_t>& tokens,
                 bool interleave = false) {
  ThreadPool pool1(1), pool2(2);
  uint32_t seed = 100;
  for (Shape s : shapes) {
    TestMatrix m = MakeMatrix(t, s.rows, s.cols, ++seed);
    if (interleave) Interleave(m);
    for (int64_t n : tokens) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.cols) + " tokens " + std::to_string(n));
      std::vector<float> x = Activations(n, s.cols, ++seed);
      std::vector<float> ref(static_cast<size_t>(n * s.rows)), out1(ref.size(), NAN),
          out2(ref.size(), NAN);
      MatMulReference(m.view, x.data(), n, ref.data());
      MatMul(m.view, x.data(), n, out1.data(), pool1);
      MatMul(m.view, x.data(), n, out2.data(), pool2);
      ExpectClose(m, x, n, out1, ref, /*x_quantized=*/false);
      // Each output is computed the same way whichever thread or tile it lands in.
      ASSERT_EQ(0, std::memcmp(out1.data(), out2.data(), out1.size() * sizeof(float)));
    }
  }
}

TEST(MatMul, BlockTypesMatchReference) {
  // Rows that are not multiples of the register tile (4) or the thread grain (16); cols with an
  // odd number of blocks (the kernels work on block pairs).
  const std::vector<Shape> shapes = {{1, 32},   {7, 32},   {5, 64},   {17, 96},
                                     {33, 160}, {64, 256}, {3, 4128}, {18, 4096}};
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ5_0}) CheckShapes(t, shapes, {1, 3, 8, 17});
}

TEST(MatMul, KQuantTypesMatchReference) {
  // Rows that are not multiples of the register tiles (4, decode 8) or the thread grain (16).
  const std::vector<Shape> shapes = {{1, 256},  {7, 256},  {5, 512},   {17, 512},
                                     {33, 768}, {64, 256}, {3, 2048},  {18, 2304},
                                     {9, 4096}, {41, 256}, {24, 1024}, {2, 8192}};
  for (DType t : kKQuantTypes) CheckShapes(t, shapes, {1, 3, 8, 17});
}

TEST(MatMul, FloatTypesMatchReference) {
  // Columns that leave every possible remainder class of a 16-lane vector.
  const std::vector<Shape> shapes = {{1, 1},  {7, 15},  {5, 16},  {17, 17},  {33, 33},
                                     {9, 96}, {2, 100}, {64, 31}, {3, 4100}, {18, 4096}};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) CheckShapes(t, shapes, {1, 3, 8, 17});
}

// Types without a quantizer here (Q4_1, Q5_1, Q2_K, Q3_K) take the dequantize-per-row path:
// random codes with sane f16 scales, checked against the reference like every other type.
TEST(MatMul, DequantizedTypesMatchReference) {
  ThreadPool pool(2);
  std::mt19937 rng(5);
  for (DType t : {DType::kQ4_1, DType::kQ5_1, DType::kQ2_K, DType::kQ3_K}) {
    SCOPED_TRACE(DTypeName(t));
    const int64_t rows = 37, cols = 512, n = 5;
    const size_t rb = RowBytes(t, cols);
    TestMatrix m;
    m.bytes.resize(rb * rows);
    for (uint8_t& b : m.bytes) b = static_cast<uint8_t>(rng());
    const size_t block_bytes = Info(t).block_bytes;
    std::uniform_real_distribution<float> scale(0.01f, 0.1f);
    for (size_t off = 0; off < m.bytes.size(); off += block_bytes) {
      uint8_t* blk = m.bytes.data() + off;
      auto set = [&](size_t at, float v) {
        const uint16_t h = F32ToF16(v);
        std::memcpy(blk + at, &h, 2);
      };
      if (t == DType::kQ4_1 || t == DType::kQ5_1) {
        set(0, scale(rng));
        set(2, -scale(rng));
      } else if (t == DType::kQ2_K) {
        set(offsetof(BlockQ2_K, d), scale(rng));
        set(offsetof(BlockQ2_K, dmin), scale(rng));
      } else {
        set(offsetof(BlockQ3_K, d), scale(rng));
      }
    }
    m.view = MatrixView{t, m.bytes.data(), rows, cols, rb};
    m.values.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) DequantizeRow(t, m.view.row(r), &m.values[r * cols], cols);
    std::vector<float> x = Activations(n, cols, 6);
    std::vector<float> ref(static_cast<size_t>(n * rows)), out(ref.size(), NAN);
    MatMulReference(m.view, x.data(), n, ref.data());
    MatMul(m.view, x.data(), n, out.data(), pool);
    ExpectClose(m, x, n, out, ref, /*x_quantized=*/false);
  }
}

TEST(MatMul, LargeMatrices) {
  for (DType t : kAllTypes) CheckShapes(t, {{1000, 2048}}, {1, 17});
}

// With the activations rounded to Q8_0 beforehand, the integer kernels have nothing left to
// approximate: what remains is f32 rounding of scales and sums.
TEST(MatMul, BlockTypesAreExactOnQ8_0Activations) {
  ThreadPool pool(2);
  for (DType t : kBlockTypes) {
    if (IsKQuant(t) && !KQuantsQuantizeActivations(t)) continue;
    for (Shape s : std::vector<Shape>{{13, ColsFor(t, 32)}, {21, ColsFor(t, 96)}, {40, 2048}}) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.cols));
      const int64_t n = 5;
      TestMatrix m = MakeMatrix(t, s.rows, s.cols, 7);
      std::vector<float> x = Activations(n, s.cols, 8);
      // Include exact rounding ties: they must go the same way in both quantizers.
      x[0] = 127.0f;
      x[1] = 2.5f;
      x[2] = -0.5f;
      std::vector<float> xq = RoundTrip(DType::kQ8_0, x);
      std::vector<float> ref(static_cast<size_t>(n * s.rows)), out(ref.size());
      MatMulReference(m.view, xq.data(), n, ref.data());
      MatMul(m.view, x.data(), n, out.data(), pool);
      ExpectClose(m, xq, n, out, ref, /*x_quantized=*/true);
    }
  }
}

TEST(MatMul, BatchedEqualsOneTokenAtATime) {
  ThreadPool pool(2);
  const int64_t rows = 37, n = 11;
  for (DType t : kAllTypes) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    const int64_t cols = ColsFor(t, 160);
    TestMatrix m = MakeMatrix(t, rows, cols, 9);
    std::vector<float> x = Activations(n, cols, 10);
    std::vector<float> batched(static_cast<size_t>(n * rows)), single(batched.size());
    MatMul(m.view, x.data(), n, batched.data(), pool);
    for (int64_t i = 0; i < n; ++i)
      MatMul(m.view, x.data() + i * cols, 1, single.data() + i * rows, pool);
    EXPECT_EQ(0, std::memcmp(batched.data(), single.data(), batched.size() * sizeof(float)));
  }
}

TEST(MatMul, HonoursRowStride) {
  ThreadPool pool(2);
  const int64_t rows = 19, n = 3;
  for (DType t : kAllTypes) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    const int64_t cols = ColsFor(t, 96);
    TestMatrix packed = MakeMatrix(t, rows, cols, 11);
    TestMatrix padded = MakeMatrix(t, rows, cols, 11, /*pad=*/40);
    std::vector<float> x = Activations(n, cols, 12);
    std::vector<float> a(static_cast<size_t>(n * rows)), b(a.size());
    MatMul(packed.view, x.data(), n, a.data(), pool);
    MatMul(padded.view, x.data(), n, b.data(), pool);
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  }
}

TEST(MatMul, ZeroInputsGiveExactZeros) {
  ThreadPool pool(1);
  const int64_t rows = 6, n = 2;
  for (DType t : kAllTypes) {
    SCOPED_TRACE(std::string(DTypeName(t)));
    const int64_t cols = ColsFor(t, 64);
    std::vector<float> zeros(static_cast<size_t>(rows * cols), 0.0f);
    std::vector<uint8_t> wz = QuantizeMatrix(t, zeros.data(), rows, cols);
    TestMatrix m = MakeMatrix(t, rows, cols, 13);
    std::vector<float> x = Activations(n, cols, 14), xz(x.size(), 0.0f);
    std::vector<float> out(static_cast<size_t>(n * rows), NAN);
    MatMul(MatrixView{t, wz.data(), rows, cols, RowBytes(t, cols)}, x.data(), n, out.data(), pool);
    for (float v : out) EXPECT_EQ(v, 0.0f);
    std::fill(out.begin(), out.end(), NAN);
    MatMul(m.view, xz.data(), n, out.data(), pool);
    for (float v : out) EXPECT_EQ(v, 0.0f);
  }
}

// ---------------------------------------------------------------------------------------------
// Interleaved layout (kernels/repack.h)

// The types with an interleaved kernel at the level in force (Q5_K, Q5_0: AVX2 only).
std::vector<DType> InterleavedTypes() {
  std::vector<DType> types;
  for (DType t : {DType::kQ4_0, DType::kQ5_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K, DType::kF32, DType::kF16, DType::kBF16}) {
    if (matmul_internal::InterleavedKernelAvailable(t)) types.push_back(t);
  }
  return types;
}

// Activations rounded the way the interleaved K-quant kernels quantize them (llama.cpp's Q8_K:
// one scale per 256 values, -127 at the value of largest magnitude, round half to even).
std::vector<float> RoundTripQ8K(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t b = 0; b < x.size(); b += 256) {
    float amax = 0.0f, max = 0.0f;
    for (size_t i = b; i < b + 256; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        max = x[i];
      }
    }
    const float iscale = amax == 0.0f ? 0.0f : -127.0f / max;
    for (size_t i = b; i < b + 256; ++i) {
      const float q = std::min(127.0f, std::nearbyint(iscale * x[i]));
      y[i] = amax == 0.0f ? 0.0f : q * (1.0f / iscale);
    }
  }
  return y;
}

bool HasInterleavedKernels() {
  return CanInterleave(MatrixView{DType::kQ4_0, nullptr, 16, 32, RowBytes(DType::kQ4_0, 32)});
}

TEST(Interleave, OnlyWholeGroupsOfPackedRows) {
  if (!HasInterleavedKernels()) GTEST_SKIP() << "no interleaved kernels in this build";
  for (DType t : InterleavedTypes()) {
    const int64_t cols = ColsFor(t, 64);
    const size_t rb = RowBytes(t, cols);
    EXPECT_TRUE(CanInterleave(MatrixView{t, nullptr, 32, cols, rb}));
    EXPECT_FALSE(CanInterleave(MatrixView{t, nullptr, 24, cols, rb}));      // 24 % 16 != 0
    EXPECT_FALSE(CanInterleave(MatrixView{t, nullptr, 32, cols, rb + 8}));  // padded rows
    EXPECT_FALSE(CanInterleave(
        MatrixView{t, nullptr, 32, cols, rb, WeightLayout::kInterleaved16}));  // already done
  }
  // Q5_K and Q5_0 have interleaved kernels at the AVX2 level only.
  for (DType t : {DType::kQ5_K, DType::kQ5_0}) {
    EXPECT_EQ(CanInterleave(MatrixView{t, nullptr, 32, 256, RowBytes(t, 256)}),
              matmul_internal::InterleavedKernelAvailable(t));
  }
  EXPECT_EQ(matmul_internal::InterleavedKernelAvailable(DType::kQ5_0),
            matmul_internal::InterleavedKernelAvailable(DType::kQ5_K));
  for (DType t : {DType::kQ4_K, DType::kQ6_K}) {
    EXPECT_TRUE(CanInterleave(MatrixView{t, nullptr, 32, 256, RowBytes(t, 256)}));
    EXPECT_FALSE(CanInterleave(MatrixView{t, nullptr, 24, 256, RowBytes(t, 256)}));
  }
  // Interleaving works on blocks of 32 columns, float types included.
  EXPECT_FALSE(CanInterleave(MatrixView{DType::kF16, nullptr, 32, 48, RowBytes(DType::kF16, 48)}));
}

TEST(Interleave, ReadRowGivesBackEveryRow) {
  if (!HasInterleavedKernels()) GTEST_SKIP() << "no interleaved kernels in this build";
  for (DType t : InterleavedTypes()) {
    for (Shape s : std::vector<Shape>{{16, ColsFor(t, 32)}, {48, ColsFor(t, 96)}, {32, 2048}}) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.cols));
      TestMatrix m = MakeMatrix(t, s.rows, s.cols, 21);
      const std::vector<uint8_t> file_layout = m.bytes;
      Interleave(m);
      EXPECT_NE(file_layout, m.bytes);  // the bytes did move
      std::vector<float> row(static_cast<size_t>(s.cols));
      for (int64_t r = 0; r < s.rows; ++r) {
        ReadRow(m.view, r, row.data());
        ASSERT_EQ(0,
                  std::memcmp(row.data(), m.values.data() + r * s.cols, row.size() * sizeof(float)))
            << "row " << r;
      }
    }
  }
}

TEST(Interleave, MatMulMatchesReference) {
  if (!HasInterleavedKernels()) GTEST_SKIP() << "no interleaved kernels in this build";
  // Group counts that leave every remainder of the decode (4) and prefill (2) group tiles, and
  // token counts that leave every remainder of the 4-token tile, and every count of the float
  // kernel's few-token (verification) tile.
  // Columns of one 256-column accumulation chunk of the float kernel, of several, and of a
  // partial last one (K-quants round them up to whole super-blocks).
  const std::vector<Shape> shapes = {{16, 32},   {32, 64},   {48, 96},     {64, 160},
                                     {80, 4096}, {112, 256}, {1008, 2048}, {32, 800}};
  for (DType t : InterleavedTypes()) {
    std::vector<Shape> type_shapes;
    for (Shape s : shapes) type_shapes.push_back({s.rows, ColsFor(t, s.cols)});
    CheckShapes(t, type_shapes, {1, 2, 3, 4, 5, 6, 7, 8, 9, 17}, true);
  }
}

// Up to 32 tokens the Q4_0/Q8_0 kernels run group-major (each pair of row groups through every
// token tile, the next pair prefetched), beyond that token-major: the order must not change a
// single output bit.
TEST(Interleave, GroupMajorAndTokenMajorOrdersAgreeBitForBit) {
  if (!HasInterleavedKernels()) GTEST_SKIP() << "no interleaved kernels in this build";
  ThreadPool pool(2);
  for (DType t : {DType::kQ4_0, DType::kQ8_0}) {
    SCOPED_TRACE(DTypeName(t));
    const int64_t rows = 1008, cols = 2048, n = 65;
    TestMatrix m = MakeMatrix(t, rows, cols, 55);
    Interleave(m);
    const std::vector<float> x = Activations(n, cols, 56);
    std::vector<float> all(static_cast<size_t>(n * rows)), few(static_cast<size_t>(32 * rows));
    MatMul(m.view, x.data(), n, all.data(), pool);   // token-major
    MatMul(m.view, x.data(), 32, few.data(), pool);  // group-major
    EXPECT_EQ(0, std::memcmp(all.data(), few.data(), few.size() * sizeof(float)));
  }
}

// On activations already rounded to what the kernel quantizes them to, only f32 rounding of
// scales and sums is left.
TEST(Interleave, ExactOnPreQuantizedActivations) {
  if (!HasInterleavedKernels()) GTEST_SKIP() << "no interleaved kernels in this build";
  ThreadPool pool(2);
  for (DType t : InterleavedTypes()) {
    SCOPED_TRACE(DTypeName(t));
    const int64_t rows = 48, cols = 2048, n = 6;
    TestMatrix m = MakeMatrix(t, rows, cols, 31);
    std::vector<float> x = IsKQuant(t) ? RoundTripQ8K(Activations(n, cols, 32))
                                       : RoundTrip(DType::kQ8_0, Activations(n, cols, 32));
    std::vector<float> ref(static_cast<size_t>(n * rows)), out(ref.size());
    MatMulReference(m.view, x.data(), n, ref.data());
    Interleave(m);
    MatMul(m.view, x.data(), n, out.data(), pool);
    ExpectClose(m, x, n, out, ref, /*x_quantized=*/true);
    // Batched and one token at a time agree bit for bit here too.
    std::vector<float> single(out.size());
    for (int64_t i = 0; i < n; ++i)
      MatMul(m.view, x.data() + i * cols, 1, single.data() + i * rows, pool);
    EXPECT_EQ(0, std::memcmp(out.data(), single.data(), out.size() * sizeof(float)));
  }
}

// A layer's q/k/v (rows of different counts, some not a multiple of the 32-row prefill tile) in
// one pass: each output is MatMul's bit for bit, at every token count and thread count, and a
// mix of activation forms (which falls back to one MatMul each) too.
TEST(Interleave, SharedInputEqualsOneMatMulEach) {
  if (!HasInterleavedKernels()) GTEST_SKIP() << "no interleaved kernels in this build";
  std::vector<std::vector<DType>> sets;
  for (DType t : InterleavedTypes()) sets.push_back({t, t, t});
  sets.push_back({DType::kQ4_K, DType::kQ4_K, DType::kQ6_K});  // Q4_K_M's q/k/v: one form
  sets.push_back({DType::kQ4_0, DType::kQ8_0, DType::kF16});   // three forms
  for (const std::vector<DType>& types : sets) {
    const int64_t cols = 512;
    const int64_t rows[] = {80, 48, 16};
    std::vector<TestMatrix> m;
    for (size_t i = 0; i < types.size(); ++i) {
      m.push_back(MakeMatrix(types[i], rows[i], cols, 40 + static_cast<uint32_t>(i)));
      Interleave(m.back());
    }
    for (int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      for (int64_t n : {1, 3, 9, 70}) {
        SCOPED_TRACE(std::string(DTypeName(types[0])) + "/" + std::string(DTypeName(types[2])) +
                     " threads " + std::to_string(threads) + " tokens " + std::to_string(n));
        const std::vector<float> x = Activations(n, cols, 50 + static_cast<uint32_t>(n));
        std::vector<std::vector<float>> alone(3), shared(3);
        std::vector<MatMulOutput> products;
        for (size_t i = 0; i < 3; ++i) {
          alone[i].assign(static_cast<size_t>(n * rows[i]), NAN);
          shared[i].assign(alone[i].size(), NAN);
          MatMul(m[i].view, x.data(), n, alone[i].data(), pool);
          products.push_back({&m[i].view, shared[i].data()});
        }
        MatMulSharedInput(products, x.data(), n, pool);
        for (size_t i = 0; i < 3; ++i) {
          ASSERT_EQ(0,
                    std::memcmp(alone[i].data(), shared[i].data(), alone[i].size() * sizeof(float)))
              << "product " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvs
