// SentencePiece-style tokenizer (tokenizer.ggml.model = "llama"): spaces become U+2581,
// then adjacent symbols merge greedily by the score of the token they form; characters
// left without a token fall back to byte tokens <0xNN>.
#pragma once

#include <memory>

#include "tokenizer/vocab.h"

namespace kvs {

class SpmTokenizer final : public VocabTokenizer {
 public:
  static Expected<std::unique_ptr<Tokenizer>> Create(VocabData data);

  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special) const override;

 private:
  SpmTokenizer() = default;
  // Tokenizes text that is already normalized (U+2581 for spaces).
  void EncodeNormalized(std::string_view text, std::vector<int32_t>* out) const;
  void AppendByteTokens(std::string_view bytes, std::vector<int32_t>* out) const;

  bool add_space_prefix_ = true;
  int32_t byte_tokens_[256] = {};  // -1 where neither <0xNN> nor the byte itself is a token
};

}  // namespace kvs
