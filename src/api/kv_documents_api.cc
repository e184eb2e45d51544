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

// Why there are no documents: no --kv-disk, or a --kv-disk the engine turned off at start (a
// read-only or uncreatable directory: EngineBuilder::DiskTier logged why).
std::string NoDocumentsReason(const Engine::Impl& impl) {
  if (impl.options.kv_disk.empty()) {
    return "KV documents are kept on the disk tier: start the engine with --kv-disk DIR";
  }
  return "KV documents are kept on the disk tier, which is off: --kv-disk " + impl.options.kv_disk +
         " could not be written (see the log)";
}

// The refusals before a document is marked or prefilled: no disk tier, a bad name, too few
// tokens for one whole block.
kvs::Status CheckSavable(const Engine::Impl& impl, const std::string& name, size_t n_tokens) {
  if (impl.engine->tier("disk") == nullptr || !impl.documents) {
    return kvs::Status::Error(NoDocumentsReason(impl));
  }
  KVS_RETURN_IF_ERROR(kvs::ValidateDocumentName(name));
  const int32_t block_size = impl.options.block_size;
  if (static_cast<int32_t>(n_tokens) < block_size + 1) {
    return kvs::Status::Error(kvs::StrFormat(
        "a KV document keeps whole blocks of %d tokens before its last token: %zu tokens are "
        "too few",
        block_size, n_tokens));
  }
  return kvs::Status::Ok();
}

// A document's name, taken while it is saved (ListKvDocuments shows it as "saving"). Not taken
// when another save of that name runs; that one's entry is then left alone.
class SavingMark {
 public:
  SavingMark(Engine::Impl* impl, const std::string& name) : impl_(impl), name_(name) {
    std::lock_guard<std::mutex> lock(impl_->saving_mu);
    taken_ = impl_->saving.emplace(name_, std::make_pair(0, 0)).second;
  }
  ~SavingMark() {
    if (!taken_) return;
    std::lock_guard<std::mutex> lock(impl_->saving_mu);
    impl_->saving.erase(name_);
  }
  SavingMark(const SavingMark&) = delete;
  SavingMark& operator=(const SavingMark&) = delete;
  bool taken() const { return taken_; }

 private:
  Engine::Impl* impl_;
  const std::string& name_;
  bool taken_ = false;
};

// Prefill: one greedy token, the output discarded; its blocks are committed as it runs.
kvs::RequestOptions PrefillRequest(const Engine::Impl& impl, const std::string& cache_salt) {
  GenerationOptions gen;
  gen.max_tokens = 1;
  gen.temperature = 0;
  gen.cache_salt = cache_salt;
  gen.ignore_eos = true;
  gen.speculative = false;
  return ToRequestOptions(gen, impl.model->impl().model->weights_digest(), *impl.kv_format,
                          impl.end_of_generation);
}

// The prefill's end: "" when it finished, or why it did not.
kvs::Expected<std::future<std::string>> SubmitPrefill(kvs::AsyncEngine& engine,
                                                      std::vector<int32_t> tokens,
                                                      const kvs::RequestOptions& request) {
  auto finished = std::make_shared<std::promise<std::string>>();
  std::future<std::string> result = finished->get_future();
  auto id = engine.Submit(std::move(tokens), request, [finished](const kvs::TokenEvent& e) {
    if (e.finished)
      finished->set_value(
          e.reason == kvs::FinishReason::kError || e.reason == kvs::FinishReason::kCancelled
              ? "the prefill ended: " +
                    (e.error.empty() ? std::string(kvs::FinishReasonName(e.reason)) : e.error)
              : std::string());
  });
  if (!id.ok()) return id.status();
  return result;
}

// A task's end on the engine's loop thread; an error when the engine shut down before it ran.
kvs::Status WaitForLoop(std::future<void> done) {
  try {
    done.get();
  } catch (const std::future_error&) {
    return kvs::Status::Error("the engine is shutting down");
  }
  return kvs::Status::Ok();
}

// The document's full blocks, read on the loop thread.
kvs::Status DocumentBlocks(Engine::Impl& impl, const std::vector<int32_t>& prompt,
                           const kvs::BlockHash& cache_key, std::vector<kvs::BlockHash>* hashes) {
  const size_t block_size = static_cast<size_t>(impl.options.block_size);
  return WaitForLoop(impl.engine->RunOnLoop([&](kvs::Engine& e) {
    *hashes = e.kv().HashFullBlocks(prompt, cache_key);
    // Whole blocks before the last token: what a later prompt's match can use.
    hashes->resize(std::min(hashes->size(), (prompt.size() - 1) / block_size));
  }));
}

// Why some of a document's blocks did not reach the disk, to end the error message.
std::string ShortWriteReason(const kvs::KvTier& tier, int64_t write_errors_before) {
  const kvs::KvTierStats s = tier.stats();
  // The disk's own reason where a write failed (a read-only or full file system, a file size
  // limit); the size and the queue only where none did.
  return s.write_errors > write_errors_before
             ? ": " + tier.last_write_error() + (s.failed ? " (the disk tier is now off)" : "")
         : s.failed ? " (the disk tier is off: see the log)"
                    : " (--kv-disk-size too small, or the write queue was full)";
}

