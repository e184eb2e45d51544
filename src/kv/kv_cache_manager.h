// Per-sequence block tables over one BlockPool: which physical blocks hold a sequence's
// positions, how many more blocks a step needs, forks that share blocks, and copy-on-write of a
// shared partial block. Bookkeeping only: the KV bytes live in KvStorage and are copied by the
// model runner from the BlockCopy list that Append returns.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "kv/block_pool.h"
#include "kv/kv_group.h"

namespace kvs {

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
  std::vector<BlockId> blocks;    // logical block i -> physical block id
  int32_t num_tokens = 0;         // positions with a slot (KV written, or written this step)
  std::vector<BlockHash> hashes;  // chain hashes of its first full, computed blocks
  // Token eviction moved kept slots over evicted ones (Compact): past `hashes`, the blocks hold
  // other tokens than the sequence's, so they never enter the prefix index.
  bool compacted = false;
};

// The longest cached prefix of a token sequence: whole blocks, never the last token (whose
// logits are needed).
// With several KV groups (kv_group.h), `blocks` is the first group's and group_blocks[g - 1]
// group g's, where a sliding-window group has the null block for the blocks its window skips.
struct PrefixMatch {
  std::vector<BlockId> blocks;
  std::vector<BlockHash> hashes;
  int32_t n_tokens = 0;
  int32_t n_free = 0;  // of those blocks (every group's), how many sit in the free list
  std::vector<std::vector<BlockId>> group_blocks;
};

// The runner copies block src to block dst (all layers) before the step's forward pass.
struct BlockCopy {
  BlockId src;
  BlockId dst;
  bool operator==(const BlockCopy&) const = default;
};

class KvCacheManager {
 public:
  // n_blocks counts the null block (see BlockPool). watermark_blocks: admission keeps this many
  // blocks free so that running sequences can still grow by a block without preempting.
  // groups: the KV cache groups (kv_group.h), one table each per sequence; the first is the one
  // the lower tiers and token eviction work on. Today's models have one full-attention group.
  KvCacheManager(int32_t n_blocks, int32_t block_size, int32_t watermark_blocks = 0,
                 std::vector<KvGroupSpec> groups = {KvGroupSpec{}});

  int32_t block_size() const { return block_size_; }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int32_t num_usable_blocks() const { return pool_.num_blocks() - 1; }
  int32_t watermark_blocks() const { return watermark_; }
  const BlockPool& pool() const { return pool_; }
  int32_t BlocksFor(int32_t n_tokens) const { return (n_tokens + block_size_ - 1) / block_size_; }

  int32_t num_groups() const { return static_cast<int32_t>(groups_.size()); }
  const KvGroupSpec& group(int32_t g) const { return groups_[g].spec; }
  bool any_sliding() const { return AnySliding(specs_); }
  bool Contains(SeqId seq) const { return groups_[0].tables.contains(seq); }
  // The sequence's table in group g; an absent sequence reads as an empty one.
  const BlockTable& Table(SeqId seq, int32_t g = 0) const;
  int32_t num_sequences() const { return static_cast<int32_t>(groups_[0].tables.size()); }

  // Blocks Append(seq, n_new) would take from the pool, over every group: new blocks past the
  // table's end, plus one when the last block is partial and shared (its copy). 0 for n_new == 0.
  int32_t BlocksToAppend(SeqId seq, int32_t n_new) const;
  // Blocks that Free(seq) would certainly return to the pool (those only this sequence holds).
  int32_t BlocksFreedBy(SeqId seq) const;
  // The blocks admitting a sequence onto `prefix` (a Match) with n_new tokens to compute takes
  // from the free list, over every group: the new blocks, and the prefix's blocks that sit free.
  int32_t BlocksToAdopt(const PrefixMatch& prefix, int32_t n_new) const;
  // The most blocks one sequence of `positions` positions holds at once, fed in chunks of at
  // most max_chunk tokens: every group's (a sliding window's: its window and a chunk at most).
  int64_t PeakBlocks(int64_t positions, int32_t max_chunk) const;
  // Whether a new sequence needing n_blocks may be admitted (keeps the watermark free).
  bool CanAdmit(int32_t n_blocks) const { return num_free_blocks() - n_blocks >= watermark_; }

  // Gives positions [num_tokens, num_tokens + n_new) slots, creating the sequence if absent.
  // All or nothing: returns false and changes nothing when the pool is short. A shared partial
  // last block is first replaced by a private copy, reported in *copies. In a sliding-window
  // group the blocks wholly before the window of the first new position are then released.
  bool Append(SeqId seq, int32_t n_new, std::vector<BlockCopy>* copies);

  // Allocates blocks so that the sequence can hold n_positions without further allocation
  // (what a contiguous cache that reserves the whole context does). All or nothing.
  bool Reserve(SeqId seq, int32_t n_positions);
  // The blocks Reserve(seq, n_positions) would take, in every group.
  int32_t BlocksToReserve(SeqId seq, int32_t n_positions) const;

