#include "engine/spec/self_drafter.h"

#include <algorithm>

namespace kvs {

SelfDrafter::SelfDrafter(const Model& target, const Model& view, ThreadPool& pool,
                         KvStorage& storage, SelfDraftOptions options)
    : view_(view),
      storage_(storage),
      options_(options),
      cost_(static_cast<double>(view.WeightBytesPerToken()) /
            static_cast<double>(std::max<size_t>(1, target.WeightBytesPerToken()))),
      view_bytes_(static_cast<double>(view.WeightBytesPerToken())),
      target_bytes_(static_cast<double>(target.WeightBytesPerToken())),
      kv_per_position_(static_cast<double>(storage.geometry().BytesPerBlock()) /
                       storage.geometry().block_size),
      forward_(view, pool) {
  if (options_.window > 0) {
    options_.window = (options_.window + kKvBlockTokens - 1) / kKvBlockTokens * kKvBlockTokens;
  }
}

double SelfDrafter::relative_cost_at(int32_t n_context) const {
  const int32_t seen = options_.window > 0
                           ? std::min(n_context, options_.window + SelfDraftOptions::kSinkTokens)
                           : n_context;
  return (view_bytes_ + seen * kv_per_position_) /
         std::max(1.0, target_bytes_ + n_context * kv_per_position_);
}

void SelfDrafter::AddWindowed(const BlockTable& table, int32_t token, int32_t pos) {
  // Only the blocks the draft reads (sinks and window), not the whole table's expansion.
  auto kernel_block = [&](int32_t b) { return storage_.KernelBlock(table.blocks, b); };
  const int32_t last = pos / kKvBlockTokens;
  const int32_t sinks = SelfDraftOptions::kSinkTokens / kKvBlockTokens;
  const int32_t from = options_.window > 0 ? (pos + 1 - options_.window) / kKvBlockTokens : 0;
  std::vector<int32_t> blocks;
  if (from <= sinks) {  // the window reaches the sinks: every slot, slot i at position i
    for (int32_t b = 0; b <= last; ++b) blocks.push_back(kernel_block(b));
    batch_.AddSequence(&token, 1, pos, std::move(blocks), 1);
    return;
  }
  std::vector<int32_t> positions;
  for (int32_t b = 0; b < sinks; ++b) blocks.push_back(kernel_block(b));
  for (int32_t b = from; b <= last; ++b) blocks.push_back(kernel_block(b));
  for (int32_t b : {0, from}) {
    const int32_t end = b == 0 ? sinks : last + 1;
    for (int32_t lb = b; lb < end; ++lb) {
      for (int32_t i = 0; i < kKvBlockTokens && lb * kKvBlockTokens + i <= pos; ++i) {
        positions.push_back(lb * kKvBlockTokens + i);
      }
    }
  }
  const int32_t n_cached = static_cast<int32_t>(positions.size()) - 1;  // the last is pos itself
  batch_.AddSequence(&token, 1, n_cached, std::move(blocks), 1, pos, std::move(positions));
}

Status SelfDrafter::Propose(std::span<const DraftRequest> requests, const KvCacheManager& kv,
                            std::span<Draft> drafts) {
  const int32_t n_vocab = view_.config().n_vocab;
  int32_t k_max = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    k_max = std::max(k_max, requests[i].max_drafts);
    drafts[i].tokens.clear();
    drafts[i].probs.clear();
    const Sequence& seq = *requests[i].seq;
    auto& sampler = samplers_[seq.id];
    if (!sampler) {
      SamplingParams params = seq.sampling.params;
      params.seed ^= 0x5E1FD7AF7ull;  // the draft's draws are independent of the target's
      sampler = std::make_unique<Sampler>(params, n_vocab);
    }
  }
  // One draft forward per drafted position, each over every sequence still drafting.
  std::vector<size_t> in_batch;
  for (int32_t j = 0; j < k_max; ++j) {
    batch_.Clear();
    in_batch.clear();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (requests[i].max_drafts <= j) continue;
      const Sequence& seq = *requests[i].seq;
      const int32_t pos = seq.n_committed() - 1 + j;
      const int32_t token = j == 0 ? seq.tokens[seq.n_committed() - 1] : drafts[i].tokens[j - 1];
      AddWindowed(kv.Table(seq.id), token, pos);
      in_batch.push_back(i);
    }
    logits_.resize(in_batch.size() * static_cast<size_t>(n_vocab));
    storage_.ReservePositions(batch_.max_position + 1);
    KVS_RETURN_IF_ERROR(forward_.Run(batch_, storage_.layers(), logits_.data()));
    for (size_t r = 0; r < in_batch.size(); ++r) {
      const size_t i = in_batch[r];
      const Sequence& seq = *requests[i].seq;
      Sampler& sampler = *samplers_.at(seq.id);
      const SampledToken t = sampler.SampleWithDistribution(
          logits_.data() + r * n_vocab, std::span(seq.tokens.data(), seq.n_committed()),
          drafts[i].tokens);
      drafts[i].tokens.push_back(t.token);
      // Greedy drafts are point masses; sampled ones carry q for the rejection rule.
      if (sampler.params().temperature > 0.f)
        drafts[i].probs.emplace_back(t.probs.begin(), t.probs.end());
    }
  }
  return Status::Ok();
}

}  // namespace kvs
