// Single-sequence generation: prefill the prompt, then sample token by token (one request
// through an engine built from kvserve::EngineOptions, api/engine_setup.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/sampler.h"
#include "model/weights.h"

namespace kvs {

struct GenerateOptions {
  int32_t n_predict = 128;  // tokens to generate at most (-1: until EOS or the context is full)
  int32_t n_ctx = 4096;     // context size; 0 = the model's training context
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // generation ends after any of these (EOS and friends)
};

struct GenerateStats {
  int32_t n_prompt = 0;
  int32_t n_generated = 0;
  double prompt_seconds = 0;
  double generate_seconds = 0;  // from the first sampled token to the last
};

// Calls on_token for each generated token (stop tokens included); returning false stops.
Expected<GenerateStats> Generate(const Model& model, const std::vector<int32_t>& prompt,
                                 const GenerateOptions& options, ThreadPool& pool,
                                 const std::function<bool(int32_t)>& on_token);

}  // namespace kvs
