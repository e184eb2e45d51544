// A small model of the target's vocabulary drafts for it (Leviathan et al. 2023): it runs over
// KV of its own, in a pool of its own, and proposes the next k tokens of every sequence with k
// forward passes of its own per step (a catch-up pass, then k - 1 single-token passes), each one
// ragged batch over all the sequences still drafting.
//
// Its KV cannot share the target's storage: a block's bytes depend on the model's layers, heads
// and head size, so the draft has its own KvCacheManager (no prefix caching: a draft's blocks
// are cheap to recompute and never worth an index) and KvStorage. Per sequence it keeps the
// tokens its KV holds; Propose compares them with the sequence's committed tokens, rolls its
// table back to what they share (the engine truncated rejected drafts away) and computes the
// rest, so the engine tells it nothing but Release.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/kv_format_factory.h"
#include "engine/spec/drafter.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_storage.h"
#include "model/batch.h"
#include "model/forward.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

struct DraftModelOptions {
  // The draft's KV format (types, block size); n_ctx is set by the factory. f16 K and V by
  // default: the draft's keys need not be the target's type, and f16 halves f32's memory at no
  // measurable cost to a draft's proposals.
  KvFormatOptions kv = KvFormatWithTypes({KvType::kF16, KvType::kF16});
  // For the calibration paragraph of a quantized K type (null: fixed pseudo-random tokens).
  const Tokenizer* tokenizer = nullptr;
  // Most tokens of one catch-up pass: a long prompt is prefilled in chunks of this many.
  int32_t max_batch_tokens = 512;
  // Blocks of the draft's pool, the null block included; 0: enough for max_seqs sequences of
  // n_ctx positions each, so that the pool is never short while the engine keeps its limits.
  int32_t n_blocks = 0;
};

class DraftModelDrafter final : public Drafter {
 public:
  // Built by MakeDraftModelDrafter, which checks the pairing and makes the format. n_blocks
  // counts the null block. relative_cost: draft bytes per token / target bytes per token.
  DraftModelDrafter(const Model& draft, ThreadPool& pool, KvFormatPtr format, int32_t n_blocks,
                    double relative_cost, int32_t max_batch_tokens);

  std::string_view name() const override { return "draft"; }
  double relative_cost() const override { return relative_cost_; }
  double relative_cost_at(int32_t n_context) const override;
  // The target's weight and KV bytes per position, for relative_cost_at (the builder knows the
  // target's KV format); unset, relative_cost_at is relative_cost.
  void SetTargetCost(double weight_bytes, double kv_bytes_per_position) {
    target_bytes_ = weight_bytes;
    target_kv_per_position_ = kv_bytes_per_position;
  }
  // Per request: catch up to the last committed token (a whole prefill for a sequence it has
  // not seen, in chunks of max_batch_tokens), draw draft 1, then draw up to max_drafts - 1 more.
  // A sequence gets fewer drafts (maybe none) when the draft's pool is short; only a failed
  // forward pass is an error, and it drops the state of every sequence of the call. The
  // target's KV (kv) is not used.
  Status Propose(std::span<const DraftRequest> requests, const KvCacheManager& kv,
                 std::span<Draft> drafts) override;
  void Release(SeqId seq) override;

  // The draft's own pool (tests read its free blocks), and the sequences it keeps state for.
  const KvCacheManager& kv() const { return kv_; }
  int32_t num_sequences() const { return static_cast<int32_t>(states_.size()); }

 private:
  struct SeqState {
    std::vector<int32_t> tokens;  // the tokens whose K/V the draft's cache holds, positions 0..
    std::unique_ptr<Sampler> sampler;  // the sequence's parameters, a seed of the draft's own
  };
  // A request being drafted this call.
  struct Active {
    int32_t request;  // index into requests / drafts
    SeqState* state;
    int32_t n_committed;  // the sequence's committed tokens
    int32_t max_drafts;
    bool stopped = false;  // the pool had no slot for its next draft
  };

  // Rolls the sequence's table back to the prefix it shares with the committed tokens (never
  // the last one: its logits give draft 1) and gives the rest slots. False: the pool is short.
  bool Prepare(const DraftRequest& request, SeqState& state);
  // Propose's parts: the requests checked (before any state changes), the sequences that draft
  // this step made active_, their committed tokens caught up (drawing draft 1), then drafts
  // 2..k one pass each.
  Status CheckRequests(std::span<const DraftRequest> requests, std::span<const Draft> drafts) const;
  void Activate(std::span<const DraftRequest> requests);
  Status CatchUp(std::span<const DraftRequest> requests, std::span<Draft> drafts);
  Status DraftRest(std::span<const DraftRequest> requests, std::span<Draft> drafts);
  // Runs batch_ over the draft's KV; its logit rows land in logits_.
  Status Forward();
  // The kernel blocks (16 slots) of the sequence's table.
  std::vector<int32_t> KernelBlocks(SeqId seq) const;
  void Draw(const Active& a, const Sequence& seq, const float* logits, Draft& draft);
  // Drops the state of every active sequence after a failed pass (its K/V is unknown).
  void Abandon(std::span<const DraftRequest> requests, std::span<Draft> drafts);

  int32_t n_vocab_;
  double relative_cost_;
  double target_bytes_ = 0, target_kv_per_position_ = 0;
  int32_t max_batch_tokens_;
  KvCacheManager kv_;
  KvStorage storage_;
  ForwardPass forward_;
  RaggedBatch batch_;
  std::vector<float> logits_;  // [batch_.logit_rows.size()][n_vocab]
  std::unordered_map<SeqId, SeqState> states_;
  std::vector<Active> active_;      // this call's requests with slots, in request order
  std::vector<int32_t> row_owner_;  // [batch_.logit_rows.size()] the active_ index of each row
};

// Refuses a pair that cannot draft for each other, naming the mismatch: another vocabulary size
// (equality is required; llama.cpp tolerates a small difference, SPEC_VOCAB_MAX_SIZE_DIFFERENCE,
// which would let the draft propose ids the target reads as other tokens), another tokenizer
// model (llama, gpt2, ...), a token whose text differs (tokenizer.ggml.tokens), or other BOS/EOS
// ids. A model without tokenizer metadata is refused: the pairing cannot be checked.
Status CheckDraftPairing(const Model& target, const Model& draft);

// The drafter over a pool for max_seqs sequences of n_ctx positions (or options.n_blocks).
Expected<std::unique_ptr<DraftModelDrafter>> MakeDraftModelDrafter(
    const Model& target, const Model& draft, ThreadPool& pool, int32_t n_ctx, int32_t max_seqs,
    const DraftModelOptions& options = {});

}  // namespace kvs
