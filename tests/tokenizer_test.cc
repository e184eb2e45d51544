#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "testing/test_models.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace kvs {
namespace {

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& path) {
  auto file = gguf::File::Open(path);
  EXPECT_TRUE(file.ok()) << file.error();
  if (!file.ok()) return nullptr;
  auto tok = Tokenizer::FromGguf(**file);
  EXPECT_TRUE(tok.ok()) << tok.error();
  if (!tok.ok()) return nullptr;
  return std::move(tok).value();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Makes control characters and non-ASCII visible in failure messages.
std::string Escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02X", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

std::string Join(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) {
    if (!out.empty()) out += ' ';
    out += std::to_string(id);
  }
  return out;
}

struct VocabCase {
  std::string input;
  std::vector<int32_t> expected;
};

// llama.cpp's test-tokenizer-0 format: inputs separated by "\n__ggml_vocab_test__\n" (a
// trailing separator ends the list), one line of expected ids per input.
std::vector<VocabCase> ReadVocabCases(const std::string& inp_path, const std::string& out_path) {
  const std::string raw = ReadFile(inp_path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t pos = 0; pos < raw.size();) {
    const size_t next = raw.find(sep, pos);
    if (next == std::string::npos) {
      inputs.push_back(raw.substr(pos));
      break;
    }
    inputs.push_back(raw.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream out(out_path);
  std::vector<VocabCase> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    VocabCase c;
    if (i < inputs.size()) c.input = inputs[i];
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.expected.push_back(id);
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(inputs.size(), cases.size()) << "input and output files disagree on the count";
  return cases;
}

class VocabFileTest : public ::testing::TestWithParam<const char*> {};

TEST_P(VocabFileTest, MatchesReferenceTokenization) {
  const std::string name = std::string("vocab-only/ggml-vocab-") + GetParam() + ".gguf";
  KVS_REQUIRE_MODEL(path, name);
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  const auto cases = ReadVocabCases(path + ".inp", path + ".out");
  ASSERT_FALSE(cases.empty());
  int passed = 0;
  for (const VocabCase& c : cases) {
    const std::vector<int32_t> got = tok->Encode(c.input, /*add_special=*/false,
                                                 /*parse_special=*/false);
    if (got == c.expected) {
      ++passed;
    } else {
      ADD_FAILURE() << GetParam() << ": input '" << Escape(c.input)
                    << "'\n  got:      " << Join(got) << "\n  expected: " << Join(c.expected);
    }
  }
  std::printf("[ %s ] %d / %zu cases match\n", GetParam(), passed, cases.size());
}

// Byte-level BPE loses nothing, and SentencePiece with byte fallback neither: the leading
// space that add_space_prefix inserts is what Decode strips again.
TEST_P(VocabFileTest, DecodeInvertsEncode) {
  const std::string name = std::string("vocab-only/ggml-vocab-") + GetParam() + ".gguf";
  KVS_REQUIRE_MODEL(path, name);
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  for (const VocabCase& c : ReadVocabCases(path + ".inp", path + ".out")) {
    EXPECT_EQ(Escape(tok->Decode(tok->Encode(c.input, false, false))), Escape(c.input));
    EXPECT_EQ(Escape(tok->Decode(tok->Encode(c.input, true, false))), Escape(c.input));
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabs, VocabFileTest,
                         ::testing::Values("llama-spm", "gpt-2", "deepseek-llm"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

TEST(GptTwoTokenizer, RoundTripsArbitraryText) {
  KVS_REQUIRE_MODEL(path, "vocab-only/ggml-vocab-gpt-2.gguf");
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  const std::string texts[] = {
      "int main() {\n\treturn 0;\n}\n",
      "  leading and trailing spaces   ",
      "Ünïcödé — ✓ “quotes” 日本語のテキスト 🦙🦙",
      "mixed\r\nline\rendings\n\n\n",
      std::string("embedded\0nul", 12),
      "invalid \xff\xfe utf-8 \xe2\x82 here",
      "<|endoftext|> is plain text without parse_special",
  };
  for (const std::string& t : texts) {
    EXPECT_EQ(Escape(tok->Decode(tok->Encode(t, false, false))), Escape(t));
  }
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->Encode("<|endoftext|>", false, true), std::vector<int32_t>{50256});
  EXPECT_TRUE(tok->IsEndOfGeneration(50256));
  EXPECT_EQ(tok->TokenToPiece(50256), "");
  EXPECT_EQ(tok->TokenToPiece(50256, /*show_special=*/true), "<|endoftext|>");
}

TEST(DeepseekTokenizer, SplitsUserDefinedTokensOutOfPlainText) {
  KVS_REQUIRE_MODEL(path, "vocab-only/ggml-vocab-deepseek-llm.gguf");
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  // 'ü' is a user-defined token (100014): it is matched even without parse_special.
  const std::vector<int32_t> ids = tok->Encode("Müller", false, false);
  EXPECT_NE(std::find(ids.begin(), ids.end(), 100014), ids.end()) << Join(ids);
  EXPECT_EQ(tok->Decode(ids), "Müller");
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->Encode("hi", true, false).front(), 100000);
  EXPECT_TRUE(tok->IsEndOfGeneration(100001));
}

TEST(SpmTokenizer, ByteFallbackForCharactersWithoutToken) {
  KVS_REQUIRE_MODEL(path, "vocab-only/ggml-vocab-llama-spm.gguf");
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  // U+1F999 (llama) is not in the vocab: its four UTF-8 bytes become <0xF0> <0x9F> <0xA6>
  // <0x99>, which are ids 3 + byte.
  const std::vector<int32_t> ids = tok->Encode("\xF0\x9F\xA6\x99", false, false);
  ASSERT_EQ(ids.size(), 5u) << Join(ids);
  EXPECT_EQ(tok->RawToken(ids[0]), "\xE2\x96\x81");  // the prefix space
  EXPECT_EQ((std::vector<int32_t>(ids.begin() + 1, ids.end())),
            (std::vector<int32_t>{3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99}));
  EXPECT_EQ(tok->TokenToPiece(3 + 0x0A), "\n");
  EXPECT_EQ(tok->Decode(ids), "\xF0\x9F\xA6\x99");
  // Invalid UTF-8 survives through byte tokens too.
  EXPECT_EQ(Escape(tok->Decode(tok->Encode("a\xff\xc3", false, false))), Escape("a\xff\xc3"));
}

TEST(SpmTokenizer, SpecialTokensOnlyWithParseSpecial) {
  KVS_REQUIRE_MODEL(path, "vocab-only/ggml-vocab-llama-spm.gguf");
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> plain = tok->Encode("<s>hi</s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0) << Join(plain);
  const std::vector<int32_t> parsed = tok->Encode("<s>hi</s>", false, true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  // Text after a special token gets the prefix space, as after the start of the text.
  EXPECT_EQ(tok->Decode(parsed), "hi");
  EXPECT_EQ(tok->Decode(tok->Encode("hi", false, false)), "hi");
}

TEST(Stories260K, BosHandling) {
  KVS_REQUIRE_MODEL(path, "stories260K.gguf");
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->add_bos());  // no add_bos_token key: SentencePiece's default
  EXPECT_FALSE(tok->add_eos());
  EXPECT_EQ(tok->Encode("", true, false), std::vector<int32_t>{1});
  EXPECT_TRUE(tok->Encode("", false, false).empty());
  const std::vector<int32_t> with_bos = tok->Encode("Once upon a time", true, false);
  const std::vector<int32_t> without = tok->Encode("Once upon a time", false, false);
  ASSERT_EQ(with_bos.size(), without.size() + 1);
  EXPECT_EQ(with_bos[0], 1);
  EXPECT_EQ(std::vector<int32_t>(with_bos.begin() + 1, with_bos.end()), without);
  EXPECT_EQ(without, (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_EQ(tok->Decode(with_bos), "Once upon a time");
  EXPECT_TRUE(tok->IsEndOfGeneration(2));
  EXPECT_FALSE(tok->IsEndOfGeneration(1));
}

TEST(Stories260K, DecodesGoldenGreedyOutput) {
  KVS_REQUIRE_MODEL(path, "stories260K.greedy256.expected.txt");
  KVS_REQUIRE_MODEL(model, "stories260K.gguf");
  auto tok = LoadTokenizer(model);
  ASSERT_NE(tok, nullptr);
  const std::string golden = ReadFile(path);
  const size_t ids_at = golden.find("ids:\n");
  const size_t text_at = golden.find("text:\n");
  ASSERT_NE(ids_at, std::string::npos);
  ASSERT_NE(text_at, std::string::npos);
  std::istringstream ids_in(golden.substr(ids_at + 5, text_at - ids_at - 5));
  std::vector<int32_t> ids;
  for (int32_t id; ids_in >> id;) ids.push_back(id);
  ASSERT_EQ(ids.size(), 256u);
  std::string text = golden.substr(text_at + 6);
  std::string decoded = tok->Decode(ids);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  while (!decoded.empty() && decoded.back() == '\n') decoded.pop_back();
  EXPECT_EQ(decoded, text);
}

TEST(StreamingDetokenizer, HoldsBackSplitCharacters) {
  KVS_REQUIRE_MODEL(path, "vocab-only/ggml-vocab-llama-spm.gguf");
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  // "a🦙b": the llama is four byte tokens, so three pushes must emit nothing.
  const std::vector<int32_t> ids = tok->Encode(
      "a\xF0\x9F\xA6\x99"
      "b",
      false, false);
  StreamingDetokenizer stream(*tok);
  std::string out;
  std::vector<std::string> emitted;
  for (int32_t id : ids) {
    emitted.push_back(stream.Push(id));
    out += emitted.back();
  }
  out += stream.Flush();
  EXPECT_EQ(out,
            " a\xF0\x9F\xA6\x99"
            "b");  // streaming keeps the prefix space
  int empty = 0;
  for (const std::string& e : emitted) empty += e.empty();
  EXPECT_EQ(empty, 3);
  for (const std::string& e : emitted) {
    EXPECT_EQ(unicode::SanitizeUtf8(e), e) << "emitted invalid UTF-8: " << Escape(e);
  }
}

TEST(StreamingDetokenizer, FlushReplacesUnfinishedCharacter) {
  KVS_REQUIRE_MODEL(path, "vocab-only/ggml-vocab-llama-spm.gguf");
  auto tok = LoadTokenizer(path);
  ASSERT_NE(tok, nullptr);
  StreamingDetokenizer stream(*tok);
  EXPECT_EQ(stream.Push(3 + 0x41), "A");
  EXPECT_EQ(stream.Push(3 + 0xE2), "");
  EXPECT_EQ(stream.Push(3 + 0x82), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.Flush(), "");
  // A byte that can never become valid is replaced at once instead of blocking the stream.
  EXPECT_EQ(stream.Push(3 + 0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.Push(3 + 0xC3), "");
  EXPECT_EQ(stream.Push(3 + 0xA9), "\xC3\xA9");
}

// --- Corrupt or unsupported metadata: an error Status, never a crash. ---

gguf::Writer SpmWriter(int n_tokens) {
  gguf::Writer w;
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (int i = 0; i < n_tokens; ++i) {
    tokens.push_back(std::string(1, 't').append(std::to_string(i)));
    scores.push_back(-static_cast<float>(i));
    types.push_back(1);
  }
  w.Set("tokenizer.ggml.model", gguf::Value::String("llama"));
  w.Set("tokenizer.ggml.tokens", gguf::Value::StringArray(tokens));
  w.Set("tokenizer.ggml.scores", gguf::Value::Float32Array(scores));
  w.Set("tokenizer.ggml.token_type", gguf::Value::Int32Array(types));
  return w;
}

Expected<std::unique_ptr<Tokenizer>> FromWriter(const gguf::Writer& w) {
  auto file = gguf::File::FromBytes(w.Serialize());
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(**file);
}

void ExpectError(const gguf::Writer& w, const std::string& needle) {
  auto tok = FromWriter(w);
  ASSERT_FALSE(tok.ok()) << "expected an error mentioning " << needle;
  EXPECT_NE(tok.error().find(needle), std::string::npos) << tok.error();
  EXPECT_EQ(tok.error().find('\n'), std::string::npos) << "not one line: " << tok.error();
}

TEST(TokenizerMetadata, WellFormedMinimalVocabLoads) {
  auto tok = FromWriter(SpmWriter(8));
  ASSERT_TRUE(tok.ok()) << tok.error();
  EXPECT_EQ((*tok)->n_vocab(), 8);
}

TEST(TokenizerMetadata, MismatchedArrayLengths) {
  gguf::Writer w = SpmWriter(8);
  w.Set("tokenizer.ggml.scores", gguf::Value::Float32Array({0.f, 1.f}));
  ExpectError(w, "tokenizer.ggml.scores");
  w = SpmWriter(8);
  w.Set("tokenizer.ggml.token_type", gguf::Value::Int32Array({1, 1, 1}));
  ExpectError(w, "tokenizer.ggml.token_type");
}

TEST(TokenizerMetadata, BadValues) {
  gguf::Writer w = SpmWriter(8);
  w.Set("tokenizer.ggml.bos_token_id", gguf::Value::Uint32(8));
  ExpectError(w, "bos_token_id");
  w = SpmWriter(8);
  w.Set("tokenizer.ggml.token_type", gguf::Value::Int32Array({1, 1, 1, 1, 1, 1, 1, 42}));
  ExpectError(w, "token_type");
  w = SpmWriter(8);
  w.Set("tokenizer.ggml.tokens", gguf::Value::Int32Array({1, 2, 3}));
  ExpectError(w, "tokenizer.ggml.tokens");
  w = SpmWriter(8);
  w.Set("tokenizer.ggml.model", gguf::Value::String("bert"));
  ExpectError(w, "'bert'");
  w = SpmWriter(8);
  w.Set("tokenizer.ggml.add_bos_token", gguf::Value::Uint32(1));
  ExpectError(w, "add_bos_token");
  // An unset id written as UINT32_MAX is "none", not an error.
  w = SpmWriter(8);
  w.Set("tokenizer.ggml.padding_token_id", gguf::Value::Uint32(0xFFFFFFFFu));
  EXPECT_TRUE(FromWriter(w).ok());
  ExpectError(gguf::Writer(), "tokenizer.ggml.model");
}

TEST(TokenizerMetadata, BpeNeedsMergesAndAKnownPreTokenizer) {
  gguf::Writer w;
  w.Set("tokenizer.ggml.model", gguf::Value::String("gpt2"));
  w.Set("tokenizer.ggml.tokens", gguf::Value::StringArray({"a", "b", "ab"}));
  ExpectError(w, "merges");
  w.Set("tokenizer.ggml.merges", gguf::Value::StringArray({"a b"}));
  w.Set("tokenizer.ggml.pre", gguf::Value::String("no-such-pre"));
  ExpectError(w, "'no-such-pre'");
  w.Set("tokenizer.ggml.pre", gguf::Value::String("gpt-2"));
  w.Set("tokenizer.ggml.merges", gguf::Value::StringArray({"ab"}));
  ExpectError(w, "merges[0]");
}

TEST(BpeTokenizer, MergesInRankOrder) {
  // "abc": the merge "b c" outranks "a b", so the word becomes a + bc, not ab + c.
  gguf::Writer w;
  w.Set("tokenizer.ggml.model", gguf::Value::String("gpt2"));
  w.Set("tokenizer.ggml.pre", gguf::Value::String("gpt-2"));
  w.Set("tokenizer.ggml.tokens", gguf::Value::StringArray({"a", "b", "c", "ab", "bc", "Ġ"}));
  w.Set("tokenizer.ggml.merges", gguf::Value::StringArray({"b c", "a b"}));
  auto tok = FromWriter(w);
  ASSERT_TRUE(tok.ok()) << tok.error();
  EXPECT_EQ((*tok)->Encode("abc", false, false), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ((*tok)->Encode("ab", false, false), (std::vector<int32_t>{3}));
  EXPECT_EQ((*tok)->Encode("a b", false, false), (std::vector<int32_t>{0, 5, 1}));
  EXPECT_EQ((*tok)->Decode({0, 5, 1}), "a b");
}

// --- Unicode and pre-tokenizers. ---

TEST(Unicode, CategoriesAndWhitespace) {
  using unicode::Category;
  EXPECT_EQ(unicode::GetCategory('a'), Category::kLetter);
  EXPECT_EQ(unicode::GetCategory(0x0416), Category::kLetter);  // Ж
  EXPECT_EQ(unicode::GetCategory(0x4E00), Category::kLetter);  // 一
  EXPECT_EQ(unicode::GetCategory('7'), Category::kNumber);
  EXPECT_EQ(unicode::GetCategory(0x00BD), Category::kNumber);  // ½
  EXPECT_EQ(unicode::GetCategory(0x0661), Category::kNumber);  // Arabic-Indic one
  EXPECT_EQ(unicode::GetCategory('!'), Category::kPunctuation);
  EXPECT_EQ(unicode::GetCategory('$'), Category::kSymbol);
  EXPECT_EQ(unicode::GetCategory(0x1F999), Category::kSymbol);  // emoji, outside the BMP
  EXPECT_EQ(unicode::GetCategory(0x0301), Category::kMark);
  EXPECT_EQ(unicode::GetCategory(0x200D), Category::kControl);  // ZWJ is a format char
  EXPECT_EQ(unicode::GetCategory(0x0378), Category::kUndefined);
  EXPECT_EQ(unicode::GetCategory(0x20000), Category::kLetter);  // CJK extension B
  for (uint32_t ws : {0x09u, 0x0Au, 0x0Du, 0x20u, 0x85u, 0xA0u, 0x2003u, 0x3000u}) {
    EXPECT_TRUE(unicode::IsWhitespace(ws)) << ws;
  }
  for (uint32_t no : {0x1Cu, 0x200Bu, 0x61u, 0x1F999u}) EXPECT_FALSE(unicode::IsWhitespace(no));
}

TEST(Unicode, Utf8DecodeEncode) {
  const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99";
  std::vector<uint32_t> cps;
  for (size_t pos = 0; pos < s.size();) cps.push_back(unicode::DecodeUtf8(s, &pos));
  EXPECT_EQ(cps, (std::vector<uint32_t>{'a', 0xE9, 0x20AC, 0x1F999}));
  std::string back;
  for (uint32_t cp : cps) unicode::AppendUtf8(cp, &back);
  EXPECT_EQ(back, s);
  // Overlong, surrogate, stray continuation and truncated sequences: one U+FFFD per byte.
  for (const std::string bad : {"\xC0\x80", "\xED\xA0\x80", "\x80", "\xF4\x90\x80\x80"}) {
    size_t pos = 0;
    EXPECT_EQ(unicode::DecodeUtf8(bad, &pos), unicode::kReplacementChar);
    EXPECT_EQ(pos, 1u);
  }
  size_t len = 0;
  EXPECT_EQ(unicode::CheckUtf8("\xF0\x9F", 0, &len), unicode::Utf8Status::kIncomplete);
  EXPECT_EQ(unicode::SanitizeUtf8("a\xFF"), "a\xEF\xBF\xBD");
}

TEST(Unicode, GptTwoByteMappingIsABijection) {
  EXPECT_EQ(unicode::ByteToCodepoint('A'), uint32_t{'A'});
  EXPECT_EQ(unicode::ByteToCodepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(unicode::ByteToCodepoint('\n'), 0x10Au);  // 'Ċ'
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = unicode::ByteToCodepoint(static_cast<uint8_t>(b));
    EXPECT_EQ(unicode::CodepointToByte(cp), b);
    EXPECT_FALSE(unicode::IsWhitespace(cp));
  }
  EXPECT_EQ(unicode::CodepointToByte(0x4E00), -1);
}

std::vector<std::string> Split(PreTokenizerKind kind, std::string_view text) {
  std::vector<std::string_view> words;
  PreTokenize(kind, text, &words);
  return std::vector<std::string>(words.begin(), words.end());
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2) {
  const auto k = PreTokenizerKind::kGpt2;
  EXPECT_EQ(Split(k, "Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(Split(k, "I'll  go!!  "), (Words{"I", "'ll", " ", " go", "!!", "  "}));
  EXPECT_EQ(Split(k, "a1 22 ½"), (Words{"a", "1", " 22", " ½"}));
  EXPECT_EQ(Split(k, "x\n\ny"), (Words{"x", "\n", "\n", "y"}));
  EXPECT_EQ(Split(k, "x\n\n y"), (Words{"x", "\n\n", " y"}));
  EXPECT_EQ(Split(k, "'S"), (Words{"'", "S"}));  // case-sensitive contractions
  EXPECT_TRUE(Split(k, "").empty());
}

TEST(PreTokenizer, Llama3AndQwen2) {
  const auto k = PreTokenizerKind::kLlama3;
  EXPECT_EQ(Split(k, "12345 abc"), (Words{"123", "45", " abc"}));
  EXPECT_EQ(Split(k, "'S ok"), (Words{"'S", " ok"}));
  EXPECT_EQ(Split(k, "(hello)"), (Words{"(hello", ")"}));
  EXPECT_EQ(Split(k, "a \n\n b"), (Words{"a", " \n\n", " b"}));
  EXPECT_EQ(Split(k, "x...\n\ny"), (Words{"x", "...\n\n", "y"}));
  EXPECT_EQ(Split(PreTokenizerKind::kQwen2, "123"), (Words{"1", "2", "3"}));
}

TEST(PreTokenizer, DeepseekLlm) {
  const auto k = PreTokenizerKind::kDeepseekLlm;
  EXPECT_EQ(Split(k, "Hello, world!\n"), (Words{"Hello", ",", " world", "!", "\n"}));
  EXPECT_EQ(Split(k, "12345 我想在apple"), (Words{"12345", " ", "我想在", "apple"}));
  EXPECT_EQ(Split(k, "end  "), (Words{"end", "  "}));
}

TEST(PreTokenizer, PiecesAlwaysCoverTheText) {
  const std::string text =
      "🚀 (normal) 😶\u200d🌫️ 3..3 \xff\xfe \t\n  \n We'Ve a'lL ——";
  for (auto kind : {PreTokenizerKind::kDefault, PreTokenizerKind::kGpt2, PreTokenizerKind::kLlama3,
                    PreTokenizerKind::kQwen2, PreTokenizerKind::kDeepseekLlm,
                    PreTokenizerKind::kDeepseekCoder, PreTokenizerKind::kStarcoder}) {
    std::string joined;
    for (const std::string& w : Split(kind, text)) {
      EXPECT_FALSE(w.empty());
      joined += w;
    }
    EXPECT_EQ(joined, text);
  }
}

}  // namespace
}  // namespace kvs
