#include "engine/spec/draft_model_drafter.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

#include "core/check.h"

namespace kvs {

namespace {

// The draft's sampler must not replay the target sampler's stream: with the same seed its draws
// would be the very uniforms the target's accept test then reads, correlating q's draws with the
// test of them.
constexpr uint64_t kDraftSeedMix = 0xD2AF7D2AF7D2AF71ull;

// A model's tokenizer metadata string, or "" when absent.
std::string MetaString(const Model& model, std::string_view key) {
  return model.file().GetString(key).value_or("");
}

}  // namespace

DraftModelDrafter::DraftModelDrafter(const Model& draft, ThreadPool& pool, KvFormatPtr format,
                                     int32_t n_blocks, double relative_cost,
                                     int32_t max_batch_tokens)
    : n_vocab_(draft.config().n_vocab),
      relative_cost_(relative_cost),
      max_batch_tokens_(std::max(max_batch_tokens, 1)),
      kv_(n_blocks, format->block_size()),
      storage_(std::move(format), n_blocks),
      forward_(draft, pool) {}

std::vector<int32_t> DraftModelDrafter::KernelBlocks(SeqId seq) const {
  return storage_.KernelBlocks(kv_.Table(seq).blocks);
}

bool DraftModelDrafter::Prepare(const DraftRequest& request, SeqState& state) {
  const Sequence& seq = *request.seq;
  const int32_t n_committed = seq.n_committed();
  // The committed tokens extend what was computed after an accepted step, and differ from it
  // after a rejection (or a fork's, a preemption's new history): keep the shared prefix, short
  // of the last committed token, whose logits are wanted.
  const int32_t limit = std::min(static_cast<int32_t>(state.tokens.size()), n_committed - 1);
  int32_t common = 0;
  while (common < limit && state.tokens[common] == seq.tokens[common]) ++common;
  const Status truncated = kv_.Truncate(seq.id, common);
  KVS_CHECK_MSG(truncated.ok(), truncated.message().c_str());  // the table holds state.tokens
  state.tokens.resize(common);
  std::vector<BlockCopy> copies;
  if (!kv_.Append(seq.id, n_committed - common, &copies)) return false;
  // The draft never forks and never shares a prefix, so no block is shared and none is copied.
  KVS_CHECK(copies.empty());
  return true;
}

Status DraftModelDrafter::Forward() {
  const size_t rows = batch_.logit_rows.size();
  if (logits_.size() < rows * n_vocab_) logits_.resize(rows * n_vocab_);
  storage_.ReservePositions(batch_.max_position + 1);
  return forward_.Run(batch_, storage_.layers(), logits_.data());
}

void DraftModelDrafter::Draw(const Active& a, const Sequence& seq, const float* logits,
                             Draft& draft) {
  // Drawn as the target's sampler would draw (penalties see the drafts so far as in flight),
  // so that the verification compares p and q processed alike.
  const SampledToken s = a.state->sampler->SampleWithDistribution(
      logits, std::span<const int32_t>(seq.tokens.data(), a.n_committed), draft.tokens);
  draft.tokens.push_back(s.token);
  draft.probs.emplace_back(s.probs.begin(), s.probs.end());
}

void DraftModelDrafter::Abandon(std::span<const DraftRequest> requests, std::span<Draft> drafts) {
  for (const Active& a : active_) Release(requests[a.request].seq->id);
  for (Draft& d : drafts) {
    d.tokens.clear();
    d.probs.clear();
  }
  active_.clear();
}

Status DraftModelDrafter::CheckRequests(std::span<const DraftRequest> requests,
                                        std::span<const Draft> drafts) const {
  if (drafts.size() != requests.size()) {
    return Status::Error(
        StrFormat("draft: %zu requests but %zu drafts", requests.size(), drafts.size()));
  }
  std::unordered_set<SeqId> seen;
  for (const DraftRequest& r : requests) {
    if (r.seq == nullptr || r.max_drafts <= 0) continue;
    if (!seen.insert(r.seq->id).second) {
      return Status::Error(StrFormat("draft: sequence %lld requested twice",
                                     static_cast<long long>(r.seq->id.value)));
    }
  }
  return Status::Ok();
}

void DraftModelDrafter::Activate(std::span<const DraftRequest> requests) {
  active_.clear();
  for (int32_t i = 0; i < static_cast<int32_t>(requests.size()); ++i) {
    const DraftRequest& r = requests[i];
    if (r.seq == nullptr || r.max_drafts <= 0 || r.seq->n_committed() < 1) continue;
    SeqState& state = states_[r.seq->id];
    if (state.sampler == nullptr) {
      SamplingParams params = r.seq->sampling.params;
      params.seed ^= kDraftSeedMix;
      state.sampler = std::make_unique<Sampler>(params, n_vocab_);
    }
    // A sequence the pool has no room to catch up gets no drafts this step; it keeps its
    // (truncated) blocks, and the others theirs: only Release frees a sequence's state.
    if (!Prepare(r, state)) continue;
    active_.push_back({i, &state, r.seq->n_committed(), r.max_drafts});
  }
}

Status DraftModelDrafter::CatchUp(std::span<const DraftRequest> requests, std::span<Draft> drafts) {
  // Every sequence's uncomputed committed tokens, packed into passes of at most
  // max_batch_tokens_ (a long prompt spans several); the last committed token's row draws
  // draft 1. Only a pass's last sequence can end it unfinished (it took the rest of the
  // budget), so the sequences of a pass are active_[next], active_[next + 1], ... in order.
  size_t next = 0;  // the first active sequence not fully caught up
  while (next < active_.size()) {
    batch_.Clear();
    row_owner_.clear();
    int32_t budget = max_batch_tokens_;
    for (size_t a = next; a < active_.size() && budget > 0; ++a) {
      const Active& act = active_[a];
      const Sequence& seq = *requests[act.request].seq;
      const int32_t from = static_cast<int32_t>(act.state->tokens.size());
      const int32_t n = std::min(act.n_committed - from, budget);
      const bool last = from + n == act.n_committed;
      batch_.AddSequence(seq.tokens.data() + from, n, from, KernelBlocks(seq.id), last ? 1 : 0);
      if (last) row_owner_.push_back(static_cast<int32_t>(a));
      budget -= n;
    }
    KVS_RETURN_IF_ERROR(Forward());
    // Record what the pass computed, then draw from the rows of the sequences it finished.
    for (const BatchSequence& s : batch_.sequences) {
      Active& act = active_[next];
      const Sequence& seq = *requests[act.request].seq;
      act.state->tokens.insert(act.state->tokens.end(), seq.tokens.begin() + s.n_cached,
                               seq.tokens.begin() + s.n_cached + s.n_tokens);
      if (static_cast<int32_t>(act.state->tokens.size()) == act.n_committed) ++next;
    }
    for (size_t r = 0; r < row_owner_.size(); ++r) {
      const Active& act = active_[row_owner_[r]];
      Draw(act, *requests[act.request].seq, logits_.data() + r * n_vocab_, drafts[act.request]);
    }
  }
  return Status::Ok();
}

Status DraftModelDrafter::DraftRest(std::span<const DraftRequest> requests,
                                    std::span<Draft> drafts) {
  // Drafts 2..k: one single-token pass over every sequence still drafting, the last draft in.
  for (;;) {
    batch_.Clear();
    row_owner_.clear();
    for (size_t a = 0; a < active_.size(); ++a) {
      Active& act = active_[a];
      const Draft& d = drafts[act.request];
      if (act.stopped || static_cast<int32_t>(d.tokens.size()) >= act.max_drafts) continue;
      const SeqId id = requests[act.request].seq->id;
      std::vector<BlockCopy> copies;
      if (!kv_.Append(id, 1, &copies)) {  // the pool is full: fewer drafts, not a failure
        act.stopped = true;
        continue;
      }
      KVS_CHECK(copies.empty());
      const int32_t pos = static_cast<int32_t>(act.state->tokens.size());
      batch_.AddSequence(&d.tokens.back(), 1, pos, KernelBlocks(id), 1);
      row_owner_.push_back(static_cast<int32_t>(a));
    }
    if (batch_.n_tokens() == 0) return Status::Ok();
    KVS_RETURN_IF_ERROR(Forward());
    for (size_t r = 0; r < row_owner_.size(); ++r) {
      const Active& act = active_[row_owner_[r]];
      Draft& d = drafts[act.request];
      act.state->tokens.push_back(d.tokens.back());
      Draw(act, *requests[act.request].seq, logits_.data() + r * n_vocab_, d);
    }
  }
}

Status DraftModelDrafter::Propose(std::span<const DraftRequest> requests,
                                  const KvCacheManager& /*kv*/, std::span<Draft> drafts) {
  if (drafts.size() == requests.size()) {
    for (Draft& d : drafts) {
      d.tokens.clear();
      d.probs.clear();
    }
  }
  // Checked before any state changes, so that a refused call leaves every sequence as it was.
  KVS_RETURN_IF_ERROR(CheckRequests(requests, drafts));
  Activate(requests);
  Status st = CatchUp(requests, drafts);
  if (st.ok()) st = DraftRest(requests, drafts);
  if (!st.ok()) {
    Abandon(requests, drafts);
    return st;
  }
  active_.clear();
  return Status::Ok();
}

void DraftModelDrafter::Release(SeqId seq) {
  kv_.Free(seq);
  states_.erase(seq);
}

Status CheckDraftPairing(const Model& target, const Model& draft) {
  const int32_t vt = target.config().n_vocab;
  const int32_t vd = draft.config().n_vocab;
  if (vt != vd) {
    return Status::Error(StrFormat(
        "draft model: its vocabulary has %d tokens, the target's %d; a draft model must have "
        "exactly the target's vocabulary (no size difference is allowed)",
        vd, vt));
  }
  const std::string mt = MetaString(target, "tokenizer.ggml.model");
  const std::string md = MetaString(draft, "tokenizer.ggml.model");
  if (mt.empty() || md.empty()) {
    return Status::Error(StrFormat(
        "draft model: the %s has no tokenizer.ggml.model; the vocabularies cannot be compared",
        mt.empty() ? "target" : "draft"));
  }
  if (mt != md) {
    return Status::Error(
        StrFormat("draft model: its tokenizer model is %s, the target's %s; they must be the same",
                  md.c_str(), mt.c_str()));
  }
  const gguf::Value* tt = target.file().Find("tokenizer.ggml.tokens");
  const gguf::Value* td = draft.file().Find("tokenizer.ggml.tokens");
  if (tt == nullptr || td == nullptr || tt->type != gguf::ValueType::kArray ||
      td->type != gguf::ValueType::kArray) {
    return Status::Error(StrFormat(
        "draft model: the %s has no tokenizer.ggml.tokens array; the vocabularies cannot be "
        "compared",
        tt == nullptr || tt->type != gguf::ValueType::kArray ? "target" : "draft"));
  }
  if (tt->strings.size() != td->strings.size()) {
    return Status::Error(StrFormat(
        "draft model: its tokenizer lists %zu tokens, the target's %zu; they must be the same",
        td->strings.size(), tt->strings.size()));
  }
  for (size_t i = 0; i < tt->strings.size(); ++i) {
    if (tt->strings[i] != td->strings[i]) {
      return Status::Error(StrFormat(
          "draft model: token %zu is \"%s\" in the draft's vocabulary, \"%s\" in the target's; "
          "the vocabularies must be the same",
          i, td->strings[i].c_str(), tt->strings[i].c_str()));
    }
  }
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    const auto it = target.file().GetUint(key);
    const auto id = draft.file().GetUint(key);
    if (it != id) {
      const auto show = [](std::optional<uint64_t> v) {
        return v ? StrFormat("%llu", static_cast<unsigned long long>(*v)) : std::string("none");
      };
      return Status::Error(StrFormat("draft model: its %s is %s, the target's %s", key,
                                     show(id).c_str(), show(it).c_str()));
    }
  }
  return Status::Ok();
}

