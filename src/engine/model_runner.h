// The model runner: turns a step's plan into one ragged batch over the paged KV memory it owns,
// and runs the forward pass.
#pragma once

#include <memory>

#include "core/thread_pool.h"
#include "engine/step_runner.h"
#include "kv/kv_storage.h"
#include "model/forward.h"
#include "model/weights.h"

namespace kvs {

// The K/V geometry of a model's cache with the given pool block size.
KvGeometry ModelKvGeometry(const ModelConfig& config, int32_t block_size, KvTypes types = {});

class ModelRunner final : public StepRunner {
 public:
  // n_blocks counts the null block, as KvCacheManager's does; both must agree.
  // key_coding: see KvStorage::SetKeyCoding (empty: none).
  ModelRunner(const Model& model, ThreadPool& pool, int32_t block_size, int32_t n_blocks,
              KvTypes types = {}, KeyCoding key_coding = {});

  int32_t n_vocab() const override { return model_.config().n_vocab; }
  Status Execute(const StepInput& step, float* logits) override;
  const KvStorage& storage() const { return storage_; }

 private:
  const Model& model_;
  KvStorage storage_;
  ForwardPass forward_;
  RaggedBatch batch_;
};

}  // namespace kvs
