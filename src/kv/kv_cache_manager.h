// Per-sequence block tables over one BlockPool: which physical blocks hold a sequence's
// positions, how many more blocks a step needs, forks that share blocks, and copy-on-write of a
// shared partial block. Bookkeeping only: the KV bytes live in KvStorage and are copied by the
// model runner from the BlockCopy list that Append returns.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "kv/block_pool.h"

namespace kvs {

using SeqId = int64_t;

// 128-bit block hash (XXH3-128) of the prefix cache's chain.
struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash&) const = default;
};
struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull));
  }
};
// The extra key every block hash of a request covers: model, KV types, the request's salt.
BlockHash PrefixCacheKey(std::string_view model_fingerprint, std::string_view kv_types,
                         std::string_view cache_salt);

struct BlockTable {
  std::vector<int32_t> blocks;    // logical block i -> physical block id
  int32_t num_tokens = 0;         // positions with a slot (KV written, or written this step)
  std::vector<BlockHash> hashes;  // chain hashes of its first full, computed blocks
};

// The longest cached prefix of a token sequence: whole blocks, never the last token (whose
// logits are needed).
struct PrefixMatch {
  std::vector<int32_t> blocks;
  std::vector<BlockHash> hashes;
  int32_t n_tokens = 0;
  int32_t n_free = 0;  // of those blocks, how many sit in the free list (taking them uses it)
};

// The runner copies block src to block dst (all layers) before the step's forward pass.
struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
  bool operator==(const BlockCopy&) const = default;
};

class KvCacheManager {
 public:
  // n_blocks counts the null block (see BlockPool). watermark_blocks: admission keeps this many
  // blocks free so that running sequences can still grow by a block without preempting.
  KvCacheManager(int32_t n_blocks, int32_t block_size, int32_t watermark_blocks = 0);

  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int32_t num_usable_blocks() const { return pool_.num_blocks() - 1; }
  int32_t watermark_blocks() const { return watermark_; }
  const BlockPool& pool() const { return pool_; }
  int32_t BlocksFor(int32_t n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }

  bool Contains(SeqId seq) const { return tables_.contains(seq); }
  // The sequence's table; an absent sequence reads as an empty one.
  const BlockTable& Table(SeqId seq) const;
  int32_t num_sequences() const { return static_cast<int32_t>(tables_.size()); }

  // Blocks Append(seq, n_new) would take from the pool: new blocks past the table's end, plus
  // one when the last block is partial and shared (its copy). 0 for n_new == 0.
  int32_t BlocksToAppend(SeqId seq, int32_t n_new) const;
  // Blocks that Free(seq) would certainly return to the pool (those only this sequence holds).
  int32_t BlocksFreedBy(SeqId seq) const;
  // Whether a new sequence needing n_blocks may be admitted (keeps the watermark free).
  bool CanAdmit(int32_t n_blocks) const { return num_free_blocks() - n_blocks >= watermark_; }

  // Gives positions [num_tokens, num_tokens + n_new) slots, creating the sequence if absent.
  // All or nothing: returns false and changes nothing when the pool is short. A shared partial
  // last block is first replaced by a private copy, reported in *copies.
  bool Append(SeqId seq, int32_t n_new, std::vector<BlockCopy>* copies);

  // Allocates blocks so that the sequence can hold n_positions without further allocation
  // (what a contiguous cache that reserves the whole context does). All or nothing.
  bool Reserve(SeqId seq, int32_t n_positions);

  // The KV slot of position pos: table[pos / block_size] * block_size + pos % block_size.
  int64_t Slot(SeqId seq, int32_t pos) const;

  // child gets parent's table; every block gains a reference (shared until written).
  Status Fork(SeqId parent, SeqId child);

  // Drops the sequence; blocks are released last-first, so a sequence's tail is reused before
  // its head (which is the part another request is most likely to share, issue #6).
  void Free(SeqId seq);

  // --- Prefix cache (full blocks, hash chain; freed blocks keep their hash until reused).
  void set_prefix_caching(bool on) { prefix_caching_ = on; }
  bool prefix_caching() const { return prefix_caching_; }
  PrefixMatch Match(const int32_t* tokens, int32_t n, const BlockHash& key) const;
  // Starts a new sequence on a match: its blocks gain a reference, positions are its tokens.
  void AdoptPrefix(SeqId seq, const PrefixMatch& match);
  // Registers the sequence's newly full blocks of computed positions [0, n_computed).
  void CommitFullBlocks(SeqId seq, const int32_t* tokens, int32_t n_computed, const BlockHash& key);
  int32_t num_cached_blocks() const { return static_cast<int32_t>(cached_.size()); }

  // The pool's invariants, every block's refcount equals the number of tables holding it, and
  // the prefix index and the blocks' hashes agree.
  Status VerifyIntegrity() const;

 private:
  bool LastBlockNeedsCopy(const BlockTable& t) const;
  // Takes n blocks, dropping the cached hashes of those that were cached (LRU eviction).
  bool AllocateBlocks(int32_t n, std::vector<int32_t>* out);
  BlockHash ChainHash(const BlockHash& parent, const BlockHash& key, const int32_t* tokens) const;

  BlockPool pool_;
  int32_t block_size_;
  int32_t watermark_;
  std::unordered_map<SeqId, BlockTable> tables_;
  bool prefix_caching_ = false;
  std::vector<BlockHash> block_hash_;  // per block: its hash while it is in cached_
  std::vector<bool> block_cached_;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> cached_;
};

}  // namespace kvs
