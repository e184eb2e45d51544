// UTF-8 coding, code point classes for the pre-tokenizers, and GPT-2's byte <-> code point
// mapping. Classes come from generated range tables (tools/gen_unicode_tables.py), never
// from std::regex or the C locale, which do not know Unicode categories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvs::unicode {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// The lead byte's announced sequence length; 1 for ASCII and for bytes that cannot start a
// sequence (so a scanner always advances).
inline size_t Utf8SeqLen(uint8_t lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return lead < 0xF8 ? 4 : 1;
}

enum class Utf8Status { kValid, kIncomplete, kInvalid };

// Checks the sequence starting at s[pos]. kValid sets *len to its length; kIncomplete means
// the bytes up to the end of `s` are a valid beginning that more bytes could complete.
// Overlong forms, surrogates and code points past U+10FFFF are invalid.
Utf8Status CheckUtf8(std::string_view s, size_t pos, size_t* len);

// Decodes the code point at s[*pos] and advances *pos. A byte that does not start a valid
// sequence decodes to U+FFFD and advances by one, so the caller can keep the raw byte.
uint32_t DecodeUtf8(std::string_view s, size_t* pos);

void AppendUtf8(uint32_t cp, std::string* out);
inline std::string EncodeUtf8(uint32_t cp) {
  std::string s;
  AppendUtf8(cp, &s);
  return s;
}

// Replaces every invalid byte with U+FFFD.
std::string SanitizeUtf8(std::string_view s);

// General category groups (values fixed by the generated table).
enum class Category : uint8_t {
  kUndefined = 0,    // unassigned
  kNumber = 1,       // \p{N}
  kLetter = 2,       // \p{L}
  kSeparator = 3,    // \p{Z}
  kMark = 4,         // \p{M}
  kPunctuation = 5,  // \p{P}
  kSymbol = 6,       // \p{S}
  kControl = 7,      // \p{C} (assigned)
};

Category GetCategory(uint32_t cp);
// The Unicode White_Space property, i.e. what \s matches in Python and Rust regexes.
bool IsWhitespace(uint32_t cp);

inline bool IsLetter(uint32_t cp) {
  return GetCategory(cp) == Category::kLetter;
}
inline bool IsNumber(uint32_t cp) {
  return GetCategory(cp) == Category::kNumber;
}
inline bool IsPunctuation(uint32_t cp) {
  return GetCategory(cp) == Category::kPunctuation;
}

// ASCII-only case folding: the contraction rules ('s, 'T, ...) only ever compare against
// ASCII letters, and no non-ASCII code point lowercases to one of them.
inline uint32_t AsciiToLower(uint32_t cp) {
  return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
}

// GPT-2's reversible byte -> printable code point mapping (bytes_to_unicode()).
uint32_t ByteToCodepoint(uint8_t byte);
// The UTF-8 of ByteToCodepoint(byte), precomputed.
const std::string& ByteToUtf8(uint8_t byte);
// The inverse; -1 for code points outside the mapping.
int CodepointToByte(uint32_t cp);

}  // namespace kvs::unicode
