// GET /v1/kv/state's question to the engine: every block's state and who holds which.
#include <future>
#include <unordered_set>

#include "api/engine_impl.h"
#include "engine/engine.h"

namespace kvserve {

bool Engine::KvState(KvCacheState* out, std::string* error) const {
  *out = KvCacheState{};
  try {
    // The pool, the prefix index and the scheduler belong to the loop thread: read there.
    impl_->engine
        ->RunOnLoop([&](kvs::Engine& e) {
          const kvs::KvCacheManager& kv = e.kv();
          const kvs::BlockPool& pool = kv.pool();
          out->block_size = kv.block_size();
          out->num_blocks = kv.num_usable_blocks();
          std::vector<bool> cached(pool.num_blocks(), false);
          for (const auto& [hash, id] : kv.CachedBlocks()) cached[id.value] = true;
          out->blocks.resize(out->num_blocks);
          for (int32_t b = 1; b < pool.num_blocks(); ++b) {
            const int32_t refs = pool.ref_count(kvs::BlockId{b});
            char state = refs == 0 ? (cached[b] ? 'c' : 'f') : refs == 1 ? 'u' : 's';
            out->blocks[b - 1] = state;
            if (state == 's') out->shared.emplace_back(b, refs);
          }
          for (const kvs::Sequence* seq : e.scheduler().running()) {
            KvSequenceState s;
            s.request = static_cast<uint64_t>(seq->request);
            s.choice = seq->choice;
            s.prompt_tokens = seq->n_prompt;
            s.output_tokens =
                static_cast<int32_t>(seq->tokens.size()) - seq->n_prompt - seq->n_in_flight;
            s.cached_tokens = std::max(seq->cached_tokens, 0);
            for (kvs::BlockId id : kv.Table(seq->id).blocks) s.blocks.push_back(id.value);
            out->running.push_back(std::move(s));
          }
          out->waiting = static_cast<int32_t>(e.scheduler().waiting().size());
        })
        .get();
  } catch (const std::future_error&) {
    *error = "the server is shutting down";
    return false;
  }
  return true;
}

}  // namespace kvserve
