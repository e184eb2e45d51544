// K-quant and legacy 5-bit/4_1 block formats: quantizer round trips, bit layouts pinned by
// hand-built blocks, and our dequantizers against llama-quantize's output on real files.
#include "tensor/kquants.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "tensor/dtype.h"
#include "testing/random.h"

namespace kvs {
namespace {

double RelRms(const float* got, const float* want, size_t n) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < n; ++i) {
    err += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    ref += static_cast<double>(want[i]) * want[i];
  }
  return ref > 0.0 ? std::sqrt(err / ref) : std::sqrt(err);
}

// Relative RMS error that each format's rounding should stay under, for Gaussian-like weights.
// Shared by the round trips (our quantizer) and the real files (llama-quantize's).
double ErrorBound(DType t) {
  switch (t) {
    case DType::kQ2_K:
      return 0.40;
    case DType::kQ3_K:
      return 0.20;
    case DType::kQ4_1:
      return 0.10;
    case DType::kQ4_K:
      return 0.08;
    case DType::kQ5_0:
      return 0.05;
    case DType::kQ5_1:
      return 0.05;
    case DType::kQ5_K:
      return 0.04;
    case DType::kQ6_K:
      return 0.02;
    default:
      return 0.0;
  }
}

// ---------------------------------------------------------------------------------------------
// Round trips through our quantizers

struct RoundTripCase {
  DType type;
  void (*quantize)(const float*, void*, int64_t);
  void (*dequantize)(const void*, float*, int64_t);
};

const RoundTripCase kRoundTrips[] = {
    {DType::kQ4_K, QuantizeRowQ4_K, DequantizeRowQ4_K},
    {DType::kQ5_K, QuantizeRowQ5_K, DequantizeRowQ5_K},
    {DType::kQ6_K, QuantizeRowQ6_K, DequantizeRowQ6_K},
    {DType::kQ5_0, QuantizeRowQ5_0, DequantizeRowQ5_0},
};

// Quantizes and decodes `x`, checking that nothing past RowBytes is written.
std::vector<float> RoundTrip(const RoundTripCase& c, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  const size_t bytes = RowBytes(c.type, x.size());
  std::vector<uint8_t> q(bytes + 64, 0xA5);
  c.quantize(x.data(), q.data(), n);
  for (size_t i = bytes; i < q.size(); ++i) EXPECT_EQ(q[i], 0xA5) << "wrote past the row";
  std::vector<float> y(x.size(), NAN);
  c.dequantize(q.data(), y.data(), n);
  std::vector<float> y2(x.size(), NAN);
  EXPECT_TRUE(DequantizeRowKQuant(c.type, q.data(), y2.data(), n));
  EXPECT_EQ(0, std::memcmp(y.data(), y2.data(), y.size() * sizeof(float)));
  return y;
}

TEST(KQuantRoundTrip, GaussianErrorWithinBound) {
  for (const RoundTripCase& c : kRoundTrips) {
    SCOPED_TRACE(std::string(DTypeName(c.type)));
    std::vector<float> x = testing::GaussianVector(256 * 64, 7, 0.02f);
    std::vector<float> y = RoundTrip(c, x);
    const double err = RelRms(y.data(), x.data(), x.size());
    std::printf("  round trip %-5s rel RMS %.4f (bound %.2f)\n", DTypeName(c.type).data(), err,
                ErrorBound(c.type));
    EXPECT_LT(err, ErrorBound(c.type));
    EXPECT_GT(err, 0.0);
  }
}

TEST(KQuantRoundTrip, QuantizeRowKQuantDispatches) {
  std::vector<float> x = testing::GaussianVector(256, 3, 1.0f);
  for (const RoundTripCase& c : kRoundTrips) {
    std::vector<uint8_t> a(RowBytes(c.type, 256)), b(a.size());
    c.quantize(x.data(), a.data(), 256);
    EXPECT_TRUE(QuantizeRowKQuant(c.type, x.data(), b.data(), 256));
    EXPECT_EQ(a, b) << DTypeName(c.type);
  }
  float y[32];
  uint8_t raw[64] = {};
  EXPECT_FALSE(QuantizeRowKQuant(DType::kQ8_0, x.data(), raw, 32));
  EXPECT_FALSE(DequantizeRowKQuant(DType::kQ4_0, raw, y, 32));
  EXPECT_FALSE(DequantizeRowKQuant(DType::kF16, raw, y, 32));
}

