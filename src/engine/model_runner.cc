#include "engine/model_runner.h"

#include <algorithm>
#include <utility>

#include "engine/evictor.h"
#include "kernels/attention.h"

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
  KVS_RETURN_IF_ERROR(CopyBlocks(step.copies));
  batch_.Clear();
  for (const ScheduledRun& r : step.runs) {
    Sequence& seq = *r.seq;
    std::vector<int32_t> kernel_blocks = storage_.KernelBlocks(step.kv->Table(seq.id).blocks);
    // After token eviction the cached slots are fewer than the positions computed, and slot i
    // holds the key of position slot_positions[i]; new tokens continue at their true positions.
    const int32_t n_cached = seq.n_slots();
    std::vector<int32_t> key_positions;
    if (seq.n_evicted > 0) {
      key_positions.reserve(static_cast<size_t>(n_cached) + r.n_tokens);
      key_positions = seq.slot_positions;
      for (int32_t i = 0; i < r.n_tokens; ++i) key_positions.push_back(seq.n_computed + i);
    }
    batch_.AddSequence(seq.tokens.data() + seq.n_computed, r.n_tokens, n_cached,
                       std::move(kernel_blocks), r.n_logits, seq.n_computed,
                       std::move(key_positions));
    if (seq.observe_attention) {
      seq.attention_mass.resize(static_cast<size_t>(n_cached) + r.n_tokens, 0.0f);
      BatchSequence& bs = batch_.sequences.back();
      bs.attention_mass = seq.attention_mass.data();
      bs.mass_first_token = Evictor::FirstObservedToken(seq, seq.n_computed, r.n_tokens);
    }
  }
  storage_.ReservePositions(batch_.max_position + 1);
  return forward_.Run(batch_, storage_.layers(), logits);
}

KvKeyShape ModelRunner::key_shape() const {
  const ModelConfig& c = model_.config();
  return {c.n_layer, c.n_head_kv, c.head_dim_k};
}

Status ModelRunner::ReadKeys(const Sequence& seq, const BlockTable& table, int32_t layer,
                             std::span<float> keys) {
  const ModelConfig& c = model_.config();
  const int32_t n = seq.n_slots(), hk = c.head_dim_k;
  if (layer < 0 || layer >= c.n_layer || keys.size() != static_cast<size_t>(n) * c.n_head_kv * hk ||
      table.num_tokens < n) {
    return Status::Error("ReadKeys: layer, slot count or key buffer out of range");
  }
  const std::vector<int32_t> kernel_blocks = storage_.KernelBlocks(table.blocks);
  const KvLayerView& view = storage_.layers()[layer];
  const float* key_rope = nullptr;
  if (view.NeedsRopeTable() && seq.n_evicted > 0) {
    GatherKeyRope(view, seq.slot_positions, &key_rope_);
    key_rope = key_rope_.data();
  }
  head_keys_.resize(static_cast<size_t>(n) * hk);
  for (int32_t g = 0; g < c.n_head_kv; ++g) {
    LoadKeys(view.Head(g, kernel_blocks.data(), key_rope), hk, n, head_keys_.data());
    const bool add_offset = view.key_coding == KeyCodingKind::kConstantOffset;
    for (int32_t i = 0; i < n; ++i) {
      float* dst = keys.data() + (static_cast<size_t>(i) * c.n_head_kv + g) * hk;
      const float* src = head_keys_.data() + static_cast<size_t>(i) * hk;
      for (int32_t d = 0; d < hk; ++d) {
        dst[d] = src[d] + (add_offset ? view.k_offset[static_cast<size_t>(g) * hk + d] : 0.0f);
      }
    }
  }
  return Status::Ok();
}

Status ModelRunner::MoveSlots(const BlockTable& table, std::span<const SlotMove> moves) {
  const int32_t bs = storage_.geometry().block_size;
  const int64_t capacity = static_cast<int64_t>(table.blocks.size()) * bs;
  for (const SlotMove& mv : moves) {
    if (mv.src < 0 || mv.dst < 0 || mv.src >= capacity || mv.dst >= capacity) {
      return Status::Error(
          StrFormat("MoveSlots: slot %d or %d is outside the table", mv.src, mv.dst));
    }
  }
  auto physical = [&](int32_t slot) {
    return static_cast<int64_t>(table.blocks[slot / bs].value) * bs + slot % bs;
  };
  // Runs of consecutive moves (src and dst both + 1) within one pool block on each side are
  // one byte copy per head row: compaction moves long stretches by the same shift.
  for (size_t i = 0; i < moves.size();) {
    const int32_t src = moves[i].src, dst = moves[i].dst;
    const int32_t room = std::min(bs - src % bs, bs - dst % bs);
    int32_t len = 1;
    while (len < room && i + len < moves.size() && moves[i + len].src == src + len &&
           moves[i + len].dst == dst + len) {
      ++len;
    }
    for (const KvLayerView& layer : storage_.layers()) {
      MoveKvSlots(layer, physical(src), physical(dst), len);
    }
    i += static_cast<size_t>(len);
  }
  return Status::Ok();
}

}  // namespace kvs
