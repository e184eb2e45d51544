// GET /v1/kv/lookup's question to the engine: how much of a prompt this replica holds.
#include <future>

#include "api/engine_impl.h"
#include "engine/engine.h"
#include "engine/kv_format_factory.h"
#include "kv/block_store.h"

namespace kvserve {

bool Engine::LookupKvPrefix(const std::vector<int32_t>& tokens, const std::string& cache_salt,
                            KvPrefixLookup* out, std::string* error) const {
  *out = KvPrefixLookup{};
  out->prompt_tokens = static_cast<int32_t>(tokens.size());
  const kvs::BlockHash key = kvs::ModelCacheKey(impl_->model->impl().model->weights_digest(),
                                                *impl_->kv_format, cache_salt);
  std::vector<kvs::BlockHash> hashes;
  int32_t in_ram = 0, on_disk = 0;
  try {
    // The prefix index belongs to the loop thread: read it there, between steps.
    impl_->engine
        ->RunOnLoop([&](kvs::Engine& e) {
          out->block_size = e.kv().block_size();
          hashes = e.kv().HashFullBlocks(tokens, key);
          while (in_ram < static_cast<int32_t>(hashes.size()) &&
                 e.kv().CachedBlock(hashes[in_ram])) {
            ++in_ram;
          }
          if (const kvs::KvTier* tier = e.connectors().tier("disk")) {
            while (in_ram + on_disk < static_cast<int32_t>(hashes.size()) &&
                   tier->store().Contains(hashes[in_ram + on_disk])) {
              ++on_disk;
            }
          }
        })
        .get();
  } catch (const std::future_error&) {
    *error = "the server is shutting down";
    return false;
  }
  out->ram_tokens = in_ram * out->block_size;
  out->disk_tokens = on_disk * out->block_size;
  for (const kvs::BlockHash& h : hashes) out->block_hashes.push_back(kvs::BlockHashHex(h));
  return true;
}

}  // namespace kvserve
