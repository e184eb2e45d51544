// Byte-level BPE (tokenizer.ggml.model = "gpt2"): a pre-tokenizer splits the text into
// words, each word's bytes become printable code points (GPT-2's bytes_to_unicode), and
// adjacent symbols merge in the order of the merges list.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "tokenizer/pretokenize.h"
#include "tokenizer/vocab.h"

namespace kvs {

class BpeTokenizer final : public VocabTokenizer {
 public:
  static Expected<std::unique_ptr<Tokenizer>> Create(VocabData data);

  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special) const override;

 private:
  BpeTokenizer() = default;
  // Merges one byte-encoded word.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // The rank of merging `left` and `right` (lower merges first), or -1.
  int32_t MergeRank(std::string_view left, std::string_view right, std::string* scratch) const;

  PreTokenizerConfig pre_;
  std::vector<std::string> merges_;
  std::unordered_map<std::string_view, int32_t> merge_rank_;  // "left right" -> rank
};

}  // namespace kvs
