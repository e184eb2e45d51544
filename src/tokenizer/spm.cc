#include "tokenizer/spm.h"

#include <cstdio>

#include "tokenizer/merge.h"
#include "tokenizer/unicode.h"

namespace kvs {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

void AppendEscapingSpaces(std::string_view text, std::string* out) {
  for (char c : text) {
    if (c == ' ') {
      out->append(kSpaceMarker);
    } else {
      out->push_back(c);
    }
  }
}

std::string UnescapeSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kSpaceMarker.size()) == kSpaceMarker) {
      out.push_back(' ');
      i += kSpaceMarker.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> SpmTokenizer::Create(VocabData data) {
  if (data.scores.empty()) {
    return Status::Error("tokenizer.ggml.scores is missing (needed by the llama tokenizer)");
  }
  const bool add_space_prefix = data.add_space_prefix.value_or(true);
  // SentencePiece vocabularies put <unk>, <s>, </s> at 0, 1, 2 when the ids are not given.
  const int32_t n = static_cast<int32_t>(data.tokens.size());
  if (!data.unk && n > 0) data.unk = 0;
  if (!data.bos && n > 1) data.bos = 1;
  if (!data.eos && n > 2) data.eos = 2;

  std::unique_ptr<SpmTokenizer> tok(new SpmTokenizer());
  tok->add_space_prefix_ = add_space_prefix;
  tok->strip_leading_space_ = add_space_prefix;
  KVS_RETURN_IF_ERROR(tok->InitVocab(&data, /*add_bos_default=*/true, /*add_eos_default=*/false));

  tok->pieces_.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = tok->tokens_[id];
    switch (tok->types_[id]) {
      case TokenType::kNormal:
        tok->pieces_[id] = UnescapeSpaces(text);
        break;
      case TokenType::kUserDefined:
        tok->pieces_[id] = text;
        break;
      case TokenType::kByte: {
        const int byte = ParseByteToken(text);
        if (byte < 0) {
          return Status::Error(
              StrFormat("token %d has type byte but its text is not <0xNN>", static_cast<int>(id)));
        }
        tok->pieces_[id] = std::string(1, static_cast<char>(byte));
        break;
      }
      default:  // control/unknown render via TokenToPiece; unused/undefined render as ""
        break;
    }
  }
  tok->split_words_ = true;
  for (const std::string& t : tok->tokens_) {
    for (size_t pos = t.find(kSpaceMarker, 1); pos != std::string::npos;
         pos = t.find(kSpaceMarker, pos + 1)) {
      if (pos < kSpaceMarker.size() ||
          t.compare(pos - kSpaceMarker.size(), kSpaceMarker.size(), kSpaceMarker) != 0) {
        tok->split_words_ = false;
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    int32_t id = tok->TokenId(hex);
    if (id < 0) id = tok->TokenId(std::string(1, static_cast<char>(b)));
    tok->byte_tokens_[b] = id >= 0 ? id : tok->unk_id_;
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

std::vector<int32_t> SpmTokenizer::Encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(bos_id_);
  std::vector<Fragment> fragments;
  specials_.Split(text, parse_special, &fragments);
  // SentencePiece prefixes a space to the text, and llama.cpp to every text fragment that
  // follows a special token, so that words after one look like words after a space.
  bool after_special = true;
  std::string normalized;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    normalized.clear();
    if (add_space_prefix_ && after_special) normalized.append(kSpaceMarker);
    AppendEscapingSpaces(f.text, &normalized);
    EncodeNormalized(normalized, &out);
    after_special = false;
  }
  if (add_special && add_eos_) out.push_back(eos_id_);
  return out;
}

void SpmTokenizer::AppendByteTokens(std::string_view bytes, std::vector<int32_t>* out) const {
  for (char c : bytes) {
    const int32_t id = byte_tokens_[static_cast<uint8_t>(c)];
    if (id >= 0) out->push_back(id);
  }
}

void SpmTokenizer::EncodeNormalized(std::string_view text, std::vector<int32_t>* out) const {
  if (!split_words_) return EncodeSegment(text, out);
  size_t begin = 0;
  for (size_t pos = text.find(kSpaceMarker, 1); pos != std::string_view::npos;
       pos = text.find(kSpaceMarker, pos + 1)) {
    if (pos >= kSpaceMarker.size() &&
        text.substr(pos - kSpaceMarker.size(), kSpaceMarker.size()) == kSpaceMarker) {
      continue;  // inside a run of spaces, which tokens may span
    }
    EncodeSegment(text.substr(begin, pos - begin), out);
    begin = pos;
  }
  EncodeSegment(text.substr(begin), out);
}

void SpmTokenizer::EncodeSegment(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::vector<merge::Symbol> symbols = merge::SplitCharacters(text);
  // Adjacent symbols are adjacent in `text`, so their concatenation is one view.
  merge::MergePairs(text, symbols,
                    [&](std::string_view l, std::string_view r) -> std::optional<double> {
                      const int32_t id = TokenId(std::string_view(l.data(), l.size() + r.size()));
                      if (id < 0) return std::nullopt;
                      return scores_[id];
                    });

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = text.substr(symbols[i].start, symbols[i].len);
    const int32_t id = TokenId(piece);
    if (id >= 0) {
      out->push_back(id);
    } else {
      AppendByteTokens(piece, out);
    }
  }
}

}  // namespace kvs
