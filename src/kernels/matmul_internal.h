// Pieces of MatMul shared between matmul.cc and the per-format kernel files. Not a public
// interface: only the kernels include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/isa_dispatch.h"
#include "kernels/matmul.h"

namespace kvs::matmul_internal {

// Tokens the interleaved float kernel takes in one pass over the weights, as a decode: a
// speculative verification's last token and drafts (matmul_float_interleaved.cc).
inline constexpr int64_t kFloatFewTokens = 6;

// Activations quantized to Q8_0 for the integer kernels, laid out for 512-bit registers: one
// ActPair holds two consecutive 32-value blocks with each block's scale and bias repeated over
// the eight int32 lanes that a dpbusd over the pair produces for that block. Expanding these once
// per token saves building them again for every weight row.
struct alignas(64) ActPair {
  int8_t qs[64];
  float scale[16];   // block scale (rounded to f16, as in a stored Q8_0 block) per lane
  int32_t bias[16];  // -offset * (sum of the lane's four qs); see below
};
static_assert(sizeof(ActPair) == 192);

// Weight codes enter dpbusd as unsigned bytes: Q4_0 nibbles as stored (code = value + 8), Q5_0
// nibbles with their fifth bit (code = value + 16), Q8_0 values xor 0x80 (code = value + 128).
// Starting each lane at -offset times the sum of its own four activations cancels the offset
// exactly per lane, so every lane holds the true partial dot product and the f32 accumulation
// rounds no more than it would without the offset.
inline constexpr int32_t kCodeOffsetQ8_0 = 128;
inline constexpr int32_t kCodeOffsetQ4_0 = 8;
inline constexpr int32_t kCodeOffsetQ5_0 = 16;

// Quantized activations of n_tokens tokens; token t starts at pairs + t * n_pairs.
struct QuantizedActs {
  const ActPair* pairs = nullptr;
  int64_t n_pairs = 0;  // ceil(blocks / 2); an odd last block leaves zeros in the second half
  const ActPair* token(int64_t t) const { return pairs + t * n_pairs; }
};

// Quantizes one token's cols values (a multiple of 32) into n_pairs ActPairs. The block codes
// and scales are exactly those of QuantizeRow(kQ8_0), so a test can reproduce them.
void QuantizeActivations(const float* x, int64_t cols, int32_t code_offset, ActPair* dst);

// Tile kernels: out[t * out_stride + r] for rows [r0, r1) and tokens [t0, t1). Each (row, token)
// dot product is computed in the same order whatever the tiling, so results do not depend on
// the thread split or on how many tokens share a call.
void MatMulRowsQ8_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride);
void MatMulRowsQ4_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride);
void MatMulRowsQ5_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride);
// x is [tokens][w.cols] f32.
void MatMulRowsFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0,
                     int64_t t1, float* out, int64_t out_stride);

// Activations for the interleaved kernels (matmul_interleaved.cc): one Q8_0 block per token and
// block, codes in natural order (the kernels broadcast four at a time), with its scale and
// -offset * (sum of codes), which cancels the weights' unsigned code offset.
struct ActBlock {
  int8_t qs[32];
  float scale;
  int32_t bias;
};
static_assert(sizeof(ActBlock) == 40);

struct FlatActs {
  const ActBlock* blocks = nullptr;
  int64_t n_blocks = 0;  // per token: cols / 32
  const ActBlock* token(int64_t t) const { return blocks + t * n_blocks; }
};

// Quantizes one token's cols values (a multiple of 32) into cols / 32 blocks, with codes and
// scales exactly those of QuantizeActivations.
void QuantizeActivationsFlat(const float* x, int64_t cols, int32_t code_offset, ActBlock* dst);

// Whether this build has an interleaved kernel for weight type t (Q4_0, Q8_0, Q4_K, Q6_K, F32,
// F16, BF16 with AVX-512).
bool InterleavedKernelAvailable(DType t);
inline int32_t InterleavedCodeOffset(DType t) {
  return t == DType::kQ4_0   ? kCodeOffsetQ4_0
         : t == DType::kQ5_0 ? kCodeOffsetQ5_0
                             : kCodeOffsetQ8_0;
}
// Like the tile kernels above for a kInterleaved16 matrix; r0 and r1 are multiples of 16.
void MatMulRowsInterleaved(const MatrixView& w, int64_t r0, int64_t r1, const FlatActs& a,
                           int64_t t0, int64_t t1, float* out, int64_t out_stride);

// The same for F32, F16 and BF16 weights; x is [tokens][w.cols] f32.
void MatMulRowsInterleavedFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x,
                                int64_t t0, int64_t t1, float* out, int64_t out_stride);

// Activations for the interleaved Q4_K and Q6_K kernels (matmul_kquant_interleaved.cc): one
// 256-value block per token quantized the way llama.cpp's Q8_K is (a single scale,
// -127 / (the value of largest magnitude), round to nearest even), with the per-32 code sums
// that Q4_K's mins need and -32 times the per-16 sums that cancel Q6_K's code offset.
struct alignas(64) KAct256 {
  int8_t qs[256];
  float d;
  float bsum32[8];
  int32_t bias16[16];
};

struct KActs256 {
  const KAct256* blocks = nullptr;
  int64_t n_blocks = 0;  // per token: cols / 256
  const KAct256* token(int64_t t) const { return blocks + t * n_blocks; }
};

void QuantizeActivationsQ8K(const float* x, int64_t cols, KAct256* dst);
void MatMulRowsInterleavedKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KActs256& a,
                                 int64_t t0, int64_t t1, float* out, int64_t out_stride);

