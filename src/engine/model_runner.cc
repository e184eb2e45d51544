#include "engine/model_runner.h"

#include <utility>

namespace kvs {

ModelRunner::ModelRunner(const Model& model, ThreadPool& pool, KvFormatPtr format, int32_t n_blocks)
    : model_(model),
      weight_bytes_(static_cast<double>(model.WeightBytesPerToken())),
      storage_(std::move(format), n_blocks),
      forward_(model, pool) {}

Status ModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  const int32_t m = storage_.kernel_blocks_per_block();
  for (const BlockCopy& copy : copies) {
    for (const KvLayerView& layer : storage_.layers()) {
      CopyKvBlocks(layer, static_cast<int64_t>(copy.src.value) * m,
                   static_cast<int64_t>(copy.dst.value) * m, m);
    }
  }
  return Status::Ok();
}

double ModelRunner::KvShareAt(int32_t n_context) const {
  const double kv = static_cast<double>(storage_.geometry().BytesPerBlock()) /
                    storage_.geometry().block_size * n_context;
  return kv / (kv + weight_bytes_);
}

Status ModelRunner::Execute(const StepInput& step, float* logits) {
  const int32_t m = storage_.kernel_blocks_per_block();
  KVS_RETURN_IF_ERROR(CopyBlocks(step.copies));
  batch_.Clear();
  for (const ScheduledRun& r : step.runs) {
    const Sequence& seq = *r.seq;
    const BlockTable& table = step.kv->Table(seq.id);
    std::vector<int32_t> kernel_blocks;
    kernel_blocks.reserve(table.blocks.size() * m);
    for (BlockId b : table.blocks) {
      for (int32_t j = 0; j < m; ++j) kernel_blocks.push_back(b.value * m + j);
    }
    batch_.AddSequence(seq.tokens.data() + seq.n_computed, r.n_tokens, seq.n_computed,
                       std::move(kernel_blocks), r.n_logits);
  }
  storage_.ReservePositions(batch_.max_position + 1);
  return forward_.Run(batch_, storage_.layers(), logits);
}

}  // namespace kvs
