#include "kernels/kv_types.h"

#include <cctype>

namespace kvs {

std::string_view KvTypeName(KvType t) {
  switch (t) {
    case KvType::kF32:
      return "f32";
    case KvType::kF16:
      return "f16";
    case KvType::kBF16:
      return "bf16";
    case KvType::kQ8_0:
      return "q8_0";
    case KvType::kQ4_0:
      return "q4_0";
    case KvType::kInt8:
      return "int8";
    case KvType::kFp8:
      return "fp8";
    case KvType::kTurbo4:
      return "turbo4";
    case KvType::kTurbo3:
      return "turbo3";
  }
  return "?";
}

std::string KvTypeNames() {
  std::string names;
  for (KvType t : kAllKvTypes) {
    if (!names.empty()) names += ", ";
    names += KvTypeName(t);
  }
  return names;
}

Expected<KvType> ParseKvType(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "fp8_e4m3" || lower == "e4m3") lower = "fp8";
  for (KvType t : kAllKvTypes) {
    if (KvTypeName(t) == lower) return t;
  }
  return Status::Error(StrFormat("unknown KV cache type '%.*s' (valid: %s)",
                                 static_cast<int>(name.size()), name.data(),
                                 KvTypeNames().c_str()));
}

int32_t KvCodeBits(KvType t) {
  switch (t) {
    case KvType::kF32:
      return 32;
    case KvType::kF16:
    case KvType::kBF16:
      return 16;
    case KvType::kQ8_0:
    case KvType::kInt8:
    case KvType::kFp8:
      return 8;
    case KvType::kQ4_0:
    case KvType::kTurbo4:
      return 4;
    case KvType::kTurbo3:
      return 3;
  }
  return 32;
}

bool KvTypeIsQuantized(KvType t) {
  return KvCodeBits(t) <= 8;
}

bool KvTypeIsRotated(KvType t) {
  return KvTypeIsQuantized(t);
}

bool KvKeyOffsetFollowsRope(KvType t) {
  return KvTypeIsQuantized(t) && KvCodeBits(t) <= 4;
}

int32_t KvGroupSize(KvType t, int32_t head_dim) {
  if (!KvTypeIsQuantized(t)) return 0;
  if (t == KvType::kInt8 || t == KvType::kFp8) return head_dim;
  // Small groups keep one outlier from flattening its neighbours; 32 is GGML's block.
  for (int32_t g : {32, 16, 8}) {
    if (head_dim % g == 0) return g;
  }
  return head_dim;
}

Status ValidateKvType(KvType t, int32_t head_dim) {
  if (KvTypeIsQuantized(t) && (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 1024)) {
    return Status::Error(
        StrFormat("KV cache type %s needs a head size that is a multiple of 8 up to 1024; this "
                  "model's is %d (use "
                  "f16, bf16 or f32)",
                  std::string(KvTypeName(t)).c_str(), head_dim));
  }
  return Status::Ok();
}

size_t KvValueRowBytes(KvType t, int32_t head_dim) {
  return static_cast<size_t>(head_dim) * KvCodeBits(t) / 8;
}

size_t KvHeadBlockBytes(KvType t, int32_t head_dim) {
  const size_t data = 16 * KvValueRowBytes(t, head_dim);
  const int32_t g = KvGroupSize(t, head_dim);
  const size_t scales = g == 0 ? 0 : 16 * static_cast<size_t>(head_dim / g) * sizeof(uint16_t);
  return data + scales;
}

double KvBitsPerElement(KvType t, int32_t head_dim) {
  return 8.0 * static_cast<double>(KvHeadBlockBytes(t, head_dim)) / (16.0 * head_dim);
}

}  // namespace kvs