TEST(KQuantRoundTrip, AwkwardRows) {
  // Sub-blocks whose magnitudes differ by 1000x share one super-block scale; all-positive and
  // all-negative data exercise the min (which is never positive); zeros must stay zeros.
  std::vector<float> mixed = testing::GaussianVector(512, 11, 1.0f);
  for (size_t i = 0; i < mixed.size(); ++i) mixed[i] *= (i / 32) % 2 ? 1e-3f : 1.0f;
  std::vector<float> positive = testing::GaussianVector(512, 12, 1.0f);
  for (float& v : positive) v = 3.0f + std::fabs(v);
  std::vector<float> negative = positive;
  for (float& v : negative) v = -v;
  std::vector<float> outlier = testing::GaussianVector(512, 13, 0.01f);
  outlier[100] = 5.0f;
  for (const RoundTripCase& c : kRoundTrips) {
    SCOPED_TRACE(std::string(DTypeName(c.type)));
    std::vector<float> zeros(512, 0.0f);
    for (float v : RoundTrip(c, zeros)) ASSERT_EQ(v, 0.0f);
    // Relative to the whole row, so the tiny sub-blocks only need to stay finite and small.
    for (const auto* x : {&mixed, &positive, &negative, &outlier}) {
      std::vector<float> y = RoundTrip(c, *x);
      for (float v : y) ASSERT_TRUE(std::isfinite(v));
      EXPECT_LT(RelRms(y.data(), x->data(), x->size()), ErrorBound(c.type));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Bit layouts. Each block is written byte by byte at the offsets GGUF defines, without the
// structs, so a wrong field order or size fails here too.

void PutF16(std::vector<uint8_t>& b, size_t off, float v) {
  const uint16_t h = F32ToF16(v);
  std::memcpy(b.data() + off, &h, 2);
}

std::vector<float> Decode(DType t, const std::vector<uint8_t>& block) {
  const DTypeInfo info = Info(t);
  EXPECT_EQ(block.size(), info.block_bytes);
  std::vector<float> y(info.block_elems, NAN);
  EXPECT_TRUE(DequantizeRowKQuant(t, block.data(), y.data(), info.block_elems));
  return y;
}

TEST(KQuantLayout, Q4_1) {
  std::vector<uint8_t> b(20, 0);
  PutF16(b, 0, 0.5f);   // d
  PutF16(b, 2, -1.0f);  // m
  b[4 + 0] = 0xA3;      // value 0 = 3, value 16 = 10
  b[4 + 15] = 0xF0;     // value 31 = 15
  std::vector<float> y = Decode(DType::kQ4_1, b);
  EXPECT_EQ(y[0], 0.5f);
  EXPECT_EQ(y[16], 4.0f);
  EXPECT_EQ(y[31], 6.5f);
  EXPECT_EQ(y[15], -1.0f);
  EXPECT_EQ(y[1], -1.0f);
}

TEST(KQuantLayout, Q5_0) {
  std::vector<uint8_t> b(22, 0);
  PutF16(b, 0, 0.25f);
  b[2] = 0x01;  // qh bit 0: value 0's fifth bit
  b[5] = 0x80;  // qh bit 31: value 31's fifth bit
  b[6 + 0] = 0x73;
  b[6 + 15] = 0xF0;
  std::vector<float> y = Decode(DType::kQ5_0, b);
  EXPECT_EQ(y[0], 0.75f);    // (3 + 16 - 16) / 4
  EXPECT_EQ(y[16], -2.25f);  // (7 - 16) / 4
  EXPECT_EQ(y[31], 3.75f);   // (15 + 16 - 16) / 4
  EXPECT_EQ(y[15], -4.0f);
  EXPECT_EQ(y[1], -4.0f);
}

TEST(KQuantLayout, Q5_1) {
  std::vector<uint8_t> b(24, 0);
  PutF16(b, 0, 0.5f);  // d
  PutF16(b, 2, 1.0f);  // m
  b[6] = 0x01;         // qh bit 16: value 16's fifth bit
  b[8 + 0] = 0x21;
  std::vector<float> y = Decode(DType::kQ5_1, b);
  EXPECT_EQ(y[0], 1.5f);    // 1 * 0.5 + 1
  EXPECT_EQ(y[16], 10.0f);  // 18 * 0.5 + 1
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[17], 1.0f);
}

TEST(KQuantLayout, Q2_K) {
  std::vector<uint8_t> b(84, 0);
  PutF16(b, 80, 1.0f);     // d
  PutF16(b, 82, 0.5f);     // dmin
  b[0] = 0x21;             // scale 0: sc 1, min 2
  b[2] = 0x03;             // scale 2: sc 3
  b[4] = 0x12;             // scale 4: sc 2, min 1
  b[6] = 0x04;             // scale 6: sc 4
  b[15] = 0x35;            // scale 15: sc 5, min 3
  b[16 + 0] = 0xE4;        // values 0, 32, 64, 96 = 0, 1, 2, 3
  b[16 + 32 + 17] = 0xC0;  // value 128 + 96 + 17 = 3
  std::vector<float> y = Decode(DType::kQ2_K, b);
  EXPECT_EQ(y[0], -1.0f);    // 1 * 0 - 0.5 * 2
  EXPECT_EQ(y[32], 3.0f);    // 3 * 1
  EXPECT_EQ(y[64], 3.5f);    // 2 * 2 - 0.5 * 1
  EXPECT_EQ(y[96], 12.0f);   // 4 * 3
  EXPECT_EQ(y[241], 13.5f);  // 5 * 3 - 0.5 * 3
  EXPECT_EQ(y[145], 0.0f);
  EXPECT_EQ(y[15], -1.0f);  // scale 0's min applies to all 16 of its values
  EXPECT_EQ(y[16], 0.0f);
}

TEST(KQuantLayout, Q3_K) {
  std::vector<uint8_t> b(110, 0);
  PutF16(b, 108, 0.5f);
  // All sixteen 6-bit scales = 32 (a zero scale): top bits 0b10 in bytes 8-11, nibbles 0.
  for (int k = 8; k < 12; ++k) b[96 + k] = 0xAA;
  b[96 + 0] = 0x01;   // scale 0 = 33 -> 1
  b[96 + 5] = 0x50;   // scale 13's low nibble 5 (high nibble of byte 13 - 8) -> 37 -> 5
  b[96 + 6] = 0x0D;   // scale 6's low nibble 13 ...
  b[96 + 10] = 0xA6;  // ... and top bits 01 (bits 2-3 of byte 8 + 6 % 4): 29 -> -3
  b[32 + 0] = 0x02;   // value 0: low bits 2
  b[0 + 0] = 0x01;    // value 0: hmask bit 0 set, no -4
  b[32 + 4] = 0xC0;   // value 100 (half 0, j 3, l 4): low bits 3, hmask clear -> -1
  b[32 + 50] = 0x10;  // value 210 (half 1, j 2, l 18): low bits 1 ...
  b[0 + 18] = 0x40;   // ... hmask bit 6 (= 210 / 32) set -> 1
  std::vector<float> y = Decode(DType::kQ3_K, b);
  EXPECT_EQ(y[0], 1.0f);      // 0.5 * 1 * 2
  EXPECT_EQ(y[1], -2.0f);     // 0.5 * 1 * -4
  EXPECT_EQ(y[100], 1.5f);    // 0.5 * -3 * -1
  EXPECT_EQ(y[210], 2.5f);    // 0.5 * 5 * 1
  EXPECT_EQ(y[211], -10.0f);  // 0.5 * 5 * -4
  EXPECT_EQ(y[16], 0.0f);     // scale 1 is zero
}

TEST(KQuantLayout, Q4_K) {
  std::vector<uint8_t> b(144, 0);
  PutF16(b, 0, 1.0f);  // d
  PutF16(b, 2, 0.5f);  // dmin
  uint8_t* s = b.data() + 4;
  s[0] = 2;           // sub-block 0: sc 2
  s[4] = 4;           // sub-block 0: min 4
  s[9] = 0x3A;        // sub-block 5: low nibbles of sc (10) and min (3)
  s[1] = 0x80;        // sub-block 5: top bits of sc (2) -> 42
  s[5] = 0x40;        // sub-block 5: top bits of min (1) -> 19
  b[16 + 0] = 0x75;   // value 0 = 5 (sub-block 0), value 32 = 7 (sub-block 1: zero)
  b[16 + 65] = 0x30;  // value 161 (chunk 2, high nibble, l 1) = 3
  std::vector<float> y = Decode(DType::kQ4_K, b);
  EXPECT_EQ(y[0], 8.0f);      // 2 * 5 - 0.5 * 4
  EXPECT_EQ(y[1], -2.0f);     // 2 * 0 - 0.5 * 4
  EXPECT_EQ(y[32], 0.0f);     // the top bits stored in s[1] and s[5] are not sub-block 1's
  EXPECT_EQ(y[161], 116.5f);  // 42 * 3 - 0.5 * 19
  EXPECT_EQ(y[160], -9.5f);
  EXPECT_EQ(y[129], 0.0f);  // sub-block 4 reads s[8] and the top bits of s[0], s[4]: zero
}

TEST(KQuantLayout, Q5_K) {
  std::vector<uint8_t> b(176, 0);
  PutF16(b, 0, 0.5f);  // d
  PutF16(b, 2, 1.0f);  // dmin
  uint8_t* s = b.data() + 4;
  s[0] = 1;            // sub-block 0: sc 1, min 0
  s[11] = 0x21;        // sub-block 7: low nibbles sc 1, min 2
  s[3] = 0x40;         // sub-block 7: sc top bits 1 -> 17
  s[7] = 0x80;         // sub-block 7: min top bits 2 -> 34
  b[16 + 0] = 0x01;    // qh[0] bit 0: value 0's fifth bit
  b[16 + 31] = 0x80;   // qh[31] bit 7: value 255's fifth bit
  b[48 + 0] = 0x03;    // value 0 low bits 3
  b[48 + 127] = 0xF0;  // value 255 (chunk 3, high nibble, l 31) low bits 15
  std::vector<float> y = Decode(DType::kQ5_K, b);
  EXPECT_EQ(y[0], 9.5f);      // 0.5 * 1 * 19
  EXPECT_EQ(y[255], 229.5f);  // 0.5 * 17 * 31 - 34
  EXPECT_EQ(y[224], -34.0f);
  EXPECT_EQ(y[1], 0.0f);
}

TEST(KQuantLayout, Q6_K) {
  std::vector<uint8_t> b(210, 0);
  PutF16(b, 208, 0.25f);
  b[192 + 0] = 4;
  b[192 + 5] = static_cast<uint8_t>(-2);
  b[192 + 15] = 1;
  b[0] = 0x0F;         // value 0 low bits 15 ...
  b[128 + 0] = 0x03;   // ... top bits 3 -> 63
  b[16] = 0x10;        // value 80 (half 0, g 2, l 16): high nibble of ql[16] = 1 ...
  b[128 + 16] = 0x10;  // ... top bits at bits 4-5 of qh[16] = 1 -> 17
  b[127] = 0xA0;       // value 255 (half 1, g 3, l 31): high nibble of ql[64 + 32 + 31] ...
  b[128 + 63] = 0x80;  // ... top bits at bits 6-7 of qh[32 + 31] = 2 -> 42
  std::vector<float> y = Decode(DType::kQ6_K, b);
  EXPECT_EQ(y[0], 31.0f);   // 0.25 * 4 * (63 - 32)
  EXPECT_EQ(y[1], -32.0f);  // 0.25 * 4 * -32
  EXPECT_EQ(y[80], 7.5f);   // 0.25 * -2 * (17 - 32)
  EXPECT_EQ(y[255], 2.5f);  // 0.25 * 1 * (42 - 32)
  EXPECT_EQ(y[16], 0.0f);   // scale 1 is zero
}

// ---------------------------------------------------------------------------------------------
// Real files: llama-quantize's blocks decoded by us against the F16 weights they came from.

std::string BenchModelsDir() {
  if (const char* env = std::getenv("KVS_BENCH_MODELS"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/kvserve-models";
}

struct Tally {
  double err2 = 0.0, ref2 = 0.0, worst = 0.0;
  std::string worst_name;
  int tensors = 0;
  int64_t values = 0;
};

// Compares up to `max_rows` rows (evenly spaced) of each tensor of a type we decode, at most
// `max_tensors` per type, with the same-named F16/F32 tensor of `ref`.
void CrossCheck(const gguf::File& quant, const gguf::File& ref, uint64_t max_rows, int max_tensors,
                std::map<DType, Tally>* out) {
  std::vector<float> got, want;
  for (const gguf::TensorInfo& t : quant.tensors()) {
    if (ErrorBound(t.type) == 0.0) continue;
    Tally& tally = (*out)[t.type];
    if (tally.tensors >= max_tensors) continue;
    const gguf::TensorInfo* r = ref.FindTensor(t.name);
    ASSERT_NE(r, nullptr) << t.name << " missing from " << ref.path();
    ASSERT_EQ(r->dims, t.dims) << t.name;
    ASSERT_TRUE(r->type == DType::kF16 || r->type == DType::kF32) << t.name;
    const uint64_t cols = t.dims[0], rows = t.rows();
    const size_t qrow = RowBytes(t.type, cols), rrow = RowBytes(r->type, cols);
    ASSERT_EQ(qrow * rows, t.n_bytes) << t.name;
    got.resize(cols);
    want.resize(cols);
    const uint64_t n_rows = std::min(rows, max_rows);
    double err2 = 0.0, ref2 = 0.0;
    for (uint64_t k = 0; k < n_rows; ++k) {
      const uint64_t row = k * rows / n_rows;
      ASSERT_TRUE(
          DequantizeRowKQuant(t.type, t.data + row * qrow, got.data(), static_cast<int64_t>(cols)));
      const uint8_t* src = r->data + row * rrow;
      for (uint64_t i = 0; i < cols; ++i) {
        if (r->type == DType::kF16) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          want[i] = F16ToF32(h);
        } else {
          std::memcpy(&want[i], src + 4 * i, 4);
        }
        err2 += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
        ref2 += static_cast<double>(want[i]) * want[i];
      }
    }
    ASSERT_GT(ref2, 0.0) << t.name;
    const double rel = std::sqrt(err2 / ref2);
    EXPECT_LT(rel, ErrorBound(t.type)) << t.name << " (" << DTypeName(t.type) << ")";
    tally.err2 += err2;
    tally.ref2 += ref2;
    tally.values += static_cast<int64_t>(n_rows * cols);
    ++tally.tensors;
    if (rel > tally.worst) {
      tally.worst = rel;
      tally.worst_name = t.name;
    }
  }
}

void Report(const std::string& file, const std::map<DType, Tally>& tallies) {
  for (const auto& [type, t] : tallies) {
    if (t.tensors == 0) continue;
    std::printf(
        "  %-24s %-5s %3d tensors %9lld values  rel RMS %.4f  worst %.4f (%s)  bound %.2f\n",
        file.c_str(), DTypeName(type).data(), t.tensors, static_cast<long long>(t.values),
        std::sqrt(t.err2 / t.ref2), t.worst, t.worst_name.c_str(), ErrorBound(type));
  }
}

std::unique_ptr<gguf::File> OpenOrFail(const std::string& path) {
  auto f = gguf::File::Open(path);
  EXPECT_TRUE(f.ok()) << path << ": " << f.error();
  return f.ok() ? std::move(f).value() : nullptr;
}

TEST(KQuantRealFiles, TinyModelMatchesF16) {
  namespace fs = std::filesystem;
  const fs::path dir = BenchModelsDir();
  const fs::path f16_path = dir / "tiny-hd64-f16.gguf";
  std::error_code ec;
  if (!fs::is_regular_file(f16_path, ec)) {
    GTEST_SKIP() << f16_path << " not found (the peer's random-weight models; set "
                 << "KVS_BENCH_MODELS to their directory)";
  }
  // Every other quantization of the same weights present, e.g. q4_k_m and q4_0.
  std::vector<fs::path> quantized;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("tiny-hd64-") && name.ends_with(".gguf") && e.path() != f16_path) {
      quantized.push_back(e.path());
    }
  }
  std::sort(quantized.begin(), quantized.end());
  if (quantized.empty()) GTEST_SKIP() << "no quantized tiny-hd64-*.gguf next to " << f16_path;
  auto ref = OpenOrFail(f16_path.string());
  ASSERT_NE(ref, nullptr);
  int checked = 0;
  for (const fs::path& p : quantized) {
    SCOPED_TRACE(p.string());
    auto quant = OpenOrFail(p.string());
    ASSERT_NE(quant, nullptr);
    std::map<DType, Tally> tallies;
    CrossCheck(*quant, *ref, UINT64_MAX, 1 << 30, &tallies);
    Report(p.filename().string(), tallies);
    for (const auto& [type, t] : tallies) checked += t.tensors;
  }
  if (checked == 0) GTEST_SKIP() << "no tensor of a type decoded here in the tiny-hd64 files";
}

TEST(KQuantRealFiles, Qwen2SampledRowsMatchF16) {
  const std::string dir = BenchModelsDir();
  const std::string f16_path = dir + "/qwen2-0.5b-f16.gguf";
  const std::string q_path = dir + "/qwen2-0.5b-q4_k_m.gguf";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(f16_path, ec) ||
      !std::filesystem::is_regular_file(q_path, ec)) {
    GTEST_SKIP() << "qwen2-0.5b-f16.gguf / qwen2-0.5b-q4_k_m.gguf not found in " << dir
                 << " (set KVS_BENCH_MODELS)";
  }
  auto ref = OpenOrFail(f16_path);
  auto quant = OpenOrFail(q_path);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(quant, nullptr);
  std::map<DType, Tally> tallies;
  CrossCheck(*quant, *ref, 16, 3, &tallies);  // the files are large: a few rows suffice
  Report("qwen2-0.5b-q4_k_m.gguf", tallies);
  int checked = 0;
  for (const auto& [type, t] : tallies) checked += t.tensors;
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace kvs