// The record of a saved document: its blocks, and the weights and KV format they hold.
kvs::KvDocument NewDocument(const Engine::Impl& impl, const std::string& name, size_t n_tokens,
                            const std::vector<kvs::BlockHash>& hashes) {
  kvs::KvDocument doc;
  doc.name = name;
  doc.n_tokens = static_cast<int32_t>(n_tokens);
  doc.blocks = hashes;
  doc.model = impl.model->weights_digest();
  doc.kv_format = impl.kv_format->fingerprint().Hex();
  doc.created = static_cast<int64_t>(std::time(nullptr));
  return doc;
}

}  // namespace

int32_t Engine::ResetPrefixCache() {
  int32_t dropped = 0;
  try {
    // With tiers, what RAM drops is in them first: offers (write-back) on the loop thread, the
    // wait for each tier's writer here (decodes go on meanwhile), then the drop.
    if (!impl_->engine->tiers().empty()) {
      impl_->engine->RunOnLoop([](kvs::Engine& e) { e.connectors().Flush(/*wait=*/false); }).get();
      for (const auto& tier : impl_->engine->tiers()) {
        tier->WaitForWrites(tier->config().flush_timeout_ms);
      }
    }
    impl_->engine
        ->RunOnLoop([&dropped](kvs::Engine& e) { dropped = e.connectors().ResetPrefixCache(); })
        .get();
  } catch (const std::future_error&) {
    return 0;  // shutting down
  }
  return dropped;
}

bool Engine::SaveKvDocument(const std::string& name, std::vector<int32_t> tokens,
                            const std::string& cache_salt, KvDocumentInfo* out, std::string* error,
                            const std::function<void(int32_t, int32_t)>& progress) {
  if (auto st = CheckSavable(*impl_, name, tokens.size()); !st.ok()) {
    *error = st.message();
    return false;
  }
  kvs::KvTier* tier = impl_->engine->tier("disk");
  const int64_t write_errors_before = tier->stats().write_errors;
  const SavingMark mark(impl_.get(), name);
  if (!mark.taken()) {
    *error = "a KV document named " + name + " is being saved";
    return false;
  }
  const kvs::RequestOptions request = PrefillRequest(*impl_, cache_salt);
  const std::vector<int32_t> prompt = tokens;
  auto result = SubmitPrefill(*impl_->engine, std::move(tokens), request);
  if (!result.ok()) {
    *error = result.error();
    return false;
  }
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
  if (auto st = DocumentBlocks(*impl_, prompt, request.cache_key, &hashes); !st.ok()) {
    *error = st.message();
    return false;
  }
  while (result->wait_for(std::chrono::milliseconds(500)) != std::future_status::ready)
    report(false);
  if (std::string why = result->get(); !why.empty()) {
    *error = why;
    return false;
  }
  // The offer of the blocks to the writer (write-back) is the loop thread's.
  auto offered = impl_->engine->RunOnLoop(
      [&](kvs::Engine& e) { e.connectors().tier("disk")->Persist(e.kv(), hashes); });
  if (auto st = WaitForLoop(std::move(offered)); !st.ok()) {
    *error = st.message();
    return false;
  }
  tier->WaitForWrites(tier->config().flush_timeout_ms);
  for (const kvs::BlockHash& h : hashes) tier->store().Pin(h, true);
  const int32_t on_disk = report(true);
  if (on_disk < static_cast<int32_t>(hashes.size())) {
    *error = kvs::StrFormat("only %d of the document's %zu blocks reached the disk%s", on_disk,
                            hashes.size(), ShortWriteReason(*tier, write_errors_before).c_str());
    for (const kvs::BlockHash& h : hashes) tier->store().Pin(h, false);
    return false;
  }
  const kvs::KvDocument doc = NewDocument(*impl_, name, prompt.size(), hashes);
  if (auto st = impl_->documents->Put(doc); !st.ok()) {
    *error = "cannot record the document: " + st.message();
    return false;
  }
  if (out) *out = ToInfo(doc, tier->store(), impl_->model->weights_digest());
  return true;
}

std::vector<KvDocumentInfo> Engine::ListKvDocuments() const {
  std::vector<KvDocumentInfo> out;
  const kvs::KvTier* tier = impl_->engine->tier("disk");
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
    *error = impl_->documents ? "no KV document named " + name : NoDocumentsReason(*impl_);
  }
  return false;
}

bool Engine::RemoveKvDocument(const std::string& name, std::string* error) {
  kvs::KvTier* tier = impl_->engine->tier("disk");
  if (tier == nullptr || !impl_->documents) {
    *error = NoDocumentsReason(*impl_);
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
