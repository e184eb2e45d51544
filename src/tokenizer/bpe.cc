#include "tokenizer/bpe.h"

#include "tokenizer/merge.h"
#include "tokenizer/unicode.h"

namespace kvs {
namespace {

// Byte-level token text -> the bytes it stands for. Code points outside GPT-2's mapping
// (which a well-formed vocab does not have) are kept as their UTF-8.
std::string DecodeByteLevel(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    const uint32_t cp = unicode::DecodeUtf8(text, &pos);
    const int byte = unicode::CodepointToByte(cp);
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
    } else {
      out.append(text.substr(start, pos - start));
    }
  }
  return out;
}

}  // namespace

Expected<std::unique_ptr<Tokenizer>> BpeTokenizer::Create(VocabData data) {
  const std::optional<PreTokenizerConfig> pre = LookupPreTokenizer(data.pre);
  if (!pre) {
    return Status::Error(
        StrFormat("unsupported pre-tokenizer '%s' (tokenizer.ggml.pre)", data.pre.c_str()));
  }
  if (data.merges.empty()) {
    return Status::Error("tokenizer.ggml.merges is missing (needed by the gpt2 tokenizer)");
  }
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  tok->pre_ = *pre;
  tok->merges_ = std::move(data.merges);
  tok->merge_rank_.reserve(tok->merges_.size());
  for (size_t i = 0; i < tok->merges_.size(); ++i) {
    const std::string& m = tok->merges_[i];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size()) {
      return Status::Error(
          StrFormat("tokenizer.ggml.merges[%zu] is not two tokens separated by a space", i));
    }
    tok->merge_rank_.emplace(m, static_cast<int32_t>(i));  // a repeated merge keeps its first rank
  }
  KVS_RETURN_IF_ERROR(
      tok->InitVocab(&data, /*add_bos_default=*/pre->add_bos, /*add_eos_default=*/false));

  tok->pieces_.resize(tok->n_vocab_);
  for (int32_t id = 0; id < tok->n_vocab_; ++id) {
    const std::string& text = tok->tokens_[id];
    switch (tok->types_[id]) {
      case TokenType::kNormal:
        tok->pieces_[id] = DecodeByteLevel(text);
        break;
      case TokenType::kUserDefined:
        tok->pieces_[id] = text;
        break;
      case TokenType::kByte: {
        const int byte = ParseByteToken(text);
        tok->pieces_[id] = byte >= 0 ? std::string(1, static_cast<char>(byte)) : text;
        break;
      }
      default:
        break;
    }
  }
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

int32_t BpeTokenizer::MergeRank(std::string_view left, std::string_view right,
                                std::string* scratch) const {
  scratch->assign(left);
  scratch->push_back(' ');
  scratch->append(right);
  auto it = merge_rank_.find(*scratch);
  return it == merge_rank_.end() ? -1 : it->second;
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(bos_id_);
  std::vector<Fragment> fragments;
  specials_.Split(text, parse_special, &fragments);
  std::vector<std::string_view> words;
  std::string encoded;
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    PreTokenize(pre_.kind, f.text, &words);
    for (std::string_view word : words) {
      encoded.clear();
      for (char c : word) encoded.append(unicode::ByteToUtf8(static_cast<uint8_t>(c)));
      EncodeWord(encoded, &out);
    }
  }
  if (add_special && add_eos_) out.push_back(eos_id_);
  return out;
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (pre_.ignore_merges) {
    const int32_t id = TokenId(word);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  std::vector<merge::Symbol> symbols = merge::SplitCharacters(word);
  std::string scratch;
  merge::MergePairs(word, symbols,
                    [&](std::string_view l, std::string_view r) -> std::optional<double> {
                      const int32_t rank = MergeRank(l, r, &scratch);
                      if (rank < 0) return std::nullopt;
                      return -static_cast<double>(rank);  // lower rank merges first
                    });

  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = word.substr(symbols[i].start, symbols[i].len);
    const int32_t id = TokenId(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // A merge produced text that is not a token (an inconsistent vocab): fall back to
    // the tokens of its single characters, which byte-level vocabs always have.
    for (size_t pos = 0; pos < piece.size();) {
      const size_t len =
          std::min(unicode::Utf8SeqLen(static_cast<uint8_t>(piece[pos])), piece.size() - pos);
      const int32_t char_id = TokenId(piece.substr(pos, len));
      if (char_id >= 0) {
        out->push_back(char_id);
      } else if (unk_id_ >= 0) {
        out->push_back(unk_id_);
      }
      pos += len;
    }
  }
}

}  // namespace kvs
