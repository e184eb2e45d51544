#include "engine/engine_builder.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/log.h"
#include "engine/key_offsets.h"
#include "engine/query_centres.h"
#include "engine/spec/draft_model_drafter.h"
#include "engine/spec/self_drafter.h"
#include "model/compressed_view.h"

namespace kvs {

EngineBuilder::EngineBuilder(const Model& model, const Tokenizer* tokenizer, ThreadPool& pool,
                             KvFormatOptions kv)
    : model_(model),
      tokenizer_(tokenizer),
      pool_(pool),
      kv_(std::move(kv)),
      calibration_runs_(model, pool) {}

Expected<KvFormatPtr> EngineBuilder::Format(int32_t block_size, int32_t n_ctx) {
  if (format_ != nullptr && format_->block_size() == block_size && format_ctx_ == n_ctx) {
    return format_;
  }
  KvFormatOptions options = kv_;
  options.block_size = block_size;
  options.n_ctx = n_ctx;
  auto format = MakeKvFormat(model_, tokenizer_, pool_, options, &calibration_runs_);
  if (format.ok()) {
    format_ = *format;
    format_ctx_ = n_ctx;
  }
  return format;
}

Status EngineBuilder::CheckKvGroups(const EngineConfig& config) const {
  const std::vector<KvGroupSpec>& groups = model_.config().kv_groups;
  if (!AnySliding(groups)) return Status::Ok();
  // What reads or moves a sequence's KV through one block table does not know groups yet.
  const char* refused = nullptr;
  if (config.eviction.budget.active()) refused = "token eviction (--kv-budget)";
  if (spec_.type != SpecType::kNone) refused = "speculative decoding (--spec-type)";
  for (const TierKind& kind : TierKinds()) {
    if (kind.configured(config)) refused = kind.flag;
  }
  if (refused == nullptr) return Status::Ok();
  return Status::Error(
      StrFormat("%s does not work yet with a model that has sliding-window layers (%zu KV cache "
                "group%s)",
                refused, groups.size(), groups.size() == 1 ? "" : "s"));
}

Expected<std::unique_ptr<ModelRunner>> EngineBuilder::Runner(const EngineConfig& config) {
  KVS_RETURN_IF_ERROR(config.Validate());
  KVS_RETURN_IF_ERROR(CheckKvGroups(config));
  auto format = Format(config.block_size, config.n_ctx);
  if (!format.ok()) return format.status();
  return std::make_unique<ModelRunner>(model_, pool_, *format, config.n_blocks);
}

Status EngineBuilder::Speculative(SpecOptions options) {
  if (options.type == SpecType::kDraft) {
    if (!options.draft_model) {
      return Status::Error("--spec-type draft needs a draft model (-md/--model-draft FILE)");
    }
    KVS_RETURN_IF_ERROR(CheckDraftPairing(model_, *options.draft_model));
  }
  if (options.type == SpecType::kSelf && !options.draft_weights) {
    options.draft_weights = CompressedViewOptions{DefaultDraftWeightsType(model_), {}, {}};
  }
  if (options.draft_window < 0) {
    return Status::Error(StrFormat("--draft-window %d: must be 0 (the whole context) or positive",
                                   options.draft_window));
  }
  spec_ = std::move(options);
  return Status::Ok();
}

Expected<SpecRuntime> EngineBuilder::MakeSpec(const EngineConfig& config, ModelRunner& runner) {
  SpecRuntime spec;
  switch (spec_.type) {
    case SpecType::kNone:
      break;
    case SpecType::kNgram:
      spec.drafter = std::make_unique<NgramDrafter>(spec_.ngram);
      KVS_LOG_INFO("spec: prompt lookup (n-gram %d..%d), up to %d drafts per step",
                   spec_.ngram.n_max, spec_.ngram.n_min, config.spec.draft_max);
      break;
    case SpecType::kDraft: {
      spec.draft_model = spec_.draft_model;
      // The draft's pool holds as many positions as the target's (its sequences mirror the
      // target's), not -np full contexts: a real draft model's KV is as large per position.
      DraftModelOptions options;
      const int64_t target_positions = int64_t{config.n_blocks - 1} * config.block_size;
      const int64_t full = int64_t{config.max_seqs} * ((config.n_ctx + 15) / 16);
      options.n_blocks = static_cast<int32_t>(std::min(full, target_positions / 16 + 1) + 1);
      auto drafter = MakeDraftModelDrafter(model_, *spec.draft_model, pool_, config.n_ctx,
                                           config.max_seqs, options);
      if (!drafter.ok()) return drafter.status();
      (*drafter)->SetTargetCost(static_cast<double>(model_.WeightBytesPerToken()),
                                static_cast<double>(runner.storage().block_bytes()) /
                                    runner.storage().geometry().block_size);
      KVS_LOG_INFO(
          "spec: a draft model (%s, %.0f%% of the target's bytes per token), %d blocks "
          "of KV of its own, up to %d drafts per step",
          spec.draft_model->config().arch_name.c_str(), 100.0 * (*drafter)->relative_cost(),
          options.n_blocks, config.spec.draft_max);
      spec.drafter = std::move(*drafter);
      break;
    }
    case SpecType::kSelf: {
      auto view = MakeCompressedView(model_, *spec_.draft_weights, pool_);
      if (!view.ok()) return view.status();
      spec.view = std::move(*view);
      SelfDraftOptions self;
      self.window = spec_.draft_window;
      auto drafter =
          std::make_unique<SelfDrafter>(model_, *spec.view, pool_, runner.mutable_storage(), self);
      const std::string reads = self.window == 0
                                    ? std::string("its whole KV")
                                    : StrFormat("%d sink + the last %d positions of its KV",
                                                SelfDraftOptions::kSinkTokens, self.window);
      KVS_LOG_INFO("spec: self-drafting over %s weights (%.0f%% of the target's bytes), reading %s",
                   DescribeCompressedView(*spec_.draft_weights).c_str(),
                   100.0 * drafter->relative_cost(), reads.c_str());
      if (drafter->relative_cost() > 0.9) {
        KVS_LOG_WARN(
            "spec: the compressed view is hardly smaller than the model (its weights are "
            "already at or below --draft-weights): self-drafting cannot pay, and the "
            "adaptive policy will leave it off");
      }
      spec.drafter = std::move(drafter);
      break;
    }
  }
  return spec;
}

Expected<LocalEngine> EngineBuilder::Local(const EngineConfig& config) {
  auto runner = Runner(config);
  if (!runner.ok()) return runner.status();
  LocalEngine local;
  local.runner = std::move(*runner);
  auto spec = MakeSpec(config, *local.runner);
  if (!spec.ok()) return spec.status();
  local.spec = std::move(*spec);
  auto policy = EvictionPolicyFor(config.eviction);
  if (!policy.ok()) return policy.status();
  auto tiers = Tiers(config, *local.runner);
  if (!tiers.ok()) return tiers.status();
  local.engine =
      std::make_unique<Engine>(config, *local.runner, local.spec.drafter.get(), std::move(*policy));
  for (auto& tier : *tiers) local.engine->connectors().AttachTier(std::move(tier));
  calibration_runs_.Clear();  // every calibration is made: its prefill goes
  return local;
}

Expected<std::unique_ptr<AsyncEngine>> EngineBuilder::Async(const EngineConfig& config,
                                                            std::function<void()> after_step) {
  auto runner = Runner(config);
  if (!runner.ok()) return runner.status();
  auto spec = MakeSpec(config, **runner);
  if (!spec.ok()) return spec.status();
  auto policy = EvictionPolicyFor(config.eviction);
  if (!policy.ok()) return policy.status();
  auto tiers = Tiers(config, **runner);
  if (!tiers.ok()) return tiers.status();
  calibration_runs_.Clear();  // every calibration is made: its prefill goes
  return std::make_unique<AsyncEngine>(config, std::move(*runner), std::move(*spec),
                                       std::move(*policy), std::move(*tiers),
                                       std::move(after_step));
}

Expected<KvTiers> EngineBuilder::Tiers(const EngineConfig& config, ModelRunner& runner) {
  const TierContext ctx{
      config, MakeBlockIdentity(model_.weights_digest(), runner.storage().format()),
      runner.mutable_storage(),
      [this, &runner](const TransformCodecOptions& options, const std::string& dir) {
        return TransformCodecFor(options, runner.storage().shared_format(), dir);
      }};
  KvTiers tiers;
  for (const TierKind& kind : TierKinds()) {
    if (!kind.configured(config)) continue;
    if (!config.prefix_caching()) {
      return Status::Error(std::string(kind.flag) +
                           " stores the prefix cache's blocks: it needs the prefix cache");
    }
    auto tier = kind.open(ctx);
    if (!tier.ok()) return tier.status();
    if (*tier) tiers.push_back(std::move(*tier));
  }
  return tiers;
}

Expected<std::shared_ptr<const KvBlockCodec>> EngineBuilder::TransformCodecFor(
    const TransformCodecOptions& options, const KvFormatPtr& format, const std::string& dir) {
  if (transforms_ == nullptr) {
    std::vector<int32_t> tokens = kv_.calibration_tokens;
    if (tokens.empty()) tokens = KeyCalibrationTokens(tokenizer_, model_.config().n_vocab);
    auto fit = LoadOrFitKvTransforms(model_, pool_, *format, tokens, dir, &calibration_runs_);
    if (!fit.ok()) return fit.status();
    transforms_ = *fit;
  }
  // Loads decode on the loader's own thread: beside the step's threads, which keep the cores
  // busy (and spin between loops), a second pool of decoders would oversubscribe them (measured
  // 10x slower with -t 2 on 2 cores). kv codec-bench measures the codec's multi-threaded rate.
  TransformCodecOptions o = options;
  o.decode_threads = 1;
  auto codec = TransformCodec::Make(format, transforms_, o);
  if (!codec.ok()) return codec.status();
  KVS_LOG_INFO("kv codec: %s spends %.2f bits per element on the coded components",
               (*codec)->name().c_str(), (*codec)->allocated_bits_per_element());
  return std::shared_ptr<const KvBlockCodec>(*codec);
}

Expected<std::unique_ptr<EvictionPolicy>> EngineBuilder::EvictionPolicyFor(
    const EvictionConfig& config) {
  if (config.policy != "tri") return MakeEvictionPolicy(config.policy);
  if (tri_ == nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> tokens = KeyCalibrationTokens(tokenizer_, model_.config().n_vocab);
    auto run = calibration_runs_.Get(tokens, /*with_queries=*/true);
    if (!run.ok()) return run.status();
    auto calibration = MeasureTriCalibration(model_, **run);
    if (!calibration.ok()) return calibration.status();
    tri_ = std::move(*calibration);
    KVS_LOG_INFO(
        "eviction: tri query centres measured on %zu tokens in %.0f ms", tokens.size(),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return MakeEvictionPolicy(config.policy, tri_);
}

Expected<std::unique_ptr<SingleSequence>> EngineBuilder::Single(int32_t n_ctx) {
  if (n_ctx < 1) return Status::Error(StrFormat("context %d: must be positive", n_ctx));
  auto format = Format(kv_.block_size, n_ctx);
  if (!format.ok()) return format.status();
  return std::make_unique<SingleSequence>(model_, pool_, n_ctx, *format);
}

}  // namespace kvs
