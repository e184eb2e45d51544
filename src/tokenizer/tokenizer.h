// Text <-> token ids, built from a GGUF file's tokenizer.* metadata. Two families:
// SentencePiece-style ("llama": scored merges with byte fallback) and byte-level BPE
// ("gpt2": ranked merges after a regex pre-tokenizer chosen by tokenizer.ggml.pre).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_reader.h"

namespace kvs {

class Tokenizer {
 public:
  static Expected<std::unique_ptr<Tokenizer>> FromGguf(const gguf::File& file);
  virtual ~Tokenizer() = default;

  // Encodes `text`. add_special adds BOS/EOS as the model's add_bos/add_eos flags say;
  // parse_special lets control tokens written in the text (e.g. "<s>") map to their ids.
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special,
                                      bool parse_special) const = 0;

  // The bytes a token stands for ("▁" becomes a space, <0x0A> becomes '\n', byte-level
  // BPE characters map back to bytes). Control tokens render as "" unless `show_special`.
  virtual std::string TokenToPiece(int32_t id, bool show_special = false) const = 0;

  std::string Decode(const std::vector<int32_t>& ids) const;

  int32_t n_vocab() const { return n_vocab_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // End of generation: EOS, EOT or another end token named by the metadata.
  bool IsEndOfGeneration(int32_t id) const;
  const std::string& RawToken(int32_t id) const { return tokens_[id]; }

 protected:
  int32_t n_vocab_ = 0;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  bool add_eos_ = false;
  std::vector<int32_t> eog_ids_;  // sorted
  std::vector<std::string> tokens_;
  // Decode drops the first piece's leading space: the one SentencePiece's add_space_prefix
  // put there.
  bool strip_leading_space_ = false;
};

// Turns a stream of token ids into text without ever emitting half a UTF-8 character.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  // Returns the text that became complete with this token (possibly empty).
  std::string Push(int32_t id);
  // Returns whatever is still pending (invalid trailing bytes become U+FFFD).
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
};

}  // namespace kvs
