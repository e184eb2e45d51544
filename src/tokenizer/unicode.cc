#include "tokenizer/unicode.h"

#include <algorithm>
#include <array>
#include <vector>

#include "tokenizer/unicode_tables.h"

namespace kvs::unicode {
namespace {

Category LookupRange(uint32_t cp) {
  const auto* begin = tables::kCategoryRanges;
  const auto* end = begin + tables::kNumCategoryRanges;
  const auto* it = std::upper_bound(
      begin, end, cp, [](uint32_t c, const tables::CategoryRange& r) { return c < r.first; });
  if (it == begin) return Category::kUndefined;
  return static_cast<Category>((it - 1)->category);
}

constexpr uint8_t kWhitespaceBit = 0x80;

// The Basic Multilingual Plane covers nearly all text, so it gets a direct table (64 KiB);
// the other planes take a binary search.
const std::array<uint8_t, 0x10000>& BmpTable() {
  static const auto* table = [] {
    auto* t = new std::array<uint8_t, 0x10000>();
    for (size_t i = 0; i < tables::kNumCategoryRanges; ++i) {
      const uint32_t first = tables::kCategoryRanges[i].first;
      if (first >= 0x10000) break;
      const uint32_t last = i + 1 < tables::kNumCategoryRanges
                                ? std::min<uint32_t>(tables::kCategoryRanges[i + 1].first, 0x10000)
                                : 0x10000;
      for (uint32_t cp = first; cp < last; ++cp) (*t)[cp] = tables::kCategoryRanges[i].category;
    }
    for (size_t i = 0; i < tables::kNumWhiteSpace; ++i) {
      (*t)[tables::kWhiteSpace[i]] |= kWhitespaceBit;  // all White_Space is in the BMP
    }
    return t;
  }();
  return *table;
}

struct ByteMaps {
  uint32_t byte_to_cp[256];
  std::string byte_to_utf8[256];
  // Every mapped code point is below 0x144 (256 + 68).
  int16_t cp_to_byte[0x144];
};

const ByteMaps& GetByteMaps() {
  static const ByteMaps* maps = [] {
    auto* m = new ByteMaps();
    std::fill(std::begin(m->cp_to_byte), std::end(m->cp_to_byte), int16_t{-1});
    // Printable Latin-1 bytes stand for themselves; the rest (controls, space, DEL, NBSP,
    // soft hyphen) are shifted to U+0100 onwards in byte order, so no byte maps to whitespace.
    auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable(b) ? static_cast<uint32_t>(b) : next++;
      m->byte_to_cp[b] = cp;
      m->byte_to_utf8[b] = EncodeUtf8(cp);
      m->cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return *maps;
}

}  // namespace

Utf8Status CheckUtf8(std::string_view s, size_t pos, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return Utf8Status::kValid;
  }
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // past U+10FFFF
  } else {
    return Utf8Status::kInvalid;
  }
  for (size_t i = 1; i < n; ++i) {
    if (pos + i >= s.size()) return Utf8Status::kIncomplete;
    const auto b = static_cast<uint8_t>(s[pos + i]);
    const uint8_t min = i == 1 ? lo : 0x80;
    const uint8_t max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return Utf8Status::kInvalid;
  }
  *len = n;
  return Utf8Status::kValid;
}

uint32_t DecodeUtf8(std::string_view s, size_t* pos) {
  size_t len = 0;
  if (CheckUtf8(s, *pos, &len) != Utf8Status::kValid) {
    ++*pos;
    return kReplacementChar;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + *pos);
  *pos += len;
  switch (len) {
    case 1:
      return p[0];
    case 2:
      return (uint32_t{p[0] & 0x1Fu} << 6) | (p[1] & 0x3Fu);
    case 3:
      return (uint32_t{p[0] & 0x0Fu} << 12) | (uint32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu);
    default:
      return (uint32_t{p[0] & 0x07u} << 18) | (uint32_t{p[1] & 0x3Fu} << 12) |
             (uint32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
  }
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = kReplacementChar;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    size_t len = 0;
    if (CheckUtf8(s, pos, &len) == Utf8Status::kValid) {
      out.append(s.substr(pos, len));
      pos += len;
    } else {
      AppendUtf8(kReplacementChar, &out);
      ++pos;
    }
  }
  return out;
}

Category GetCategory(uint32_t cp) {
  if (cp < 0x10000) return static_cast<Category>(BmpTable()[cp] & ~kWhitespaceBit);
  if (cp > 0x10FFFF) return Category::kUndefined;
  return LookupRange(cp);
}

bool IsWhitespace(uint32_t cp) {
  return cp < 0x10000 && (BmpTable()[cp] & kWhitespaceBit);
}

uint32_t ByteToCodepoint(uint8_t byte) {
  return GetByteMaps().byte_to_cp[byte];
}

const std::string& ByteToUtf8(uint8_t byte) {
  return GetByteMaps().byte_to_utf8[byte];
}

int CodepointToByte(uint32_t cp) {
  return cp < 0x144 ? GetByteMaps().cp_to_byte[cp] : -1;
}

}  // namespace kvs::unicode
