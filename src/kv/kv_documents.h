// KV documents (issue #20): a named prompt prefix whose blocks are kept in the disk tier,
// pinned (never evicted by LRU), so that later prompts starting with it load instead of
// recomputing. The registry is a directory of small JSON records, DIR/documents/<name>.json,
// written atomically; the blocks themselves are the store's files. Names are short and plain
// ([A-Za-z0-9._-], not starting with '.'), so that a name is never a path.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

inline constexpr size_t kMaxDocumentNameLength = 128;

struct KvDocument {
  std::string name;
  int32_t n_tokens = 0;
  std::vector<BlockHash> blocks;  // chain hashes of its full blocks, in order
  std::string model;              // the weights' digest, hex
  std::string kv_format;          // the KV format's fingerprint, hex
  int64_t created = 0;            // unix seconds
};

// An error naming what is wrong with the name (empty, too long, a character outside
// [A-Za-z0-9._-], a leading '.').
Status ValidateDocumentName(std::string_view name);

class KvDocuments {
 public:
  // The registry under store_dir (creating store_dir/documents when create; else an error when
  // there is none). Unreadable records, and records whose name is not their file's, are skipped
  // with a warning (they never pin anything).
  static Expected<std::unique_ptr<KvDocuments>> Open(const std::string& store_dir,
                                                     bool create = true);

  Status Put(const KvDocument& doc);
  Expected<KvDocument> Get(std::string_view name) const;
  std::vector<KvDocument> List() const;  // by name
  // Removes the record; the blocks only it pinned are returned (to unpin).
  Expected<std::vector<BlockHash>> Remove(std::string_view name);
  // Every block some document pins.
  std::vector<BlockHash> PinnedBlocks() const;

 private:
  explicit KvDocuments(std::string dir) : dir_(std::move(dir)) {}
  Expected<KvDocument> ReadRecord(const std::string& path) const;
  std::string PathOf(std::string_view name) const;

  const std::string dir_;  // .../documents
  mutable std::mutex mu_;
};

}  // namespace kvs
