// Element types and block formats of weights, as numbered by GGUF (ggml_type ids).
// A quantized type stores `block_elems` values in `block_bytes` bytes; rows are whole blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvs {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

struct DTypeInfo {
  std::string_view name;
  uint32_t block_elems;  // values per block (1 for plain floats)
  uint32_t block_bytes;  // bytes per block
  bool supported;        // loadable and computable by kvserve today
};

// Describes a ggml type id, or nullopt for ids that GGUF does not define.
std::optional<DTypeInfo> GetDTypeInfo(uint32_t ggml_type);
inline DTypeInfo Info(DType t) {
  return *GetDTypeInfo(static_cast<uint32_t>(t));
}
std::string_view DTypeName(DType t);
// Parses "f32", "q8_0", ... (case-insensitive); nullopt if unknown.
std::optional<DType> ParseDType(std::string_view name);

// Bytes for `n` values of type t; n must be a multiple of the block size.
inline size_t RowBytes(DType t, size_t n) {
  DTypeInfo i = Info(t);
  return n / i.block_elems * i.block_bytes;
}

// IEEE half and bfloat16 conversions (round to nearest even). With F16C (-march=native on any
// recent x86) the half ones are the conversion instructions, except for NaNs; the portable code
// is their scalar twin (tested equal).
float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
float F16ToF32Portable(uint16_t h);
uint16_t F32ToF16Portable(float f);
inline float BF16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t F32ToBF16(float f);

// Block layouts (packed, little-endian, as in GGUF files).
#pragma pack(push, 1)
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // value j in low nibble of qs[j], value j+16 in high nibble; q - 8
};
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);

}  // namespace kvs
