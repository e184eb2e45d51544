#include "tensor/dtype.h"

#include <cctype>
#include <cmath>
#include <cstring>
#include <string>

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace kvs {

std::optional<DTypeInfo> GetDTypeInfo(uint32_t t) {
  switch (t) {
    case 0:
      return DTypeInfo{"f32", 1, 4, true};
    case 1:
      return DTypeInfo{"f16", 1, 2, true};
    case 2:
      return DTypeInfo{"q4_0", 32, 18, true};
    case 3:
      return DTypeInfo{"q4_1", 32, 20, true};
    case 6:
      return DTypeInfo{"q5_0", 32, 22, true};
    case 7:
      return DTypeInfo{"q5_1", 32, 24, true};
    case 8:
      return DTypeInfo{"q8_0", 32, 34, true};
    case 9:
      return DTypeInfo{"q8_1", 32, 36, false};
    case 10:
      return DTypeInfo{"q2_k", 256, 84, true};
    case 11:
      return DTypeInfo{"q3_k", 256, 110, true};
    case 12:
      return DTypeInfo{"q4_k", 256, 144, true};
    case 13:
      return DTypeInfo{"q5_k", 256, 176, true};
    case 14:
      return DTypeInfo{"q6_k", 256, 210, true};
    case 15:
      return DTypeInfo{"q8_k", 256, 292, false};
    case 16:
      return DTypeInfo{"iq2_xxs", 256, 66, false};
    case 17:
      return DTypeInfo{"iq2_xs", 256, 74, false};
    case 18:
      return DTypeInfo{"iq3_xxs", 256, 98, false};
    case 19:
      return DTypeInfo{"iq1_s", 256, 50, false};
    case 20:
      return DTypeInfo{"iq4_nl", 32, 18, false};
    case 21:
      return DTypeInfo{"iq3_s", 256, 110, false};
    case 22:
      return DTypeInfo{"iq2_s", 256, 82, false};
    case 23:
      return DTypeInfo{"iq4_xs", 256, 136, false};
    case 24:
      return DTypeInfo{"i8", 1, 1, false};
    case 25:
      return DTypeInfo{"i16", 1, 2, false};
    case 26:
      return DTypeInfo{"i32", 1, 4, false};
    case 27:
      return DTypeInfo{"i64", 1, 8, false};
    case 28:
      return DTypeInfo{"f64", 1, 8, false};
    case 29:
      return DTypeInfo{"iq1_m", 256, 56, false};
    case 30:
      return DTypeInfo{"bf16", 1, 2, true};
    case 34:
      return DTypeInfo{"tq1_0", 256, 54, false};
    case 35:
      return DTypeInfo{"tq2_0", 256, 66, false};
    default:
      return std::nullopt;
  }
}

std::string_view DTypeName(DType t) {
  auto info = GetDTypeInfo(static_cast<uint32_t>(t));
  return info ? info->name : "unknown";
}

std::optional<DType> ParseDType(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (uint32_t t = 0; t < 40; ++t) {
    auto info = GetDTypeInfo(t);
    if (info && info->name == lower) return static_cast<DType>(t);
  }
  return std::nullopt;
}

float F16ToF32(uint16_t h) {
#ifdef __F16C__
  // The conversion instruction, where the build has it (every value but a NaN: the instruction
  // quiets a signalling one, the portable code keeps its payload as it is).
  if ((h & 0x7c00u) != 0x7c00u || (h & 0x3ffu) == 0) return _cvtsh_ss(h);
#endif
  return F16ToF32Portable(h);
}

float F16ToF32Portable(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t F32ToF16(float f) {
#ifdef __F16C__
  // The instruction rounds to nearest even as the portable code does; NaNs take the portable
  // path (the instruction keeps more of a NaN's payload).
  if (!std::isnan(f)) return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#endif
  return F32ToF16Portable(f);
}

uint16_t F32ToF16Portable(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    uint32_t e = abs >> 23;
    uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e;  // half subnormal mantissa = m * 2^(e - 126)
    uint32_t result = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (result & 1))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t e = (abs >> 23) - 127 + 15;
  uint32_t m = abs & 0x7fffffu;
  uint32_t result = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1))) ++result;  // may carry into exp: fine
  return static_cast<uint16_t>(sign | result);
}

uint16_t F32ToBF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

}  // namespace kvs
