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
  // The merge loop over one stretch of normalized text.
  void EncodeSegment(std::string_view text, std::vector<int32_t>* out) const;
  void AppendByteTokens(std::string_view bytes, std::vector<int32_t>* out) const;

  bool add_space_prefix_ = true;
  // True when no token has U+2581 after a different character, so that no merge can cross
  // into a word that starts with U+2581: words can then be merged one at a time, which
  // keeps the priority queue small. The result is the same either way (for valid UTF-8).
  bool split_words_ = false;
  int32_t byte_tokens_[256] = {};  // -1 where neither <0xNN> nor the byte itself is a token
};

}  // namespace kvs
