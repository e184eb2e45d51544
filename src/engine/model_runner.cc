#include "engine/model_runner.h"

#include <algorithm>
#include <utility>

#include "kernels/attention.h"

namespace kvs {

namespace {
// Each layer's place in its KV group: the slab its blocks are in (kv_storage.h). A model of one
// group has a slab per layer.
std::vector<int32_t> LayerSlabs(const ModelConfig& c) {
  std::vector<int32_t> slabs;
  for (const LayerSpec& l : c.layers) slabs.push_back(l.kv_slab);
  return slabs;
}
}  // namespace

ModelRunner::ModelRunner(const Model& model, ThreadPool& pool, KvFormatPtr format, int32_t n_blocks)
    : model_(model),
      weight_bytes_(static_cast<double>(model.WeightBytesPerToken())),
      storage_(std::move(format), n_blocks, LayerSlabs(model.config())),
      forward_(model, pool),
      sampler_(model.config().n_vocab) {}

Status ModelRunner::CopyBlocks(std::span<const BlockCopy> copies) {
  const int32_t m = storage_.kernel_blocks_per_block();
  for (const BlockCopy& copy : copies) {
    for (int32_t l : storage_.slab_layers()) {
      CopyKvBlocks(storage_.layers()[l], static_cast<int64_t>(copy.src.value) * m,
                   static_cast<int64_t>(copy.dst.value) * m, m);
    }
  }
  return Status::Ok();
}

double ModelRunner::KvShareAt(int32_t n_context) const {
  const double kv =
      static_cast<double>(storage_.block_bytes()) / storage_.geometry().block_size * n_context;
  return kv / (kv + weight_bytes_);
}

Status ModelRunner::ApplyTables(const StepRun& r, std::vector<std::vector<int32_t>>* tables) {
  const int32_t m = storage_.kernel_blocks_per_block();
  const size_t n_groups = model_.config().kv_groups.size();
  if (r.tables.size() != n_groups) {
    return Status::Error(StrFormat("step: sequence %lld's run has %zu block tables, not %zu",
                                   static_cast<long long>(r.seq), r.tables.size(), n_groups));
  }
  tables->resize(n_groups);
  for (size_t g = 0; g < n_groups; ++g) {
    std::vector<int32_t>& kernel_blocks = (*tables)[g];
    const TableDelta& d = r.tables[g];
    if (d.keep < 0 || static_cast<size_t>(d.keep) * m > kernel_blocks.size()) {
      return Status::Error(StrFormat("step: sequence %lld's table change does not fit its table",
                                     static_cast<long long>(r.seq)));
    }
    kernel_blocks.resize(static_cast<size_t>(d.keep) * m);
    const std::vector<int32_t> appended = storage_.KernelBlocks(d.append);
    kernel_blocks.insert(kernel_blocks.end(), appended.begin(), appended.end());
    if (static_cast<int64_t>(kernel_blocks.size()) * kKvBlockTokens <
        static_cast<int64_t>(r.n_cached) + r.n_tokens) {
      return Status::Error(StrFormat(
          "step: sequence %lld's table holds %zu slots, not %d", static_cast<long long>(r.seq),
          kernel_blocks.size() * kKvBlockTokens, r.n_cached + r.n_tokens));
    }
  }
  return Status::Ok();
}

Status ModelRunner::Execute(const StepBatch& step, StepOutput* out) {
  for (int64_t seq : step.released) kernel_tables_.erase(seq);
  KVS_RETURN_IF_ERROR(sampler_.Apply(step));
  KVS_RETURN_IF_ERROR(CopyBlocks(step.copies));
  batch_.Clear();
  out->attention_mass.resize(step.runs.size());
  for (size_t i = 0; i < step.runs.size(); ++i) {
    const StepRun& r = step.runs[i];
    // A batch that does not fit what this runner holds is an error, never a read of block 0.
    if (r.first_token < 0 || r.n_tokens < 1 || r.n_cached < 0 || r.n_logits < 0 ||
        r.n_logits > r.n_tokens ||
        static_cast<int64_t>(r.first_token) + r.n_tokens > step.n_tokens() ||
        (!r.key_positions.empty() &&
         std::ssize(r.key_positions) != static_cast<int64_t>(r.n_cached) + r.n_tokens)) {
      return Status::Error(
          StrFormat("step: sequence %lld's run does not fit the batch or its table",
                    static_cast<long long>(r.seq)));
    }
    std::vector<std::vector<int32_t>>& tables = kernel_tables_[r.seq];
    KVS_RETURN_IF_ERROR(ApplyTables(r, &tables));
    batch_.AddSequence(step.tokens.data() + r.first_token, r.n_tokens, r.n_cached, tables,
                       r.n_logits, r.first_position, r.key_positions);
    std::vector<float>& mass = out->attention_mass[i];
    mass.clear();
    if (r.mass_first_token >= 0) {
      mass.assign(r.attention_mass.begin(), r.attention_mass.end());
      mass.resize(static_cast<size_t>(r.n_cached) + r.n_tokens, 0.0f);
      BatchSequence& bs = batch_.sequences.back();
      bs.attention_mass = mass.data();
      bs.mass_first_token = r.mass_first_token;
    }
  }
  std::vector<float>& logits = step.return_logits ? out->logits : logits_;
  logits.resize(static_cast<size_t>(step.n_logit_rows) * n_vocab());
  storage_.ReservePositions(batch_.max_position + 1);
  KVS_RETURN_IF_ERROR(forward_.Run(batch_, storage_.layers(), logits.data()));
  if (step.return_logits) {
    out->sampled.assign(step.runs.size(), {});
    return Status::Ok();
  }
  return sampler_.Sample(step, logits.data(), out);
}

KvKeyShape ModelRunner::key_shape() const {
  const ModelConfig& c = model_.config();
  return {c.n_layer, c.n_head_kv, c.head_dim_k};
}

Status ModelRunner::ReadKeys(std::span<const BlockId> table, int32_t n_slots,
                             std::span<const int32_t> slot_positions, int32_t layer,
                             std::span<float> keys) {
  const ModelConfig& c = model_.config();
  const int32_t n = n_slots, hk = c.head_dim_k;
  if (layer < 0 || layer >= c.n_layer || n < 0 ||
      keys.size() != static_cast<size_t>(n) * c.n_head_kv * hk ||
      static_cast<int64_t>(table.size()) * storage_.geometry().block_size < n ||
      (!slot_positions.empty() && static_cast<int64_t>(slot_positions.size()) != n)) {
    return Status::Error("ReadKeys: layer, slot count, positions or key buffer out of range");
  }
  const std::vector<int32_t> kernel_blocks = storage_.KernelBlocks(table);
  const KvLayerView& view = storage_.layers()[layer];
  const float* key_rope = nullptr;
  if (view.NeedsRopeTable() && !slot_positions.empty()) {
    GatherKeyRope(view, slot_positions, &key_rope_);
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

Status ModelRunner::MoveSlots(std::span<const BlockId> table, std::span<const SlotMove> moves) {
  const int32_t bs = storage_.geometry().block_size;
  const int64_t capacity = static_cast<int64_t>(table.size()) * bs;
  for (const SlotMove& mv : moves) {
    if (mv.src < 0 || mv.dst < 0 || mv.src >= capacity || mv.dst >= capacity) {
      return Status::Error(
          StrFormat("MoveSlots: slot %d or %d is outside the table", mv.src, mv.dst));
    }
  }
  auto physical = [&](int32_t slot) {
    return static_cast<int64_t>(table[slot / bs].value) * bs + slot % bs;
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
