#include "kv/kv_documents.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/log.h"
#include "kv/block_file.h"
#include "kv/block_store.h"

namespace kvs {
namespace {
constexpr std::string_view kRecordSuffix = ".json";
constexpr uint64_t kMaxRecordBytes = uint64_t{64} << 20;
}  // namespace

Status ValidateDocumentName(std::string_view name) {
  if (name.empty()) return Status::Error("a document needs a name");
  if (name.size() > kMaxDocumentNameLength) {
    return Status::Error(StrFormat("document name of %zu characters: at most %zu", name.size(),
                                   kMaxDocumentNameLength));
  }
  if (name[0] == '.') return Status::Error("a document name may not start with '.'");
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Status::Error(
          "document names use letters, digits, '.', '_' and '-' only (no '/', spaces or "
          "control characters)");
    }
  }
  return Status::Ok();
}

Expected<std::unique_ptr<KvDocuments>> KvDocuments::Open(const std::string& store_dir,
                                                         bool create) {
  const std::string dir = store_dir + "/documents";
  struct stat st;
  if (!create) {
    if (::stat(store_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return Status::Error(StrFormat("--kv-disk %s: not a directory", store_dir.c_str()));
    }
    if (::stat(dir.c_str(), &st) != 0) return std::unique_ptr<KvDocuments>(new KvDocuments(dir));
  }
  if (create && ::mkdir(store_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::Error(StrFormat("--kv-disk %s: %s", store_dir.c_str(), std::strerror(errno)));
  }
  if (create && ::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::Error(StrFormat("%s: %s", dir.c_str(), std::strerror(errno)));
  }
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::Error(
        StrFormat("%s: not a directory (KV documents are kept there)", dir.c_str()));
  }
  return std::unique_ptr<KvDocuments>(new KvDocuments(dir));
}

std::string KvDocuments::PathOf(std::string_view name) const {
  return dir_ + "/" + std::string(name) + std::string(kRecordSuffix);
}

Status KvDocuments::Put(const KvDocument& doc) {
  KVS_RETURN_IF_ERROR(ValidateDocumentName(doc.name));
  nlohmann::json blocks = nlohmann::json::array();
  for (const BlockHash& h : doc.blocks) blocks.push_back(BlockHashHex(h));
  const nlohmann::json j = {{"name", doc.name},           {"tokens", doc.n_tokens},
                            {"blocks", blocks},           {"model", doc.model},
                            {"kv_format", doc.kv_format}, {"created", doc.created}};
  const std::string text = j.dump(1) + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  return WriteFileAtomically(
      dir_, doc.name + std::string(kRecordSuffix),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

Expected<KvDocument> KvDocuments::ReadRecord(const std::string& path) const {
  auto bytes = ReadBlockFileBytes(path, kMaxRecordBytes);
  if (!bytes.ok()) return bytes.status();
  const nlohmann::json j = nlohmann::json::parse(bytes->begin(), bytes->end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Error(path + ": not a JSON object");
  KvDocument doc;
  try {
    doc.name = j.at("name").get<std::string>();
    doc.n_tokens = j.at("tokens").get<int32_t>();
    doc.model = j.value("model", "");
    doc.kv_format = j.value("kv_format", "");
    doc.created = j.value("created", int64_t{0});
    if (doc.n_tokens < 0) return Status::Error(path + ": a negative token count");
    for (const auto& b : j.at("blocks")) {
      BlockHash h;
      if (!ParseBlockHashHex(b.get<std::string>(), &h)) {
        return Status::Error(path + ": a block hash is not 32 hex digits");
      }
      doc.blocks.push_back(h);
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Error(path + ": " + e.what());
  }
  return doc;
}

Expected<KvDocument> KvDocuments::Get(std::string_view name) const {
  KVS_RETURN_IF_ERROR(ValidateDocumentName(name));
  std::lock_guard<std::mutex> lock(mu_);
  struct stat st;
  if (::stat(PathOf(name).c_str(), &st) != 0) {
    return Status::Error("no KV document named " + std::string(name));
  }
  auto doc = ReadRecord(PathOf(name));
  if (doc.ok() && doc->name != name) {
    return Status::Error("no KV document named " + std::string(name));
  }
  return doc;
}

std::vector<KvDocument> KvDocuments::List() const {
  std::vector<KvDocument> out;
  std::lock_guard<std::mutex> lock(mu_);
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view file = e->d_name;
    if (!file.ends_with(kRecordSuffix)) continue;
    const std::string_view name = file.substr(0, file.size() - kRecordSuffix.size());
    if (!ValidateDocumentName(name).ok()) continue;
    auto doc = ReadRecord(dir_ + "/" + std::string(file));
    if (!doc.ok()) {
      KVS_LOG_WARN("kv documents: skipping %s", doc.error().c_str());
      continue;
    }
    if (doc->name != name) {
      KVS_LOG_WARN("kv documents: skipping %s/%s: it names another document (%s)", dir_.c_str(),
                   std::string(file).c_str(), doc->name.c_str());
      continue;
    }
    out.push_back(std::move(*doc));
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(),
            [](const KvDocument& a, const KvDocument& b) { return a.name < b.name; });
  return out;
}

Expected<std::vector<BlockHash>> KvDocuments::Remove(std::string_view name) {
  auto doc = Get(name);
  if (!doc.ok()) return doc.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (::unlink(PathOf(name).c_str()) != 0) {
      return Status::Error(StrFormat("cannot remove document %s: %s", std::string(name).c_str(),
                                     std::strerror(errno)));
    }
  }
  std::unordered_set<BlockHash, BlockHashHasher> still;
  for (const BlockHash& h : PinnedBlocks()) still.insert(h);
  std::vector<BlockHash> unpin;
  for (const BlockHash& h : doc->blocks) {
    if (!still.contains(h)) unpin.push_back(h);
  }
  return unpin;
}

std::vector<BlockHash> KvDocuments::PinnedBlocks() const {
  std::vector<BlockHash> out;
  for (const KvDocument& doc : List()) out.insert(out.end(), doc.blocks.begin(), doc.blocks.end());
  return out;
}

}  // namespace kvs
