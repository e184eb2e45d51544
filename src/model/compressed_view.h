// A cheaper copy of a loaded model's weights, for self-speculative decoding: the `self` drafter
// runs the target's own architecture over its matrices re-quantized at load, so a decode step
// streams fewer bytes. Same config, same vocabulary, no second file to ship.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/weights.h"
#include "tensor/dtype.h"

namespace kvs {

struct CompressedViewOptions {
  DType type = DType::kQ8_0;         // matrices re-quantized to this: q8_0, q4_0 (f32, f16, bf16)
  std::optional<DType> output_type;  // the output (lm head) matrix's type, default: `type`
  std::optional<DType> ffn_gate_up_type;  // ffn_gate and ffn_up's type, default: `type`
};

// A Model whose matrices are `base`'s re-quantized to options.type, into memory it owns (huge
// pages where available), repacked for the interleaved kernels where CanInterleave allows. A
// matrix keeps base's bytes (shared, not copied) when the draft type would not be smaller per
// row or its rows cannot hold whole blocks of it (cols not a multiple of the block size). The
// token embedding is always shared (see the .cc). Vectors (norms, biases) are copied. The
// view's config is base's; it has no file (Model::has_file() is false: take the tokenizer from
// base) and a weights_digest of its own, derived from base's and the options. It may point into
// base's file or buffers, so base must outlive it. Work is split over pool.
// Errors: a type QuantizeRow cannot write.
Expected<std::unique_ptr<Model>> MakeCompressedView(const Model& base,
                                                    const CompressedViewOptions& options,
                                                    ThreadPool& pool);

// The argument of `--draft-weights TYPE`: q8_0, q4_0 or f16, case-insensitive.
Expected<DType> ParseDraftWeightsType(std::string_view name);

// The argument of `--draft-weights`: TYPE[,ffn=TYPE][,output=TYPE], each a type of
// ParseDraftWeightsType: every matrix at TYPE, but ffn_gate/ffn_up (ffn=) or the output matrix
// (output=) at their own. "q8_0,ffn=q4_0" spends fewer bits where top-1 agreement loses least.
Expected<CompressedViewOptions> ParseDraftWeights(std::string_view text);
// "q8_0", "q8_0,ffn=q4_0": what ParseDraftWeights reads back.
std::string DescribeCompressedView(const CompressedViewOptions& options);

// The draft type to use when --draft-weights is not given, by the bits per weight of the
// target's layer matrices: above 8.5 (F32, F16, BF16) Q8_0, else (Q8_0, Q4_0, K-quants) Q4_0.
DType DefaultDraftWeightsType(const Model& target);

}  // namespace kvs
