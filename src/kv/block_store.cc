#include "kv/block_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "kv/block_file.h"

namespace kvs {
namespace {
constexpr char kBlockSuffix[] = ".kvb";
constexpr size_t kHexDigits = 32;
}  // namespace

std::string BlockHashHex(const BlockHash& hash) {
  char buf[kHexDigits + 1];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hash.hi),
                static_cast<unsigned long long>(hash.lo));
  return buf;
}

bool ParseBlockHashHex(std::string_view hex, BlockHash* hash) {
  if (hex.size() != kHexDigits) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < kHexDigits; ++i) {
    const char c = hex[i];
    int v = -1;
    if (c >= '0' && c <= '9') v = c - '0';
    if (c >= 'a' && c <= 'f') v = c - 'a' + 10;
    if (v < 0) return false;
    parts[i / 16] = parts[i / 16] << 4 | static_cast<uint64_t>(v);
  }
  *hash = BlockHash{parts[1], parts[0]};
  return true;
}

namespace {
// Temporary files are ".<name>.tmp.<pid>.<n>" (WriteFileAtomically): whether that pid runs.
bool TempFileWriterAlive(std::string_view name) {
  const size_t at = name.find(".tmp.");
  const std::string_view rest = name.substr(at + 5);
  const size_t dot = rest.find('.');
  int64_t pid = 0;
  for (char c : rest.substr(0, dot)) {
    if (c < '0' || c > '9' || pid > (int64_t{1} << 31)) return false;
    pid = pid * 10 + (c - '0');
  }
  if (pid <= 0 || pid == ::getpid()) return false;  // ours are never left from this run
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}
}  // namespace

Expected<std::unique_ptr<DiskBlockStore>> DiskBlockStore::Open(
    const std::string& dir, uint64_t capacity_bytes, const std::function<void(int64_t)>& progress) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::Error(StrFormat("--kv-disk %s: %s", dir.c_str(), std::strerror(errno)));
  }
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    return Status::Error(StrFormat("--kv-disk %s: %s", dir.c_str(), std::strerror(errno)));
  }
  std::unique_ptr<DiskBlockStore> store(new DiskBlockStore(dir, capacity_bytes));
  int64_t seen = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (progress && ++seen % 4096 == 0) progress(seen);
    // What a crash left mid-write: never complete, never renamed; remove it, unless the process
    // that writes it is alive (another server or `kv save` sharing the directory).
    if (name.size() > 1 && name[0] == '.' && name.find(".tmp.") != std::string_view::npos) {
      if (!TempFileWriterAlive(name)) ::unlinkat(::dirfd(d), e->d_name, 0);
      continue;
    }
    BlockHash hash;
    if (name.size() != kHexDigits + sizeof(kBlockSuffix) - 1 || !name.ends_with(kBlockSuffix) ||
        !ParseBlockHashHex(name.substr(0, kHexDigits), &hash)) {
      continue;  // not ours: left alone
    }
    struct stat st;
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
      // A directory or link under a block's name is never read: counted as corrupt, and removed
      // when that is safe (an empty directory, a link; never a directory's contents).
      ++store->rejected_at_open_;
      const int removed = S_ISDIR(st.st_mode) ? ::unlinkat(::dirfd(d), e->d_name, AT_REMOVEDIR)
                                              : ::unlinkat(::dirfd(d), e->d_name, 0);
      if (removed != 0) store->unusable_.insert(hash);  // a directory with contents: left alone
      continue;
    }
    std::lock_guard<std::mutex> lock(store->mu_);
    Entry& entry = store->index_[hash];
    entry.bytes = static_cast<uint64_t>(st.st_size);
    entry.lru = store->lru_.insert(store->lru_.end(), hash);
    store->usage_ += entry.bytes;
  }
  ::closedir(d);
  {
    std::lock_guard<std::mutex> lock(store->mu_);
    store->MakeRoomLocked(0);  // a smaller capacity than the last run's
  }
  return store;
}

std::string DiskBlockStore::PathOf(const BlockHash& hash) const {
  return dir_ + "/" + BlockHashHex(hash) + kBlockSuffix;
}