  // The KV slot of position pos: table[pos / block_size] * block_size + pos % block_size.
  int64_t Slot(SeqId seq, int32_t pos, int32_t g = 0) const;

  // child gets parent's table; every block gains a reference (shared until written).
  Status Fork(SeqId parent, SeqId child);

  // Drops the sequence; blocks are released last-first, so a sequence's tail is reused before
  // its head (which is the part another request is most likely to share, issue #6).
  void Free(SeqId seq);

  // Rolls the sequence back to its first n_tokens positions (a speculation's rejected drafts).
  // Every block past the new end loses this sequence's reference, released last-first to the
  // free-list tail as Free does; the table keeps hashes only for blocks still full. The rule
  // for the prefix index: an indexed block is full in every table holding it, so no holder
  // ever writes into it. A kept block that becomes partial is therefore dropped from the index
  // (whether or not others share it: once they let go, this sequence's next Append writes it
  // in place). Freed blocks keep their hash, as Free leaves them. A shared partial block is
  // still copied before the next write (Append). Errors, changing nothing: n_tokens < 0, or
  // more than the sequence holds. An absent sequence reads as empty (Truncate to 0: no-op).
  Status Truncate(SeqId seq, int32_t n_tokens);

  // After token eviction moved a sequence's kept slots forward (kv/compaction.h), so that slots
  // from first_rewritten on hold other tokens than before, the sequence keeps its first n_slots
  // slots: the blocks from first_rewritten's on leave the prefix index (their bytes changed),
  // the table keeps hashes only of the blocks before it and is marked compacted (it never
  // commits again), and whole blocks past n_slots return to the pool at once, last first.
  // Rewritten blocks must be this sequence's alone (refcount 1): shared blocks are never
  // rewritten (the caller freezes them). Errors, changing nothing: bad counts, a shared
  // rewritten block, an absent sequence.
  Status Compact(SeqId seq, int32_t first_rewritten, int32_t n_slots);
  // Leading slots of the sequence in blocks shared with another sequence (refcount > 1): what
  // eviction must keep in place.
  int32_t SharedPrefixSlots(SeqId seq) const;

  // --- Prefix cache (full blocks, hash chain; freed blocks keep their hash until reused).
  void set_prefix_caching(bool on) { prefix_caching_ = on; }
  bool prefix_caching() const { return prefix_caching_; }
  // Extends *hashes, the chain hashes of the first full blocks of tokens[0, n), to every full
  // block of them (hashing only the blocks not yet in it). Callers keep the list with the
  // tokens (Sequence::block_hashes), so a prompt is hashed once, not at every lookup. Leaves
  // the list as it is while prefix caching is off.
  void HashFullBlocks(const int32_t* tokens, int32_t n, const BlockHash& key,
                      std::vector<BlockHash>* hashes) const;
  std::vector<BlockHash> HashFullBlocks(std::span<const int32_t> tokens,
                                        const BlockHash& key) const {
    std::vector<BlockHash> hashes;
    HashFullBlocks(tokens.data(), static_cast<int32_t>(tokens.size()), key, &hashes);
    return hashes;
  }
  // The longest cached prefix of n tokens whose full blocks have the given chain hashes (from
  // HashFullBlocks; entries past the blocks a match may use are ignored).
  PrefixMatch Match(std::span<const BlockHash> hashes, int32_t n) const;
  // The same for a token list without its hashes (hashes them on the spot).
  PrefixMatch Match(const int32_t* tokens, int32_t n, const BlockHash& key) const;
  // Starts a new sequence on a match: its blocks gain a reference, positions are its tokens.
  void AdoptPrefix(SeqId seq, const PrefixMatch& match);
  // Registers the sequence's newly full blocks of computed positions [0, n_computed) whose
  // chain hashes are in hashes: a block past the list is never registered, so a caller that
  // hashes only committed tokens never indexes a draft.
  // tokens: the sequence's token ids (at least the committed blocks'), handed to the index
  // listener with each block that enters the index; may be empty without one.
  void CommitFullBlocks(SeqId seq, std::span<const BlockHash> hashes, int32_t n_computed,
                        std::span<const int32_t> tokens = {});
  // Indexed blocks, over every group.
  int32_t num_cached_blocks() const;
  // The block indexed under hash in group g, if any.
  std::optional<BlockId> CachedBlock(const BlockHash& hash, int32_t g = 0) const;
  // Every indexed block of the first group with its hash, in no particular order (a tier's
  // flush at shutdown).
  std::vector<std::pair<BlockHash, BlockId>> CachedBlocks() const;
  // Drops every indexed block nobody holds from the index (vLLM's reset_prefix_cache); blocks
  // in use stay indexed. Returns how many were dropped.
  int32_t DropFreeCachedBlocks();

