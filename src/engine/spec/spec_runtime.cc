#include "engine/spec/spec_runtime.h"

namespace kvs {

Expected<SpecType> ParseSpecType(std::string_view text) {
  if (text == "none") return SpecType::kNone;
  if (text == "draft") return SpecType::kDraft;
  if (text == "ngram") return SpecType::kNgram;
  if (text == "self") return SpecType::kSelf;
  return Status::Error("--spec-type '" + std::string(text) +
                       "': expected none, draft (a draft model, -md), ngram (prompt lookup) or "
                       "self (the model's own compressed weights and KV window)");
}

const char* SpecTypeName(SpecType type) {
  switch (type) {
    case SpecType::kNone:
      return "none";
    case SpecType::kDraft:
      return "draft";
    case SpecType::kNgram:
      return "ngram";
    case SpecType::kSelf:
      return "self";
  }
  return "none";
}

}  // namespace kvs
