#include "tokenizer/vocab.h"

#include <algorithm>
#include <cinttypes>

namespace kvs {
namespace {

constexpr const char* kModelKey = "tokenizer.ggml.model";
constexpr const char* kTokensKey = "tokenizer.ggml.tokens";
constexpr const char* kScoresKey = "tokenizer.ggml.scores";
constexpr const char* kTypesKey = "tokenizer.ggml.token_type";
constexpr const char* kMergesKey = "tokenizer.ggml.merges";

// Token texts that end generation whatever the metadata says (llama.cpp detects these the
// same way: converters rarely record EOT/EOM ids).
constexpr const char* kEndOfGenerationTexts[] = {
    "<|eot_id|>", "<|im_end|>",      "<|end|>", "<end_of_turn>",         "<|endoftext|>",
    "<|eom_id|>", "<|end_of_text|>", "<EOT>",   "<｜end▁of▁sentence｜>",
};

bool IsArrayOf(const gguf::Value& v, bool (*pred)(gguf::ValueType)) {
  return v.type == gguf::ValueType::kArray && pred(v.array_type);
}
bool IsStringType(gguf::ValueType t) {
  return t == gguf::ValueType::kString;
}

Expected<const std::vector<std::string>*> StringArray(const gguf::File& file, const char* key) {
  const gguf::Value* v = file.Find(key);
  if (v == nullptr) return static_cast<const std::vector<std::string>*>(nullptr);
  if (!IsArrayOf(*v, IsStringType)) {
    return Status::Error(StrFormat("%s must be an array of strings", key));
  }
  return &v->strings;
}

Status CheckLength(const char* key, size_t n, size_t n_tokens) {
  if (n == n_tokens) return Status::Ok();
  return Status::Error(
      StrFormat("%s has %zu entries but %s has %zu", key, n, kTokensKey, n_tokens));
}

// A special token id: absent, "none" (-1 or UINT32_MAX, which converters write for unset
// ids), or a valid id.
Status ReadTokenId(const gguf::File& file, const char* key, size_t n_tokens,
                   std::optional<int32_t>* out) {
  const gguf::Value* v = file.Find(key);
  if (v == nullptr) return Status::Ok();
  std::optional<int64_t> id = v->AsInt();
  if (!id) {
    if (!v->AsUint()) return Status::Error(StrFormat("%s must be an integer", key));
    if (*v->AsUint() == UINT64_MAX) return Status::Ok();  // "none" as a uint64
    id = INT64_MAX;                                       // out of range below
  }
  if (*id == -1 || *id == 0xFFFFFFFFll) return Status::Ok();
  if (*id < 0 || static_cast<uint64_t>(*id) >= n_tokens) {
    return Status::Error(
        StrFormat("%s = %" PRId64 " is out of range (vocab has %zu tokens)", key, *id, n_tokens));
  }
  *out = static_cast<int32_t>(*id);
  return Status::Ok();
}

Status ReadFlag(const gguf::File& file, const char* key, std::optional<bool>* out) {
  const gguf::Value* v = file.Find(key);
  if (v == nullptr) return Status::Ok();
  std::optional<bool> b = v->AsBool();
  if (!b) return Status::Error(StrFormat("%s must be a bool", key));
  *out = b;
  return Status::Ok();
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

}  // namespace

int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = HexDigit(text[3]);
  const int lo = HexDigit(text[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

Expected<VocabData> ReadVocabData(const gguf::File& file) {
  VocabData d;
  const gguf::Value* model = file.Find(kModelKey);
  if (model == nullptr) return Status::Error(StrFormat("%s is missing", kModelKey));
  if (model->AsString() == nullptr)
    return Status::Error(StrFormat("%s must be a string", kModelKey));
  d.model = *model->AsString();
  if (const gguf::Value* pre = file.Find("tokenizer.ggml.pre")) {
    if (pre->AsString() == nullptr) return Status::Error("tokenizer.ggml.pre must be a string");
    d.pre = *pre->AsString();
  }

  KVS_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens, StringArray(file, kTokensKey));
  if (tokens == nullptr) return Status::Error(StrFormat("%s is missing", kTokensKey));
  if (tokens->empty()) return Status::Error(StrFormat("%s is empty", kTokensKey));
  if (tokens->size() > static_cast<size_t>(INT32_MAX)) {
    return Status::Error(StrFormat("%s has too many entries", kTokensKey));
  }
  const size_t n = tokens->size();
  d.tokens = *tokens;

  if (const gguf::Value* scores = file.Find(kScoresKey)) {
    if (scores->type != gguf::ValueType::kArray ||
        !(gguf::IsFloatType(scores->array_type) || gguf::IsIntegerType(scores->array_type))) {
      return Status::Error(StrFormat("%s must be an array of numbers", kScoresKey));
    }
    KVS_RETURN_IF_ERROR(CheckLength(kScoresKey, scores->ArraySize(), n));
    d.scores.resize(n);
    for (size_t i = 0; i < n; ++i) {
      d.scores[i] = gguf::IsFloatType(scores->array_type) ? static_cast<float>(scores->floats[i])
                                                          : static_cast<float>(scores->ints[i]);
    }
  }

  d.types.assign(n, TokenType::kNormal);
  if (const gguf::Value* types = file.Find(kTypesKey)) {
    if (!IsArrayOf(*types, gguf::IsIntegerType)) {
      return Status::Error(StrFormat("%s must be an array of integers", kTypesKey));
    }
    KVS_RETURN_IF_ERROR(CheckLength(kTypesKey, types->ints.size(), n));
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = types->ints[i];
      if (t < 0 || t > 6) {
        return Status::Error(
            StrFormat("%s[%zu] = %" PRId64 " is not a token type (0..6)", kTypesKey, i, t));
      }
      d.types[i] = static_cast<TokenType>(t);
    }
  }

  KVS_ASSIGN_OR_RETURN(const std::vector<std::string>* merges, StringArray(file, kMergesKey));
  if (merges != nullptr) d.merges = *merges;

  const std::pair<const char*, std::optional<int32_t>*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &d.bos},     {"tokenizer.ggml.eos_token_id", &d.eos},
      {"tokenizer.ggml.unknown_token_id", &d.unk}, {"tokenizer.ggml.padding_token_id", &d.pad},
      {"tokenizer.ggml.eot_token_id", &d.eot},     {"tokenizer.ggml.eom_token_id", &d.eom},
  };
  for (const auto& [key, out] : ids) KVS_RETURN_IF_ERROR(ReadTokenId(file, key, n, out));
  KVS_RETURN_IF_ERROR(ReadFlag(file, "tokenizer.ggml.add_bos_token", &d.add_bos));
  KVS_RETURN_IF_ERROR(ReadFlag(file, "tokenizer.ggml.add_eos_token", &d.add_eos));
  KVS_RETURN_IF_ERROR(ReadFlag(file, "tokenizer.ggml.add_space_prefix", &d.add_space_prefix));
  return d;
}