// Activations for the K-quant kernels (matmul_kquant.cc): one 256-value super-block of one
// token, quantized to Q8_0 exactly as QuantizeActivations does, and laid out as four 64-value
// dpbusd operands, in the order in which the weight format unpacks its codes.
enum class KActOrder {
  kNatural = 0,  // Q6_K: vector k holds values 64k..64k+63
  kPaired = 1,   // Q4_K, Q5_K: vectors hold sub-blocks (0, 2), (1, 3), (4, 6), (5, 7)
};
struct alignas(64) KActBlock {
  int8_t qs[4][64];
  float scale[4][16];   // each dpbusd lane's activation scale
  int32_t bias[4][16];  // -32 * (sum of the lane's four qs), for Q6_K's offset codes
  float xsum[16];       // lanes 8 + j: scale * (sum of qs) of sub-block j; lanes 0-7 zero
};
static_assert(sizeof(KActBlock) == 832);

struct KQuantizedActs {
  const KActBlock* blocks = nullptr;
  int64_t n_blocks = 0;  // per token: cols / 256
  const KActBlock* token(int64_t t) const { return blocks + t * n_blocks; }
};

// Whether this build has an integer kernel for weight type t (Q4_K, Q5_K, Q6_K with AVX-512).
bool KQuantKernelAvailable(DType t);
inline KActOrder KActOrderFor(DType t) {
  return t == DType::kQ6_K ? KActOrder::kNatural : KActOrder::kPaired;
}
// Quantizes one token's cols values (a multiple of 256) into cols / 256 blocks.
void QuantizeActivationsK(const float* x, int64_t cols, KActOrder order, KActBlock* dst);
// Like the tile kernels above; w.type must be one KQuantKernelAvailable accepts.
void MatMulRowsKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KQuantizedActs& a,
                      int64_t t0, int64_t t1, float* out, int64_t out_stride);

// The functions above that are compiled once per instruction-set level (kernels/isa_begin.h):
// each level's namespace holds its own, and the unqualified ones (matmul_dispatch.cc) call the
// level in force. Tests may call a level's directly where the CPU has it.
#define KVS_DECLARE_MATMUL_LEVEL(ns)                                                               \
  namespace ns {                                                                                   \
  void QuantizeActivations(const float* x, int64_t cols, int32_t code_offset, ActPair* dst);       \
  void QuantizeActivationsFlat(const float* x, int64_t cols, int32_t code_offset, ActBlock* dst);  \
  void MatMulRowsQ8_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a,         \
                      int64_t t0, int64_t t1, float* out, int64_t out_stride);                     \
  void MatMulRowsQ4_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a,         \
                      int64_t t0, int64_t t1, float* out, int64_t out_stride);                     \
  void MatMulRowsQ5_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a,         \
                      int64_t t0, int64_t t1, float* out, int64_t out_stride);                     \
  void MatMulRowsFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0,    \
                       int64_t t1, float* out, int64_t out_stride);                                \
  bool InterleavedKernelAvailable(DType t);                                                        \
  void MatMulRowsInterleaved(const MatrixView& w, int64_t r0, int64_t r1, const FlatActs& a,       \
                             int64_t t0, int64_t t1, float* out, int64_t out_stride);              \
  void MatMulRowsInterleavedFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x,     \
                                  int64_t t0, int64_t t1, float* out, int64_t out_stride);         \
  void QuantizeActivationsQ8K(const float* x, int64_t cols, KAct256* dst);                         \
  void MatMulRowsInterleavedKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KActs256& a, \
                                   int64_t t0, int64_t t1, float* out, int64_t out_stride);        \
  bool KQuantKernelAvailable(DType t);                                                             \
  void QuantizeActivationsK(const float* x, int64_t cols, KActOrder order, KActBlock* dst);        \
  void MatMulRowsKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KQuantizedActs& a,      \
                        int64_t t0, int64_t t1, float* out, int64_t out_stride);                   \
  }
KVS_FOR_EACH_ISA_NAMESPACE(KVS_DECLARE_MATMUL_LEVEL)
#undef KVS_DECLARE_MATMUL_LEVEL

// Tile kernels are templates over their row and token counts (up to 4 x 4). At the edges
// of a matrix a call site needs the instantiation for the shape that is left:
// make(rows, tokens) receives both as std::integral_constant and returns that kernel.
template <typename TileFn, typename Make>
TileFn PickTileShape(int64_t n_rows, int64_t n_tokens, const Make& make) {
  auto with_rows = [&](auto rows) -> TileFn {
    switch (n_tokens) {
      case 1:
        return make(rows, std::integral_constant<int, 1>{});
      case 2:
        return make(rows, std::integral_constant<int, 2>{});
      case 3:
        return make(rows, std::integral_constant<int, 3>{});
      default:
        return make(rows, std::integral_constant<int, 4>{});
    }
  };
  switch (n_rows) {
    case 1:
      return with_rows(std::integral_constant<int, 1>{});
    case 2:
      return with_rows(std::integral_constant<int, 2>{});
    case 3:
      return with_rows(std::integral_constant<int, 3>{});
    default:
      return with_rows(std::integral_constant<int, 4>{});
  }
}

// The tile kernel for n_tokens tokens, 1 <= n_tokens <= kMaxTokens (the kMaxTokens one for
// anything larger): make(std::integral_constant<int, T>) returns the T-token instantiation.
template <typename TileFn, int kMaxTokens, typename Make>
TileFn PickTokenCount(int64_t n_tokens, const Make& make) {
  return [&]<int... I>(std::integer_sequence<int, I...>) {
    TileFn fn = make(std::integral_constant<int, kMaxTokens>{});
    ((n_tokens == I + 1 ? (fn = make(std::integral_constant<int, I + 1>{}), 0) : 0), ...);
    return fn;
  }
  (std::make_integer_sequence<int, kMaxTokens>{});
}

}  // namespace kvs::matmul_internal
