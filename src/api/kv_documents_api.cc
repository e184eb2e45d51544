// KV documents over the disk tier: a prompt prefilled once, its blocks written and pinned.
#include <chrono>
#include <ctime>
#include <future>

#include "api/engine_impl.h"
#include "core/log.h"
#include "engine/engine.h"

namespace kvserve {
namespace {

// status: "ready", or "other_model" for a document of other weights (never hit by this model).
KvDocumentInfo ToInfo(const kvs::KvDocument& doc, const kvs::DiskBlockStore& store,
                      const std::string& weights_digest) {
  KvDocumentInfo info;
  info.name = doc.name;
  info.status = doc.model == weights_digest ? "ready" : "other_model";
  info.tokens = doc.n_tokens;
  info.blocks = static_cast<int32_t>(doc.blocks.size());
  for (const kvs::BlockHash& h : doc.blocks) info.blocks_on_disk += store.Contains(h) ? 1 : 0;
  info.created = doc.created;
  info.model = doc.model;
  return info;
}

}  // namespace

int32_t Engine::ResetPrefixCache() {
  int32_t dropped = 0;
  try {
    // With a disk tier, what RAM drops is on disk first: offers (write-back) on the loop thread,
    // the wait for the writer here (decodes go on meanwhile), then the drop.
    if (kvs::KvTier* tier = impl_->engine->tier()) {
      impl_->engine->RunOnLoop([](kvs::Engine& e) { e.FlushTier(/*wait=*/false); }).get();
      tier->WaitForWrites(tier->config().flush_timeout_ms);
    }
    impl_->engine->RunOnLoop([&dropped](kvs::Engine& e) { dropped = e.ResetPrefixCache(); }).get();
  } catch (const std::future_error&) {
    return 0;  // shutting down
  }
  return dropped;
}

bool Engine::SaveKvDocument(const std::string& name, std::vector<int32_t> tokens,
                            const std::string& cache_salt, KvDocumentInfo* out, std::string* error,
                            const std::function<void(int32_t, int32_t)>& progress) {
  kvs::KvTier* tier = impl_->engine->tier();
  if (tier == nullptr || !impl_->documents) {
    *error = "KV documents are kept on the disk tier: start the engine with --kv-disk DIR";
    return false;
  }
  if (auto st = kvs::ValidateDocumentName(name); !st.ok()) {
    *error = st.message();
    return false;
  }
  const int32_t block_size = impl_->options.block_size;
  if (static_cast<int32_t>(tokens.size()) < block_size + 1) {
    *error = kvs::StrFormat(
        "a KV document keeps whole blocks of %d tokens before its last token: %zu tokens are "
        "too few",
        block_size, tokens.size());
    return false;
  }
  const int64_t write_errors_before = tier->stats().write_errors;
  {
    std::lock_guard<std::mutex> lock(impl_->saving_mu);
    if (!impl_->saving.emplace(name, std::make_pair(0, 0)).second) {
      *error = "a KV document named " + name + " is being saved";
      return false;
    }
  }
  struct Unmark {
    Impl* impl;
    const std::string& name;
    ~Unmark() {
      std::lock_guard<std::mutex> lock(impl->saving_mu);
      impl->saving.erase(name);
    }
  } unmark{impl_.get(), name};

  // Prefill: one greedy token, the output discarded; its blocks are committed as it runs.
  GenerationOptions gen;
  gen.max_tokens = 1;
  gen.temperature = 0;
  gen.cache_salt = cache_salt;
  gen.ignore_eos = true;
  gen.speculative = false;
  kvs::RequestOptions request = ToRequestOptions(gen, impl_->model->impl().model->weights_digest(),
                                                 *impl_->kv_format, impl_->end_of_generation);
  const kvs::BlockHash cache_key = request.cache_key;
  auto finished = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = finished->get_future();
  const std::vector<int32_t> prompt = tokens;
  auto id = impl_->engine->Submit(std::move(tokens), request, [finished](const kvs::TokenEvent& e) {
    if (e.finished)
      finished->set_value(
          e.reason == kvs::FinishReason::kError || e.reason == kvs::FinishReason::kCancelled
              ? "the prefill ended: " +
                    (e.error.empty() ? std::string(kvs::FinishReasonName(e.reason)) : e.error)
              : std::string());
  });
  if (!id.ok()) {
    *error = id.error();
    return false;
  }
  // The document's full blocks, and (write-back) their offer to the writer, on the loop thread.
  std::vector<kvs::BlockHash> hashes;
  auto report = [&](bool final) {
    int32_t on_disk = 0;
    for (const kvs::BlockHash& h : hashes) on_disk += tier->store().Contains(h) ? 1 : 0;
    {
      std::lock_guard<std::mutex> lock(impl_->saving_mu);
      impl_->saving[name] = {on_disk, static_cast<int32_t>(hashes.size())};
    }
    if (progress && (final || !hashes.empty()))
      progress(on_disk, static_cast<int32_t>(hashes.size()));
    return on_disk;
  };
  {
    auto done = impl_->engine->RunOnLoop([&](kvs::Engine& e) {
      hashes = e.PromptBlockHashes(prompt, cache_key);
      // Whole blocks before the last token: what a later prompt's match can use.
      hashes.resize(std::min(hashes.size(), (prompt.size() - 1) / static_cast<size_t>(block_size)));
    });
    try {
      done.get();
    } catch (const std::future_error&) {
      *error = "the engine is shutting down";
      return false;
    }
  }
  while (result.wait_for(std::chrono::milliseconds(500)) != std::future_status::ready)
    report(false);
  if (std::string why = result.get(); !why.empty()) {
    *error = why;
    return false;
  }
  auto offered =
      impl_->engine->RunOnLoop([&](kvs::Engine& e) { e.tier()->Persist(e.kv(), hashes); });
  try {
    offered.get();
  } catch (const std::future_error&) {
    *error = "the engine is shutting down";
    return false;
  }
  tier->WaitForWrites(tier->config().flush_timeout_ms);
  for (const kvs::BlockHash& h : hashes) tier->store().Pin(h, true);
  const int32_t on_disk = report(true);
  if (on_disk < static_cast<int32_t>(hashes.size())) {
    const kvs::KvTierStats s = tier->stats();
    // The disk's own reason where a write failed (a read-only or full file system, a file size
    // limit); the size and the queue only where none did.
    std::string why =
        s.write_errors > write_errors_before
            ? ": " + tier->last_write_error() + (s.failed ? " (the disk tier is now off)" : "")
        : s.failed ? " (the disk tier is off: see the log)"
                   : " (--kv-disk-size too small, or the write queue was full)";
    *error = kvs::StrFormat("only %d of the document's %zu blocks reached the disk%s", on_disk,
                            hashes.size(), why.c_str());
    for (const kvs::BlockHash& h : hashes) tier->store().Pin(h, false);
    return false;
  }
  kvs::KvDocument doc;
  doc.name = name;
  doc.n_tokens = static_cast<int32_t>(prompt.size());
  doc.blocks = hashes;
  doc.model = impl_->model->weights_digest();
  doc.kv_format = impl_->kv_format->fingerprint().Hex();
  doc.created = static_cast<int64_t>(std::time(nullptr));
  if (auto st = impl_->documents->Put(doc); !st.ok()) {
    *error = "cannot record the document: " + st.message();
    return false;
  }
  if (out) *out = ToInfo(doc, tier->store(), impl_->model->weights_digest());
  return true;
}

std::vector<KvDocumentInfo> Engine::ListKvDocuments() const {
  std::vector<KvDocumentInfo> out;
  const kvs::KvTier* tier = impl_->engine->tier();
  if (tier == nullptr || !impl_->documents) return out;
  for (const kvs::KvDocument& doc : impl_->documents->List()) {
    out.push_back(ToInfo(doc, tier->store(), impl_->model->weights_digest()));
  }
  std::lock_guard<std::mutex> lock(impl_->saving_mu);
  for (const auto& [name, p] : impl_->saving) {
    KvDocumentInfo info;
    info.name = name;
    info.status = "saving";
    info.blocks_on_disk = p.first;
    info.blocks = p.second;
    out.push_back(info);
  }
  return out;
}

bool Engine::GetKvDocument(const std::string& name, KvDocumentInfo* out, std::string* error) const {
  for (KvDocumentInfo& info : ListKvDocuments()) {
    if (info.name == name) {
      *out = std::move(info);
      return true;
    }
  }
  if (auto st = kvs::ValidateDocumentName(name); !st.ok()) {
    *error = st.message();
  } else {
    *error = impl_->documents ? "no KV document named " + name
                              : "KV documents are kept on the disk tier: start with --kv-disk DIR";
  }
  return false;
}

bool Engine::RemoveKvDocument(const std::string& name, std::string* error) {
  kvs::KvTier* tier = impl_->engine->tier();
  if (tier == nullptr || !impl_->documents) {
    *error = "KV documents are kept on the disk tier: start the engine with --kv-disk DIR";
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(impl_->saving_mu);
    if (impl_->saving.contains(name)) {
      *error = "the KV document " + name + " is being saved: delete it once it is ready";
      return false;
    }
  }
  auto unpin = impl_->documents->Remove(name);
  if (!unpin.ok()) {
    *error = unpin.error();
    return false;
  }
  for (const kvs::BlockHash& h : *unpin) tier->store().Pin(h, false);
  return true;
}

}  // namespace kvserve