// ---------------------------------------------------------------------------------------

int32_t SpecialTokenSplitter::Child(int32_t node, uint8_t byte) const {
  for (const auto& [b, child] : trie_[node].next) {
    if (b == byte) return child;
  }
  return -1;
}

void SpecialTokenSplitter::Build(const std::vector<std::string>& tokens,
                                 const std::vector<TokenType>& types) {
  tokens_ = &tokens;
  trie_.assign(1, Node{});
  rank_.assign(tokens.size(), -1);
  by_length_.clear();
  for (size_t id = 0; id < tokens.size(); ++id) {
    const TokenType t = types[id];
    if ((t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) &&
        !tokens[id].empty()) {
      by_length_.push_back(static_cast<int32_t>(id));
    }
  }
  std::stable_sort(by_length_.begin(), by_length_.end(),
                   [&](int32_t a, int32_t b) { return tokens[a].size() > tokens[b].size(); });
  always_.assign(by_length_.size(), false);
  for (size_t r = 0; r < by_length_.size(); ++r) {
    const int32_t id = by_length_[r];
    rank_[id] = static_cast<int32_t>(r);
    always_[r] = types[id] == TokenType::kUserDefined;
    int32_t node = 0;
    for (char c : tokens[id]) {
      const auto byte = static_cast<uint8_t>(c);
      int32_t child = Child(node, byte);
      if (child < 0) {
        child = static_cast<int32_t>(trie_.size());
        trie_[node].next.emplace_back(byte, child);
        trie_.emplace_back();
      }
      node = child;
    }
    if (trie_[node].token < 0) trie_[node].token = id;  // duplicates: the first id wins
    first_byte_[static_cast<uint8_t>(tokens[id][0])] = true;
  }
}

