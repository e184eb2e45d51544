// The KV block pool: metadata only (id, refcount, free-list links), kept apart from the KV
// memory that kernels read. Block 0 is the null block and is never handed out. Free blocks sit
// in an intrusive, index-linked list in LRU order: allocation takes from the head, freed blocks
// join the tail, and a block can leave from the middle in O(1) (a prefix-cache hit, issue #6).
// Running out of blocks is a normal result, not an error.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/ids.h"
#include "core/status.h"

namespace kvs {

inline constexpr BlockId kNullBlock{0};

class BlockPool {
 public:
  // n_blocks counts the null block: a pool of n hands out at most n - 1 blocks.
  explicit BlockPool(int32_t n_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t num_free() const { return num_free_; }

  // Takes n blocks from the head of the free list, each with refcount 1, appended to *out.
  // All or nothing: returns false and changes nothing when fewer than n are free.
  bool Allocate(int32_t n, std::vector<BlockId>* out);

  // Another holder of a block in use (a forked sequence sharing it).
  Status Ref(BlockId id);
  // A prefix-cache hit: takes a reference whether the block is in use or free (then it leaves
  // the free list from wherever it is, O(1)).
  Status Acquire(BlockId id);

  // Drops one reference from each block, in order; a block whose count reaches zero joins the
  // tail of the free list, so the blocks freed last are reused last. Allocation-free: it runs
  // for every finished, preempted or truncated sequence.
  Status Free(std::span<const BlockId> ids);

  int32_t ref_count(BlockId id) const { return blocks_[id.value].ref_count; }

  // Checks every invariant: the free list is a well-linked chain of exactly the blocks with
  // refcount 0 (the null block aside), counted by num_free().
  Status VerifyIntegrity() const;

 private:
  // Free-list links are plain indices into blocks_ (-1: none), private to the pool.
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1;  // free-list links; -1 when not in the list
    int32_t next = -1;
  };

  void PushBack(int32_t id);
  void Remove(int32_t id);
  bool InRange(BlockId id) const { return id > kNullBlock && id.value < num_blocks(); }

  std::vector<Block> blocks_;
  // Free's scratch: per block, the references the list being freed drops. All zero between
  // calls, so a call touches only the entries of its own ids.
  std::vector<int32_t> drops_;
  int32_t head_ = -1, tail_ = -1;
  int32_t num_free_ = 0;
};

}  // namespace kvs
