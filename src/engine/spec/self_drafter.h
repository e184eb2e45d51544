// Self-speculation: the target drafts for itself from a compressed view of itself — its weights
// re-quantized at load to a cheaper type (model/compressed_view.h) — attending to its own KV:
// by default all of it, or, with --draft-window N, a bounded subset: attention sinks (the first
// kSinkTokens positions) and the last N positions, so that a drafted token costs the view's
// weight bytes plus a fixed window of KV however long the context (MagicDec). There is no second
// file and no second cache.
//
// Why the whole context by default: on every model we can run at depth, a bounded window stops
// the draft agreeing with the target (llama-1b at 4K tokens: acceptance 0.17 with a window of
// 512, 0.27 with 2048, 0.59 with 3584, 0.97 with all; stories-hd64-3M at 400: 0.13 with 128,
// 1.0 with all), and the adaptive policy then turns speculation off. A window pays only where
// the model's attention is local (trained long-context models), so it is the user's choice.
//
// The KV the draft reads is the target's own, at the target's KV type: no copy is kept. The
// draft writes its drafted tokens' K/V into the sequence's lookahead slots (the drafter seam
// allows positions >= n_computed), where the verification pass rewrites them with the target's
// before any attention of the target reads them.
#pragma once

#include <map>
#include <memory>

#include "core/thread_pool.h"
#include "engine/spec/drafter.h"
#include "kv/kv_storage.h"
#include "model/batch.h"
#include "model/forward.h"
#include "model/weights.h"

namespace kvs {

struct SelfDraftOptions {
  // Recent positions the draft attends to (--draft-window), sinks aside; rounded up to the
  // kernel's 16-position blocks. 0: the whole context (no window).
  int32_t window = 0;
  static constexpr int32_t kSinkTokens = 16;  // one kernel block (StreamingLLM keeps 4)
};

class SelfDrafter final : public Drafter {
 public:
  // view: the compressed view of target (its config equals target's); storage: the KV the
  // target's runner owns. All three must outlive the drafter.
  SelfDrafter(const Model& target, const Model& view, ThreadPool& pool, KvStorage& storage,
              SelfDraftOptions options);

  std::string_view name() const override { return "self"; }
  double relative_cost() const override { return cost_; }
  double relative_cost_at(int32_t n_context) const override;
  Status Propose(std::span<const DraftRequest> requests, const KvCacheManager& kv,
                 std::span<Draft> drafts) override;
  void Release(SeqId seq) override { samplers_.erase(seq); }

 private:
  // Adds one token at position pos of seq to the batch, attending to the window of slots.
  void AddWindowed(const BlockTable& table, int32_t token, int32_t pos);

  const Model& view_;
  KvStorage& storage_;
  SelfDraftOptions options_;
  double cost_;
  double view_bytes_, target_bytes_, kv_per_position_;
  ForwardPass forward_;
  RaggedBatch batch_;
  std::vector<float> logits_;  // [requests][n_vocab]
  std::map<SeqId, std::unique_ptr<Sampler>> samplers_;
};

}  // namespace kvs
