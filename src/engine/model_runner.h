// The model runner: turns a step's plan into one ragged batch over the paged KV memory it owns,
// and runs the forward pass.
#pragma once

#include <memory>
#include <unordered_map>

#include "core/thread_pool.h"
#include "engine/kv_format_factory.h"
#include "engine/step_runner.h"
#include "engine/step_sampler.h"
#include "kv/kv_storage.h"
#include "model/forward.h"
#include "model/weights.h"

namespace kvs {

class ModelRunner final : public StepRunner {
 public:
  // n_blocks counts the null block, as KvCacheManager's does; both must agree. Built by
  // EngineBuilder (engine_builder.h), which makes the format.
  ModelRunner(const Model& model, ThreadPool& pool, KvFormatPtr format, int32_t n_blocks);

  int32_t n_vocab() const override { return model_.config().n_vocab; }
  Status CopyBlocks(std::span<const BlockCopy> copies) override;
  double KvShareAt(int32_t n_context) const override;
  Status Execute(const StepBatch& step, StepOutput* out) override;
  KvKeyShape key_shape() const override;
  Status ReadKeys(std::span<const BlockId> table, int32_t n_slots,
                  std::span<const int32_t> slot_positions, int32_t layer,
                  std::span<float> keys) override;
  Status MoveSlots(std::span<const BlockId> table, std::span<const SlotMove> moves) override;
  std::vector<KvGroupSpec> kv_groups() const override { return model_.config().kv_groups; }
  const KvStorage& storage() const { return storage_; }
  // The self drafter writes its draft tokens' K/V into the sequences' own lookahead slots.
  KvStorage& mutable_storage() { return storage_; }
  const Model& model() const { return model_; }

 private:
  // Applies run's table changes to its kernel tables (one per KV group); an error for a change
  // or a table that does not fit.
  Status ApplyTables(const StepRun& run, std::vector<std::vector<int32_t>>* tables);

  const Model& model_;
  double weight_bytes_;  // Model::WeightBytesPerToken, for KvShareAt (asked per sequence and step)
  KvStorage storage_;
  ForwardPass forward_;
  RaggedBatch batch_;
  // Each sequence's block table as kernel blocks (KvStorage::KernelBlocks), kept by the steps'
  // changes: a step expands only the blocks that changed.
  std::unordered_map<int64_t, std::vector<std::vector<int32_t>>> kernel_tables_;  // [n_groups]
  StepSampler sampler_;
  std::vector<float> logits_;                // [n_logit_rows][n_vocab] of a step that draws
  std::vector<float> head_keys_, key_rope_;  // ReadKeys scratch
};

}  // namespace kvs
