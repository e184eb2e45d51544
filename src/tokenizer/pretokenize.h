// Pre-tokenizers for byte-level BPE: split text into words before merges, as the regex of
// the model's tokenizer.json does. Each variant is a hand-written scanner over code points
// that reproduces the regex's leftmost-first semantics (std::regex cannot do \p{L}).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace kvs {

enum class PreTokenizerKind {
  kDefault,        // llama.cpp's fallback list of regexes
  kGpt2,           // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,         // letters with one leading non-letter, numbers in groups of 3, ...
  kQwen2,          // as kLlama3 but single digits
  kDeepseekLlm,    // a sequence of six regexes (see pretokenize.cc)
  kDeepseekCoder,  // a sequence of five regexes
  kStarcoder,      // single digits, then GPT-2
};

struct PreTokenizerConfig {
  PreTokenizerKind kind = PreTokenizerKind::kDefault;
  // A word that is a whole vocab token is emitted as is, without merges (Llama 3).
  bool ignore_merges = false;
  // The add_bos default when the GGUF has no tokenizer.ggml.add_bos_token.
  bool add_bos = false;
};

// Maps tokenizer.ggml.pre to a configuration; nullopt for names we do not support. An
// empty name means "default".
std::optional<PreTokenizerConfig> LookupPreTokenizer(std::string_view name);

// Splits `text` into consecutive, non-empty words that together cover it exactly. Invalid
// UTF-8 bytes stay in the words unchanged; they are classified as U+FFFD.
void PreTokenize(PreTokenizerKind kind, std::string_view text,
                 std::vector<std::string_view>* words);

}  // namespace kvs
