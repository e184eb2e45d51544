#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "tokenizer/bpe.h"
#include "tokenizer/spm.h"
#include "tokenizer/vocab.h"

namespace kvs {

Expected<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const gguf::File& file) {
  KVS_ASSIGN_OR_RETURN(VocabData data, ReadVocabData(file));
  if (data.model == "llama") return SpmTokenizer::Create(std::move(data));
  if (data.model == "gpt2") return BpeTokenizer::Create(std::move(data));
  return Status::Error(
      StrFormat("unsupported tokenizer model '%s' (tokenizer.ggml.model)", data.model.c_str()));
}

bool Tokenizer::IsEndOfGeneration(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

}  // namespace kvs
