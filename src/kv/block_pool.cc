#include "kv/block_pool.h"

#include "core/check.h"

namespace kvs {

BlockPool::BlockPool(int32_t n_blocks)
    : blocks_(static_cast<size_t>(n_blocks)), drops_(static_cast<size_t>(n_blocks), 0) {
  KVS_CHECK(n_blocks >= 1);
  blocks_[kNullBlock.value].ref_count = 1;  // permanently held: never free, never handed out
  for (int32_t id = 1; id < n_blocks; ++id) PushBack(id);
}

void BlockPool::PushBack(int32_t id) {
  Block& b = blocks_[id];
  b.prev = tail_;
  b.next = -1;
  if (tail_ >= 0) {
    blocks_[tail_].next = id;
  } else {
    head_ = id;
  }
  tail_ = id;
  ++num_free_;
}

void BlockPool::Remove(int32_t id) {
  Block& b = blocks_[id];
  if (b.prev >= 0) {
    blocks_[b.prev].next = b.next;
  } else {
    head_ = b.next;
  }
  if (b.next >= 0) {
    blocks_[b.next].prev = b.prev;
  } else {
    tail_ = b.prev;
  }
  b.prev = b.next = -1;
  --num_free_;
}

bool BlockPool::Allocate(int32_t n, std::vector<BlockId>* out) {
  if (n < 0 || n > num_free_) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = head_;
    Remove(id);
    blocks_[id].ref_count = 1;
    out->push_back(BlockId{id});
  }
  return true;
}

Status BlockPool::Ref(BlockId id) {
  if (!InRange(id)) return Status::Error(StrFormat("block %d is not a pool block", id.value));
  Block& b = blocks_[id.value];
  if (b.ref_count == 0) return Status::Error(StrFormat("block %d is free", id.value));
  ++b.ref_count;
  return Status::Ok();
}

Status BlockPool::Acquire(BlockId id) {
  if (!InRange(id)) return Status::Error(StrFormat("block %d is not a pool block", id.value));
  if (blocks_[id.value].ref_count == 0) Remove(id.value);
  ++blocks_[id.value].ref_count;
  return Status::Ok();
}

Status BlockPool::Free(std::span<const BlockId> ids) {
  // Check everything first so that a bad list changes nothing.
  for (BlockId id : ids) {
    if (!InRange(id)) return Status::Error(StrFormat("block %d is not a pool block", id.value));
    if (blocks_[id.value].ref_count == 0) {
      return Status::Error(StrFormat("block %d is already free", id.value));
    }
  }
  // A block listed more often than it is referenced: counted in the member scratch, which is
  // zeroed again for exactly the ids counted (a list is usually one or a few blocks).
  int32_t over = -1;
  for (BlockId id : ids) {
    if (++drops_[id.value] > blocks_[id.value].ref_count) {
      over = id.value;
      break;
    }
  }
  for (BlockId id : ids) drops_[id.value] = 0;
  if (over >= 0) return Status::Error(StrFormat("block %d freed more often than referenced", over));
  for (BlockId id : ids) {
    if (--blocks_[id.value].ref_count == 0) PushBack(id.value);
  }
  return Status::Ok();
}

Status BlockPool::VerifyIntegrity() const {
  const Block& null_block = blocks_[kNullBlock.value];
  if (null_block.ref_count != 1 || null_block.prev != -1 || null_block.next != -1) {
    return Status::Error("the null block was handed out or freed");
  }
  std::vector<bool> seen(blocks_.size(), false);
  int32_t count = 0, prev = -1;
  for (int32_t id = head_; id >= 0; id = blocks_[id].next) {
    if (!InRange(BlockId{id})) return Status::Error(StrFormat("free list holds block %d", id));
    if (seen[id]) return Status::Error(StrFormat("free list has a cycle at block %d", id));
    if (blocks_[id].prev != prev) return Status::Error(StrFormat("block %d: bad prev link", id));
    if (blocks_[id].ref_count != 0) {
      return Status::Error(
          StrFormat("block %d is in the free list with refcount %d", id, blocks_[id].ref_count));
    }
    seen[id] = true;
    prev = id;
    ++count;
  }
  if (prev != tail_) return Status::Error("free list tail does not match");
  if (count != num_free_) {
    return Status::Error(
        StrFormat("free list holds %d blocks, num_free says %d", count, num_free_));
  }
  for (int32_t id = 1; id < num_blocks(); ++id) {
    if (blocks_[id].ref_count < 0)
      return Status::Error(StrFormat("block %d: negative refcount", id));
    if (blocks_[id].ref_count == 0 && !seen[id]) {
      return Status::Error(StrFormat("block %d is unreferenced but not free", id));
    }
  }
  return Status::Ok();
}

}  // namespace kvs