void SpecialTokenSplitter::Split(std::string_view text, bool parse_special,
                                 std::vector<Fragment>* out) const {
  out->clear();
  if (text.empty()) return;
  // Which candidates occur at all? Only those need the (slower) ordered splitting below.
  std::vector<int32_t> found;  // ranks
  for (size_t i = 0; i < text.size(); ++i) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) continue;
    int32_t node = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = Child(node, static_cast<uint8_t>(text[j]));
      if (node < 0) break;
      const int32_t id = trie_[node].token;
      if (id >= 0 && (parse_special || always_[rank_[id]])) found.push_back(rank_[id]);
    }
  }
  out->push_back(Fragment{-1, text});
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());

  std::vector<Fragment> next;
  for (int32_t rank : found) {
    const int32_t id = by_length_[rank];
    const std::string_view special = (*tokens_)[id];
    next.clear();
    for (const Fragment& f : *out) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t at; (at = rest.find(special)) != std::string_view::npos;) {
        if (at > 0) next.push_back(Fragment{-1, rest.substr(0, at)});
        next.push_back(Fragment{id, special});
        rest.remove_prefix(at + special.size());
      }
      if (!rest.empty()) next.push_back(Fragment{-1, rest});
    }
    out->swap(next);
  }
}

// ---------------------------------------------------------------------------------------

Status VocabTokenizer::InitVocab(VocabData* data, bool add_bos_default, bool add_eos_default) {
  tokens_ = std::move(data->tokens);
  types_ = std::move(data->types);
  scores_ = std::move(data->scores);
  n_vocab_ = static_cast<int32_t>(tokens_.size());
  token_to_id_.reserve(tokens_.size());
  for (int32_t id = 0; id < n_vocab_; ++id) {
    if (!tokens_[id].empty()) token_to_id_.emplace(tokens_[id], id);  // first id wins
  }

  bos_id_ = data->bos.value_or(-1);
  eos_id_ = data->eos.value_or(-1);
  unk_id_ = data->unk.value_or(-1);
  add_bos_ = data->add_bos.value_or(add_bos_default);
  add_eos_ = data->add_eos.value_or(add_eos_default);
  if (add_bos_ && bos_id_ < 0) {
    return Status::Error("the tokenizer adds BOS but tokenizer.ggml.bos_token_id is not set");
  }
  if (add_eos_ && eos_id_ < 0) {
    return Status::Error("the tokenizer adds EOS but tokenizer.ggml.eos_token_id is not set");
  }

  for (const auto& id : {data->eos, data->eot, data->eom}) {
    if (id) eog_ids_.push_back(*id);
  }
  for (const char* text : kEndOfGenerationTexts) {
    const int32_t id = TokenId(text);
    if (id < 0) continue;
    eog_ids_.push_back(id);
    // Such a token is a control token even where a converter forgot to mark it, so that
    // it is neither printed nor matched in plain text.
    if (types_[id] == TokenType::kNormal) types_[id] = TokenType::kControl;
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());

  specials_.Build(tokens_, types_);
  return Status::Ok();
}

std::string VocabTokenizer::TokenToPiece(int32_t id, bool show_special) const {
  if (id < 0 || id >= n_vocab_) return "";
  const TokenType t = types_[id];
  if (t == TokenType::kControl || t == TokenType::kUnknown) {
    return show_special ? tokens_[id] : std::string();
  }
  return pieces_[id];
}

}  // namespace kvs
