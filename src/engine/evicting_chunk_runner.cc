#include "engine/evicting_chunk_runner.h"

#include <algorithm>
#include <utility>

#include "engine/engine_builder.h"

namespace kvs {

Expected<std::unique_ptr<EvictingChunkRunner>> EvictingChunkRunner::Make(
    const Model& model, ThreadPool& pool, const PerplexityOptions& options, int32_t n_ctx) {
  KVS_RETURN_IF_ERROR(options.eviction.Validate());
  KvFormatOptions kv = options.kv;
  kv.block_size = kKvBlockTokens;
  EngineBuilder builder(model, options.tokenizer, pool, kv);
  EngineConfig config;
  config.n_ctx = n_ctx;
  config.max_seqs = 1;
  config.block_size = kKvBlockTokens;
  config.n_blocks = n_ctx / kKvBlockTokens + 3;  // one chunk, the null block, a spare
  config.watermark_blocks = 0;
  config.eviction = options.eviction;
  auto runner = builder.Runner(config);
  if (!runner.ok()) return runner.status();
  auto policy = builder.EvictionPolicyFor(options.eviction);
  if (!policy.ok()) return policy.status();
  return std::unique_ptr<EvictingChunkRunner>(
      new EvictingChunkRunner(std::move(*runner), config.n_blocks, config.block_size,
                              std::make_unique<Evictor>(options.eviction, std::move(*policy))));
}

EvictingChunkRunner::EvictingChunkRunner(std::unique_ptr<ModelRunner> runner, int32_t n_blocks,
                                         int32_t block_size, std::unique_ptr<Evictor> evictor)
    : runner_(std::move(runner)), kv_(n_blocks, block_size), evictor_(std::move(evictor)) {}

Status EvictingChunkRunner::Step(Sequence* seq, bool end_of_prefill, float* logits) {
  const int32_t n = seq->n_pending();
  std::vector<BlockCopy> copies;
  if (!kv_.Append(seq->id, n, &copies)) return Status::Error("perplexity: the KV pool is full");
  const ScheduledRun run{seq, n, 1};
  batch_builder_.Build({&run, 1}, copies, kv_, &batch_);
  batch_.return_logits = true;
  KVS_RETURN_IF_ERROR(runner_->Execute(batch_, &output_));
  std::copy(output_.logits.begin(), output_.logits.end(), logits);
  if (!output_.attention_mass[0].empty()) seq->attention_mass.swap(output_.attention_mass[0]);
  // The row scored the positions cached when it was computed.
  kept_sum_ += static_cast<double>(seq->n_slots() + n) / (seq->n_computed + n);
  ++n_rows_;
  seq->AdvanceComputed(n);
  auto outcome = evictor_->AfterStep(
      seq, end_of_prefill ? EvictionPoint::kPrefillEnd : EvictionPoint::kDecode, kv_, *runner_);
  if (!outcome.ok()) return outcome.status();
  evicted_ += outcome->evicted;
  return Status::Ok();
}

Status EvictingChunkRunner::Run(const std::vector<int32_t>& chunk, int32_t first, float* logits) {
  const int32_t n_ctx = static_cast<int32_t>(chunk.size());
  const size_t n_vocab = static_cast<size_t>(runner_->n_vocab());
  Sequence seq;
  seq.id = SeqId{next_seq_++};
  seq.tokens.assign(chunk.begin(), chunk.begin() + first + 1);
  seq.n_prompt = first + 1;
  evictor_->Attach(&seq, {});
  Status status = Step(&seq, /*end_of_prefill=*/true, logits);
  for (int32_t pos = first + 1; status.ok() && pos < n_ctx - 1; ++pos) {
    seq.tokens.push_back(chunk[pos]);
    status = Step(&seq, /*end_of_prefill=*/false, logits + (pos - first) * n_vocab);
  }
  kv_.Free(seq.id);
  batch_builder_.Release(seq.id);
  return status;
}

}  // namespace kvs
