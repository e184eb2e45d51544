// What a speculating engine owns besides its runner: the drafter and the models it reads. Made
// by EngineBuilder (engine_builder.h), held by LocalEngine and AsyncEngine.
#pragma once

#include <memory>
#include <optional>
#include <string_view>

#include "core/status.h"
#include "engine/spec/drafter.h"
#include "engine/spec/ngram_drafter.h"
#include "model/compressed_view.h"
#include "model/weights.h"
#include "tensor/dtype.h"

namespace kvs {

enum class SpecType { kNone, kDraft, kNgram, kSelf };
// --spec-type: none, draft, ngram, self.
Expected<SpecType> ParseSpecType(std::string_view text);
const char* SpecTypeName(SpecType type);

struct SpecOptions {
  SpecType type = SpecType::kNone;
  std::shared_ptr<const Model> draft_model;  // draft: the second GGUF (-md)
  // self: what the view's matrices are re-quantized to (--draft-weights); unset: the default
  // for the target's type (DefaultDraftWeightsType for every matrix).
  std::optional<CompressedViewOptions> draft_weights;
  int32_t draft_window = 0;  // self: --draft-window (0: the whole context)
  NgramOptions ngram;
};

struct SpecRuntime {
  std::shared_ptr<const Model> draft_model;
  std::unique_ptr<Model> view;
  std::unique_ptr<Drafter> drafter;  // declared last: destroyed before what it reads
};

}  // namespace kvs
