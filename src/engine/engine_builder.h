// One construction path: everything that runs a model over a paged KV cache (the API's engine,
// `generate`, `perplexity`, every bench, the tests) is built here, so that a new engine option
// (a KV format detail, a drafter, a block store) is added once. The builder makes the KV format
// (kv_format_factory.h) and hands it to the storage of whatever it builds.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/async_engine.h"
#include "engine/calibration_prefill.h"
#include "engine/engine.h"
#include "engine/kv_format_factory.h"
#include "engine/kv_tier_kinds.h"
#include "engine/model_runner.h"
#include "engine/single_sequence.h"
#include "engine/spec/spec_runtime.h"
#include "engine/transform_codec.h"
#include "kv/tri_policy.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// A synchronous engine, the runner it steps and its drafter (the engine holds references).
struct LocalEngine {
  std::unique_ptr<ModelRunner> runner;
  SpecRuntime spec;
  std::unique_ptr<Engine> engine;
};

class EngineBuilder {
 public:
  // tokenizer: for the built-in calibration paragraph (null: fixed pseudo-random tokens).
  EngineBuilder(const Model& model, const Tokenizer* tokenizer, ThreadPool& pool,
                KvFormatOptions kv = {});

  // The KV format at this block size and context (the context a constant key offset is
  // averaged over); made once per pair, calibrating where the K type needs it.
  Expected<KvFormatPtr> Format(int32_t block_size, int32_t n_ctx);
  // Speculative decoding for the engines built after this (Local, Async): checks the options
  // (a draft model that cannot pair with the target is refused here, naming the mismatch).
  Status Speculative(SpecOptions options);

  // The token eviction policy config.eviction names (the tri policy calibrated here, once).
  Expected<std::unique_ptr<EvictionPolicy>> EvictionPolicyFor(const EvictionConfig& config);
  // The model runner over config.n_blocks blocks of config.block_size.
  Expected<std::unique_ptr<ModelRunner>> Runner(const EngineConfig& config);
  Expected<LocalEngine> Local(const EngineConfig& config);
  // after_step: AsyncEngine's (the API's hand-over of a step's token events).
  Expected<std::unique_ptr<AsyncEngine>> Async(const EngineConfig& config,
                                               std::function<void()> after_step = nullptr);
  // One sequence of up to n_ctx positions over a private cache (perplexity, bench speed).
  Expected<std::unique_ptr<SingleSequence>> Single(int32_t n_ctx);

 private:
  // Refuses what does not work yet with sliding-window layers (kv_group.h AnySliding).
  Status CheckKvGroups(const EngineConfig& config) const;
  // The tiers config names (engine/kv_tier_kinds.h) over runner's KV, in order; empty when it
  // names none.
  Expected<KvTiers> Tiers(const EngineConfig& config, ModelRunner& runner);
  // A tier's transform codec for the runner's KV format: fitted on the calibration tokens (the
  // builder's, else the built-in paragraph) once per builder, the fit saved in and read from dir
  // when given.
  Expected<std::shared_ptr<const KvBlockCodec>> TransformCodecFor(
      const TransformCodecOptions& options, const KvFormatPtr& format, const std::string& dir);
  // The drafter of the Speculative options over runner's KV (none: an empty runtime).
  Expected<SpecRuntime> MakeSpec(const EngineConfig& config, ModelRunner& runner);

  const Model& model_;
  const Tokenizer* tokenizer_;
  ThreadPool& pool_;
  KvFormatOptions kv_;
  KvFormatPtr format_;  // the last one made, and the context it was made for
  int32_t format_ctx_ = 0;
  SpecOptions spec_;
  CalibrationRuns calibration_runs_;  // the calibrations' prefills, shared when their text is
  std::shared_ptr<const TriCalibration> tri_;       // the tri eviction policy's, once measured
  std::shared_ptr<const KvTransforms> transforms_;  // the transform codec's fit, once made
};

}  // namespace kvs
