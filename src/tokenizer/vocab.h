// What SentencePiece-style and byte-level BPE tokenizers share: the validated tokenizer.*
// metadata, token lookup, splitting special tokens out of text, and token -> piece.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// tokenizer.ggml.token_type values.
enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer.* metadata of a GGUF file, checked for consistency.
struct VocabData {
  std::string model;  // tokenizer.ggml.model
  std::string pre;    // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> tokens;
  std::vector<float> scores;     // empty when absent
  std::vector<TokenType> types;  // kNormal for all when absent
  std::vector<std::string> merges;
  // Special token ids, nullopt when absent or explicitly "none" (-1 / UINT32_MAX).
  std::optional<int32_t> bos, eos, unk, pad, eot, eom;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

// "<0xNN>" -> NN; -1 for any other text.
int ParseByteToken(std::string_view text);

// Reads and validates; every inconsistency is a one-line error naming the key.
Expected<VocabData> ReadVocabData(const gguf::File& file);

// A stretch of input text, or a special token (token >= 0) that was written in it.
struct Fragment {
  int32_t token = -1;
  std::string_view text;
};

// Finds control, unknown and user-defined tokens written in text. User-defined tokens are
// always split out; control and unknown ones only with parse_special. Longer tokens win:
// like llama.cpp, each token in order of decreasing length splits all remaining text.
class SpecialTokenSplitter {
 public:
  void Build(const std::vector<std::string>& tokens, const std::vector<TokenType>& types);
  void Split(std::string_view text, bool parse_special, std::vector<Fragment>* out) const;

 private:
  struct Node {
    int32_t token = -1;
    std::vector<std::pair<uint8_t, int32_t>> next;
  };
  int32_t Child(int32_t node, uint8_t byte) const;

  std::vector<Node> trie_;
  bool first_byte_[256] = {};
  std::vector<int32_t> rank_;       // token id -> position in by_length_, or -1
  std::vector<int32_t> by_length_;  // candidate ids, longest first
  std::vector<bool> always_;        // by rank: user-defined (split even without parse_special)
  const std::vector<std::string>* tokens_ = nullptr;
};

// Base of the two concrete tokenizers.
class VocabTokenizer : public Tokenizer {
 public:
  std::string TokenToPiece(int32_t id, bool show_special = false) const override;

 protected:
  // Moves the tokens into the base class and builds the lookup tables. `add_bos_default` and
  // `add_eos_default` apply when the metadata does not say.
  Status InitVocab(VocabData* data, bool add_bos_default, bool add_eos_default);
  // Text -> id over all tokens; -1 when absent.
  int32_t TokenId(std::string_view text) const {
    auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
  }
  TokenType Type(int32_t id) const { return types_[id]; }

  std::vector<TokenType> types_;
  std::vector<float> scores_;
  std::unordered_map<std::string_view, int32_t> token_to_id_;  // views into tokens_
  SpecialTokenSplitter specials_;
  int32_t unk_id_ = -1;
  // The text of each token as TokenToPiece returns it; filled by the subclass.
  std::vector<std::string> pieces_;
};

}  // namespace kvs