void DiskBlockStore::Touch(Entry& e, const BlockHash& hash) {
  lru_.erase(e.lru);
  e.lru = lru_.insert(lru_.end(), hash);
}

bool DiskBlockStore::Contains(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(hash);
}

uint64_t DiskBlockStore::capacity_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

void DiskBlockStore::set_capacity(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = bytes;
  MakeRoomLocked(0);
}

Status DiskBlockStore::Put(const BlockHash& hash, std::span<const uint8_t> file) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (file.size() > capacity_) {
      return Status::Error(StrFormat("a block of %zu bytes is larger than the store (%llu bytes)",
                                     file.size(), static_cast<unsigned long long>(capacity_)));
    }
    if (auto it = index_.find(hash); it != index_.end()) EraseLocked(hash);
    MakeRoomLocked(file.size());
  }
  // The write happens outside the lock: lookups go on while a block reaches the disk.
  KVS_RETURN_IF_ERROR(WriteFileAtomically(dir_, BlockHashHex(hash) + kBlockSuffix, file));
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = index_.try_emplace(hash);
  if (!inserted) {  // another Put of the same block finished first
    usage_ -= it->second.bytes;
    lru_.erase(it->second.lru);
  }
  it->second.lru = lru_.insert(lru_.end(), hash);
  it->second.bytes = file.size();
  usage_ += it->second.bytes;
  return Status::Ok();
}

std::vector<StoredBlock> BlockStore::GetMany(std::span<const BlockHash> hashes) {
  std::vector<StoredBlock> out(hashes.size());
  for (size_t i = 0; i < hashes.size(); ++i) {
    auto bytes = Get(hashes[i]);
    if (bytes.ok()) {
      out[i].state = StoredBlock::State::kFound;
      out[i].bytes = std::move(*bytes);
    } else if (!Contains(hashes[i]) || bytes.error().find("No such file") != std::string::npos) {
      // Gone since the lookup (evicted by LRU, removed by hand, the directory vanished).
      out[i].state = StoredBlock::State::kAbsent;
    } else {
      // Anything else unreadable under the block's name (a directory, a FIFO, a link).
      out[i].state = StoredBlock::State::kUnreadable;
      out[i].error = bytes.error();
    }
  }
  return out;
}

Expected<std::vector<uint8_t>> DiskBlockStore::Get(const BlockHash& hash) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(hash);
    if (it == index_.end()) return Status::Error("not in the disk store");
    Touch(it->second, hash);
  }
  return ReadBlockFileBytes(PathOf(hash));
}

void DiskBlockStore::Erase(const BlockHash& hash) {
  std::lock_guard<std::mutex> lock(mu_);
  EraseLocked(hash);
}

void DiskBlockStore::EraseLocked(const BlockHash& hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  usage_ -= it->second.bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
  const std::string path = PathOf(hash);
  // A directory under a block's name (found on a read) goes too, when it is empty; one with
  // contents is left alone, and the name is never written nor read again in this run.
  if (::unlink(path.c_str()) != 0 && (errno == EISDIR || errno == EPERM) &&
      ::rmdir(path.c_str()) != 0 && errno != ENOENT) {
    unusable_.insert(hash);
  }
}

bool DiskBlockStore::Unusable(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return unusable_.contains(hash);
}

void DiskBlockStore::MakeRoomLocked(uint64_t incoming) {
  auto it = lru_.begin();
  while (usage_ + incoming > capacity_ && it != lru_.end()) {
    const BlockHash hash = *it++;
    if (!index_.at(hash).pinned) EraseLocked(hash);
  }
}

void DiskBlockStore::Pin(const BlockHash& hash, bool pinned) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = index_.find(hash); it != index_.end()) it->second.pinned = pinned;
}

uint64_t DiskBlockStore::usage_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return usage_;
}

int64_t DiskBlockStore::num_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(index_.size());
}

BlockStoreCounters DiskBlockStore::counters() const {
  BlockStoreCounters c;
  c.usage_bytes = static_cast<int64_t>(usage_bytes());
  c.capacity_bytes = static_cast<int64_t>(capacity_bytes());
  c.blocks = num_blocks();
  c.corrupt_at_open = rejected_at_open_;
  return c;
}

}  // namespace kvs