double DraftModelDrafter::relative_cost_at(int32_t n_context) const {
  if (target_bytes_ <= 0) return relative_cost_;
  // The draft reads its weights and its own KV of the whole context.
  const double draft_kv =
      static_cast<double>(storage_.geometry().BytesPerBlock()) / storage_.geometry().block_size;
  return (relative_cost_ * target_bytes_ + n_context * draft_kv) /
         (target_bytes_ + n_context * target_kv_per_position_);
}

Expected<std::unique_ptr<DraftModelDrafter>> MakeDraftModelDrafter(
    const Model& target, const Model& draft, ThreadPool& pool, int32_t n_ctx, int32_t max_seqs,
    const DraftModelOptions& options) {
  KVS_RETURN_IF_ERROR(CheckDraftPairing(target, draft));
  if (n_ctx < 1 || max_seqs < 1) {
    return Status::Error(
        StrFormat("draft model: context %d and sequences %d must be positive", n_ctx, max_seqs));
  }
  KvFormatOptions kv = options.kv;
  kv.n_ctx = n_ctx;
  auto format = MakeKvFormat(draft, options.tokenizer, pool, kv);
  if (!format.ok()) return Status::Error("draft model: " + format.error());
  int64_t n_blocks = options.n_blocks;
  if (n_blocks <= 0) {
    const int64_t per_seq = (static_cast<int64_t>(n_ctx) + kv.block_size - 1) / kv.block_size;
    n_blocks = per_seq * max_seqs + 1;
  }
  if (n_blocks < 2 || n_blocks > (int64_t{1} << 30)) {
    return Status::Error(StrFormat("draft model: %lld KV blocks (need 2 to 2^30)",
                                   static_cast<long long>(n_blocks)));
  }
  const double cost = static_cast<double>(draft.WeightBytesPerToken()) /
                      static_cast<double>(std::max<size_t>(target.WeightBytesPerToken(), 1));
  return std::make_unique<DraftModelDrafter>(draft, pool, std::move(*format),
                                             static_cast<int32_t>(n_blocks), cost,
                                             options.max_batch_tokens);
}

}  // namespace kvs
