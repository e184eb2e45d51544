#include "tokenizer/pretokenize.h"

#include <cstdint>
#include <string>

#include "tokenizer/unicode.h"

namespace kvs {
namespace {

using unicode::IsWhitespace;

// A half-open range of code point indices.
struct Span {
  uint32_t begin;
  uint32_t end;
};

// Regex split semantics ("Isolated" in HF tokenizers): every match becomes a piece and so
// does every stretch of text between matches.
class Emitter {
 public:
  Emitter(Span piece, std::vector<Span>* out) : prev_(piece.begin), end_(piece.end), out_(out) {}
  void Match(uint32_t begin, uint32_t end) {
    if (begin > prev_) out_->push_back({prev_, begin});
    out_->push_back({begin, end});
    prev_ = end;
  }
  ~Emitter() {
    if (end_ > prev_) out_->push_back({prev_, end_});
  }

 private:
  uint32_t prev_;
  uint32_t end_;
  std::vector<Span>* out_;
};

enum class Cls { kLetter, kNumber, kSpace, kOther };

Cls Classify(uint32_t cp) {
  if (IsWhitespace(cp)) return Cls::kSpace;
  switch (unicode::GetCategory(cp)) {
    case unicode::Category::kLetter:
      return Cls::kLetter;
    case unicode::Category::kNumber:
      return Cls::kNumber;
    default:
      return Cls::kOther;
  }
}

// 's|'t|'re|'ve|'m|'ll|'d at p; returns the match length or 0.
uint32_t MatchContraction(const uint32_t* cp, uint32_t p, uint32_t e, bool ignore_case) {
  if (cp[p] != '\'' || p + 1 >= e) return 0;
  auto lower = [&](uint32_t c) { return ignore_case ? unicode::AsciiToLower(c) : c; };
  const uint32_t a = lower(cp[p + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (p + 2 >= e) return 0;
  const uint32_t b = lower(cp[p + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// A run of whitespace at p: \s+(?!\S) gives back the last space when a word follows, so
// that the word can take it as its leading space; \s+ takes a single one.
uint32_t MatchSpaces(const uint32_t* cp, uint32_t p, uint32_t e) {
  uint32_t q = p;
  while (q < e && IsWhitespace(cp[q])) ++q;
  const uint32_t n = q - p;
  return (n > 1 && q < e) ? n - 1 : n;
}

uint32_t RunOf(const uint32_t* cp, uint32_t q, uint32_t e, Cls cls) {
  while (q < e && Classify(cp[q]) == cls) ++q;
  return q;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void SplitGpt2(const uint32_t* cp, Span piece, std::vector<Span>* out) {
  const uint32_t e = piece.end;
  for (uint32_t p = piece.begin; p < e;) {
    uint32_t len = MatchContraction(cp, p, e, /*ignore_case=*/false);
    if (len == 0) {
      const uint32_t k = (cp[p] == ' ' && p + 1 < e) ? p + 1 : p;
      const Cls cls = Classify(cp[k]);
      len = cls == Cls::kSpace ? MatchSpaces(cp, p, e) : RunOf(cp, k, e, cls) - p;
    }
    out->push_back({p, p + len});
    p += len;
  }
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+     with N = 3 (Llama 3) or 1 (Qwen2).
void SplitLlama3(const uint32_t* cp, Span piece, uint32_t max_digits, std::vector<Span>* out) {
  const uint32_t e = piece.end;
  auto is_newline = [](uint32_t c) { return c == '\r' || c == '\n'; };
  for (uint32_t p = piece.begin; p < e;) {
    uint32_t len = MatchContraction(cp, p, e, /*ignore_case=*/true);
    if (len == 0) {
      const uint32_t c = cp[p];
      const Cls cls = Classify(c);
      if (cls == Cls::kLetter) {
        len = RunOf(cp, p, e, Cls::kLetter) - p;
      } else if (!is_newline(c) && cls != Cls::kNumber && p + 1 < e &&
                 Classify(cp[p + 1]) == Cls::kLetter) {
        len = RunOf(cp, p + 1, e, Cls::kLetter) - p;
      } else if (cls == Cls::kNumber) {
        len = 1;
        while (len < max_digits && p + len < e && Classify(cp[p + len]) == Cls::kNumber) ++len;
      } else {
        const uint32_t k = (c == ' ' && p + 1 < e) ? p + 1 : p;
        if (Classify(cp[k]) == Cls::kOther) {
          uint32_t q = RunOf(cp, k, e, Cls::kOther);
          while (q < e && is_newline(cp[q])) ++q;
          len = q - p;
        } else {
          // c is whitespace here. \s*[\r\n]+ ends after the run's last newline.
          uint32_t q = p;
          uint32_t after_newline = 0;
          while (q < e && IsWhitespace(cp[q])) {
            if (is_newline(cp[q])) after_newline = q + 1;
            ++q;
          }
          len = after_newline ? after_newline - p : MatchSpaces(cp, p, e);
        }
      }
    }
    out->push_back({p, p + len});
    p += len;
  }
}

// Character classes of regexes that llama.cpp runs through std::wregex see non-ASCII
// whitespace as U+000B, so such code points never fall inside an explicit range.
bool OutsideWideClass(uint32_t c) {
  return c > 0x7F && IsWhitespace(c);
}

template <size_t N>
bool InRanges(uint32_t c, const uint32_t (&ranges)[N][2]) {
  if (OutsideWideClass(c)) return false;
  for (const auto& r : ranges) {
    if (c >= r[0] && c <= r[1]) return true;
  }
  return false;
}

// DeepSeek LLM's letter class: ASCII letters plus the cased letters of many scripts.
constexpr uint32_t kDeepseekLetters[][2] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

// DeepSeek LLM's punctuation class: ASCII !-/ and :-~ (which includes the ASCII letters),
// fullwidth forms, curly quotes and the ideographic full stops.
constexpr uint32_t kDeepseekPunct[][2] = {
    {0x21, 0x2F},     {0x3A, 0x7E},     {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
};

// CJK ideographs (U+4E00..U+9FA5), U+0800..U+4E00 and Hangul syllables and jamo.
constexpr uint32_t kDeepseekCjk[][2] = {{0x4E00, 0x9FA5}, {0x800, 0x4E00}, {0xAC00, 0xD7FF}};

// [C]+ or, with `optional_space`, \s?[C]+; leftmost matches, greedy.
template <typename Pred>
void SplitRuns(const uint32_t* cp, Span piece, bool optional_space, Pred in_class,
               std::vector<Span>* out) {
  Emitter emit(piece, out);
  const uint32_t e = piece.end;
  for (uint32_t p = piece.begin; p < e;) {
    uint32_t start;
    if (optional_space && IsWhitespace(cp[p]) && p + 1 < e && in_class(cp[p + 1])) {
      start = p + 1;
    } else if (in_class(cp[p])) {
      start = p;
    } else {
      ++p;
      continue;
    }
    uint32_t q = start + 1;
    while (q < e && in_class(cp[q])) ++q;
    emit.Match(p, q);
    p = q;
  }
}

// [C]: every code point of the class on its own.
template <typename Pred>
void SplitSingles(const uint32_t* cp, Span piece, Pred in_class, std::vector<Span>* out) {
  Emitter emit(piece, out);
  for (uint32_t p = piece.begin; p < piece.end; ++p) {
    if (in_class(cp[p])) emit.Match(p, p + 1);
  }
}

// \s+$
void SplitTrailingSpace(const uint32_t* cp, Span piece, std::vector<Span>* out) {
  Emitter emit(piece, out);
  uint32_t q = piece.end;
  while (q > piece.begin && IsWhitespace(cp[q - 1])) --q;
  if (q < piece.end) emit.Match(q, piece.end);
}

// [0-9][0-9][0-9]
void SplitDigitTriples(const uint32_t* cp, Span piece, std::vector<Span>* out) {
  Emitter emit(piece, out);
  auto digit = [&](uint32_t i) { return cp[i] >= '0' && cp[i] <= '9'; };
  for (uint32_t p = piece.begin; p + 3 <= piece.end;) {
    if (digit(p) && digit(p + 1) && digit(p + 2)) {
      emit.Match(p, p + 3);
      p += 3;
    } else {
      ++p;
    }
  }
}

bool IsNewline(uint32_t c) {
  return c == '\r' || c == '\n';
}
bool IsNumberCp(uint32_t c) {
  return unicode::IsNumber(c);
}
bool IsLetterCp(uint32_t c) {
  return unicode::IsLetter(c);
}
bool IsPunctCp(uint32_t c) {
  return unicode::IsPunctuation(c);
}
// [\p{P}\$\+<=>\^~\|]
bool IsDefaultPunct(uint32_t c) {
  return unicode::IsPunctuation(c) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' ||
         c == '^' || c == '~' || c == '|';
}
bool IsDeepseekLetter(uint32_t c) {
  return InRanges(c, kDeepseekLetters);
}
bool IsDeepseekPunct(uint32_t c) {
  return InRanges(c, kDeepseekPunct);
}
bool IsDeepseekCjk(uint32_t c) {
  return InRanges(c, kDeepseekCjk);
}

// Applies one regex of a sequence to every current piece.
enum class Stage {
  kGpt2,
  kLlama3,
  kQwen2,
  kNewlines,            // [\r\n]
  kDefaultPunctRuns,    // [\p{P}\$\+<=>\^~\|]+
  kNumberRuns,          // \p{N}+
  kNumberSingles,       // \p{N}
  kDigitTriples,        // [0-9][0-9][0-9]
  kLetterRunsSpace,     // \s?\p{L}+
  kPunctRunsSpace,      // \s?\p{P}+
  kDeepseekLetterRuns,  // \s?[A-Za-zµÀ-Ö...]+
  kDeepseekPunctRuns,   // \s?[!-/:-~！-／：-～‘-‟　-。]+
  kTrailingSpace,       // \s+$
  kCjkRuns,             // [一-龥ࠀ-一가-퟿]+
};

void ApplyStage(Stage stage, const uint32_t* cp, Span piece, std::vector<Span>* out) {
  switch (stage) {
    case Stage::kGpt2:
      return SplitGpt2(cp, piece, out);
    case Stage::kLlama3:
      return SplitLlama3(cp, piece, 3, out);
    case Stage::kQwen2:
      return SplitLlama3(cp, piece, 1, out);
    case Stage::kNewlines:
      return SplitSingles(cp, piece, IsNewline, out);
    case Stage::kDefaultPunctRuns:
      return SplitRuns(cp, piece, false, IsDefaultPunct, out);
    case Stage::kNumberRuns:
      return SplitRuns(cp, piece, false, IsNumberCp, out);
    case Stage::kNumberSingles:
      return SplitSingles(cp, piece, IsNumberCp, out);
    case Stage::kDigitTriples:
      return SplitDigitTriples(cp, piece, out);
    case Stage::kLetterRunsSpace:
      return SplitRuns(cp, piece, true, IsLetterCp, out);
    case Stage::kPunctRunsSpace:
      return SplitRuns(cp, piece, true, IsPunctCp, out);
    case Stage::kDeepseekLetterRuns:
      return SplitRuns(cp, piece, true, IsDeepseekLetter, out);
    case Stage::kDeepseekPunctRuns:
      return SplitRuns(cp, piece, true, IsDeepseekPunct, out);
    case Stage::kTrailingSpace:
      return SplitTrailingSpace(cp, piece, out);
    case Stage::kCjkRuns:
      return SplitRuns(cp, piece, false, IsDeepseekCjk, out);
  }
}

std::vector<Stage> StagesFor(PreTokenizerKind kind) {
  switch (kind) {
    case PreTokenizerKind::kGpt2:
      return {Stage::kGpt2};
    case PreTokenizerKind::kLlama3:
      return {Stage::kLlama3};
    case PreTokenizerKind::kQwen2:
      return {Stage::kQwen2};
    case PreTokenizerKind::kDeepseekLlm:
      return {Stage::kNewlines,          Stage::kDeepseekLetterRuns,
              Stage::kDeepseekPunctRuns, Stage::kTrailingSpace,
              Stage::kCjkRuns,           Stage::kNumberRuns};
    case PreTokenizerKind::kDeepseekCoder:
      return {Stage::kNewlines, Stage::kLetterRunsSpace, Stage::kPunctRunsSpace, Stage::kCjkRuns,
              Stage::kNumberSingles};
    case PreTokenizerKind::kStarcoder:
      return {Stage::kNumberSingles, Stage::kGpt2};
    case PreTokenizerKind::kDefault:
      return {Stage::kDefaultPunctRuns, Stage::kGpt2, Stage::kNumberRuns, Stage::kDigitTriples};
  }
  return {Stage::kGpt2};
}

}  // namespace

std::optional<PreTokenizerConfig> LookupPreTokenizer(std::string_view name) {
  using K = PreTokenizerKind;
  struct Entry {
    const char* name;
    PreTokenizerConfig config;
  };
  // Names as llama.cpp's converter writes them into tokenizer.ggml.pre.
  static const Entry kEntries[] = {
      {"", {K::kDefault, false, false}},
      {"default", {K::kDefault, false, false}},
      {"gpt-2", {K::kGpt2, false, false}},
      {"phi-2", {K::kGpt2, false, false}},
      {"mpt", {K::kGpt2, false, false}},
      {"olmo", {K::kGpt2, false, false}},
      {"jais", {K::kGpt2, false, false}},
      {"llama3", {K::kLlama3, true, true}},
      {"llama-v3", {K::kLlama3, true, true}},
      {"llama-bpe", {K::kLlama3, true, true}},
      {"falcon3", {K::kLlama3, true, true}},
      {"pixtral", {K::kLlama3, true, true}},
      {"dbrx", {K::kLlama3, false, false}},
      {"smaug-bpe", {K::kLlama3, false, false}},
      {"qwen2", {K::kQwen2, false, false}},
      {"deepseek-r1-qwen", {K::kQwen2, false, false}},
      {"stablelm2", {K::kQwen2, false, false}},
      {"deepseek-llm", {K::kDeepseekLlm, false, false}},
      {"deepseek-coder", {K::kDeepseekCoder, false, false}},
      {"starcoder", {K::kStarcoder, false, false}},
      {"refact", {K::kStarcoder, false, false}},
      {"command-r", {K::kStarcoder, false, false}},
      {"smollm", {K::kStarcoder, false, false}},
      {"codeshell", {K::kStarcoder, false, false}},
  };
  for (const auto& e : kEntries) {
    if (name == e.name) return e.config;
  }
  return std::nullopt;
}

void PreTokenize(PreTokenizerKind kind, std::string_view text,
                 std::vector<std::string_view>* words) {
  words->clear();
  if (text.empty()) return;
  std::vector<uint32_t> cps;
  std::vector<uint32_t> offsets;  // byte offset of each code point, plus the end
  cps.reserve(text.size());
  offsets.reserve(text.size() + 1);
  for (size_t pos = 0; pos < text.size();) {
    offsets.push_back(static_cast<uint32_t>(pos));
    cps.push_back(unicode::DecodeUtf8(text, &pos));
  }
  offsets.push_back(static_cast<uint32_t>(text.size()));

  std::vector<Span> pieces{{0, static_cast<uint32_t>(cps.size())}};
  std::vector<Span> next;
  for (Stage stage : StagesFor(kind)) {
    next.clear();
    next.reserve(pieces.size() * 2);
    for (const Span& piece : pieces) ApplyStage(stage, cps.data(), piece, &next);
    pieces.swap(next);
  }
  words->reserve(pieces.size());
  for (const Span& s : pieces) {
    words->push_back(text.substr(offsets[s.begin], offsets[s.end] - offsets[s.begin]));
  }
}

}  // namespace kvs