  // --- Lower tiers (engine/kv_tier.h). Called with a block and its hash just before the block
  // leaves the index; `reused` when it leaves because it was handed out again (its bytes are
  // still intact now, and overwritten by the step that took it), else its bytes are about to
  // change or it was dropped. The tier copies what it wants to keep before returning.
  using UncacheListener = std::function<void(BlockId id, const BlockHash& hash, bool reused)>;
  void set_uncache_listener(UncacheListener listener) { uncache_listener_ = std::move(listener); }
  // Called with every block that enters the prefix index (computed and committed, or loaded
  // from a tier), its chain hash, its parent's (zero for a prompt's first block) and its token
  // ids: with the uncache listener, every change of the index, in order (KV events).
  using IndexListener = std::function<void(
      BlockId id, const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens)>;
  void set_index_listener(IndexListener listener) { index_listener_ = std::move(listener); }
  // Takes n blocks for a load from a lower tier, held outside any table (refcount 1) until
  // ReleaseHeld. All or nothing, as Append; admission's watermark is the caller's to keep.
  bool HoldBlocks(int32_t n, std::vector<BlockId>* out);
  // Ends holds: blocks[i] for i < n_loaded enter the prefix index under hashes[i] (unless the
  // hash is indexed already: then the block stays private and is freed unindexed), and every
  // block returns to the free list, last first, so the chain's head is reused last.
  // first_parent: the chain hash before hashes[0] (zero at a prompt's start); tokens: the
  // blocks' token ids, [blocks][block_size] (for the index listener; may be empty).
  void ReleaseHeld(std::span<const BlockId> blocks, std::span<const BlockHash> hashes,
                   int32_t n_loaded, const BlockHash& first_parent = {},
                   std::span<const int32_t> tokens = {});
  int32_t num_held_blocks() const { return num_held_; }
  // Block hashes computed so far (HashFullBlocks and the token-list Match): how tests see that
  // a lookup reuses a sequence's hashes instead of hashing its tokens again.
  int64_t num_blocks_hashed() const { return num_blocks_hashed_; }

  // The pool's invariants, every block's refcount equals the number of tables holding it (and
  // the load holding it, HoldBlocks), the
  // prefix index and the blocks' hashes agree, an indexed block is full in every table holding
  // it, and a table's hashes cover only its full blocks.
  Status VerifyIntegrity() const;

 private:
  struct Group {
    KvGroupSpec spec;
    std::unordered_map<SeqId, BlockTable> tables;
    std::unordered_map<BlockHash, BlockId, BlockHashHasher> cached;  // its prefix index
  };
  bool LastBlockNeedsCopy(const BlockTable& t) const;
  int32_t GroupBlocksToAppend(const BlockTable& t, int32_t n_new) const;
  // Gives table t of group g n_new more positions from fresh (taken in order from *next).
  void GrowTable(BlockTable& t, int32_t n_new, std::span<const BlockId> fresh, size_t* next,
                 std::vector<BlockCopy>* copies);
  // A sliding-window group's eviction rule (kv_group.h) for a table whose next query is at pos.
  void ReleaseBeforeWindow(const KvGroupSpec& spec, BlockTable& t, int32_t pos);
  // The longest usable prefix, in blocks, of the first `usable` blocks under hashes.
  size_t MatchBlocks(std::span<const BlockHash> hashes, size_t usable) const;
  Status VerifyGroup(const Group& group, std::vector<int32_t>* holders) const;
  // Frees a table's blocks (null entries skipped), last first.
  void FreeBlocks(std::vector<BlockId>& blocks);
  // Takes n blocks, dropping the cached hashes of those that were cached (LRU eviction).
  bool AllocateBlocks(int32_t n, std::vector<BlockId>* out);
  // Removes a block from the prefix index (its bytes are about to change, or reused: handed out
  // again by AllocateBlocks).
  void Uncache(BlockId id, bool reused = false);
  BlockHash ChainHash(const BlockHash& parent, const BlockHash& key, const int32_t* tokens) const;

  BlockPool pool_;
  int32_t block_size_;
  int32_t watermark_;
  std::vector<Group> groups_;
  bool prefix_caching_ = false;
  std::vector<BlockHash> block_hash_;  // per block: its hash while it is in a group's index
  std::vector<bool> block_cached_;
  std::vector<uint8_t> block_group_;  // per block: the group whose index holds it
  UncacheListener uncache_listener_;
  IndexListener index_listener_;
  // Tells the index listener that block id entered the index (tokens: the block's, or empty).
  void Indexed(BlockId id, const BlockHash& hash, const BlockHash& parent,
               std::span<const int32_t> tokens) {
    if (index_listener_) index_listener_(id, hash, parent, tokens);
  }
  std::vector<uint8_t> held_;       // per block: held by HoldBlocks (counts as a holder)
  std::vector<KvGroupSpec> specs_;  // the groups as constructed (each groups_[g].spec)
  int32_t num_held_ = 0;
  // A statistic, not state: counted by const lookups (the engine is single-threaded).
  mutable int64_t num_blocks_hashed_ = 0;
};

}  // namespace kvs
