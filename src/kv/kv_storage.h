// The KV memory: one reservation, cut into blocks of block_size positions in every layer. The
// pool (KvCacheManager) hands out block ids; this class only owns the bytes, the format they are
// in (kv_format.h), and tells the kernels where a layer's blocks are (kernels/kv_layer.h gives
// the layout inside a layer).
//
// Memory slabs: by default each layer has a slab of its own, and a block id holds a block in
// every layer. An engine whose model has several KV groups (kv/kv_group.h) shares slabs between
// groups instead, as vLLM's hybrid KV cache manager shares tensors: layer l keeps its blocks in
// slab layer_slab[l] (its place in its group), and a block id, which belongs to one group at a
// time, holds that group's layers only. A sliding window's blocks then cost its own layers' bytes,
// not every layer's.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

#include "core/aligned.h"
#include "core/ids.h"
#include "core/status.h"
#include "kernels/kv_layer.h"
#include "kv/kv_format.h"

namespace kvs {

// Layer l's view of a storage in this format, its memory pointers (k, v) and RoPE table not set:
// what a storage fills in, and what a codec points at one block's bytes (ReadBlock's layout).
KvLayerView KvLayerViewOf(const KvFormat& format, int32_t l);

// The bytes of one block of n_slabs slabs of this geometry's layers (BytesPerBlock at n_layer).
size_t SlabBlockBytes(const KvGeometry& geometry, int32_t n_slabs);

class KvStorage {
 public:
  // n_blocks counts the null block, which is allocated too (never written, never read).
  // The memory's pages are faulted in by a thread of its own (MADV_POPULATE_WRITE: contents
  // untouched, so the engine may write meanwhile), as llama.cpp clears its KV buffer at start:
  // the first prefill or load from disk then writes into memory the kernel has already zeroed.
  // layer_slab: [n_layer] each layer's slab, from 0 (empty: a slab per layer).
  KvStorage(KvFormatPtr format, int32_t n_blocks, std::vector<int32_t> layer_slab = {});
  ~KvStorage();
  KvStorage(const KvStorage&) = delete;
  KvStorage& operator=(const KvStorage&) = delete;

  const KvFormat& format() const { return *format_; }
  const KvFormatPtr& shared_format() const { return format_; }
  const KvGeometry& geometry() const { return format_->geometry(); }
  int32_t num_blocks() const { return n_blocks_; }
  int32_t num_slabs() const { return n_slabs_; }
  // Whether layers share slabs (then a block holds one group's layers, and the tiers, which move
  // whole blocks of every layer, cannot read or write it).
  bool shares_slabs() const { return n_slabs_ != geometry().n_layer; }
  // One block's bytes in every slab: what a block id costs.
  size_t block_bytes() const { return SlabBlockBytes(geometry(), n_slabs_); }
  size_t bytes() const { return block_bytes() * n_blocks_; }
  // Kernel blocks (16 positions) per pool block.
  int32_t kernel_blocks_per_block() const { return geometry().block_size / kKvBlockTokens; }
  // The kernel blocks of pool blocks, in order (pool block b holds kernel blocks b * m ..
  // b * m + m - 1, m = kernel_blocks_per_block()): what a ragged batch's sequence reads
  // (model/batch.h) from its block table. The one place this mapping is written.
  std::vector<int32_t> KernelBlocks(std::span<const BlockId> blocks) const;
  // The physical kernel block of logical kernel block b (positions 16b .. 16b + 15) of a table.
  int32_t KernelBlock(std::span<const BlockId> blocks, int32_t b) const {
    const int32_t m = kernel_blocks_per_block();
    return blocks[b / m].value * m + b % m;
  }
  const std::vector<KvLayerView>& layers() const { return layers_; }
  // One layer of each slab: the views whose blocks together are a block id's bytes (what a copy
  // of a block copies).
  const std::vector<int32_t>& slab_layers() const { return slab_layers_; }

  // Makes the RoPE table of a RoPE-dependent key coding cover positions [0, n_positions)
  // (KvFormat::NeedsRopeTable; a no-op otherwise). It grows by doubling and is shared by every
  // layer's view; call it before a forward pass, never during one.
  void ReservePositions(int32_t n_positions);

  // A pool block's bytes, every layer's K then V (geometry().BytesPerBlock() in all): what a
  // lower tier stores (kv/block_file.h), and writes them back into a block of a storage of the
  // same format. Errors: a block out of range, a byte count that is not one block's.
  Status ReadBlock(int32_t block, std::vector<uint8_t>* out) const;
  Status WriteBlock(int32_t block, std::span<const uint8_t> bytes);

 private:
  KvFormatPtr format_;
  int32_t n_blocks_;
  int32_t n_slabs_;
  // [n_layer][K: kernel blocks of K head blocks | V: ...], in transparent huge pages where the
  // kernel grants them: a block's bytes are spread over every layer, so in 4 KiB pages the first
  // write of a block (a prefill, a load from disk) faults a page per layer and K/V half, which
  // in a VM costs more than the copy itself.
  // From the allocator (so that its limits apply, as any allocation's), 2 MiB aligned and
  // advised MADV_HUGEPAGE.
  AlignedPtr<uint8_t> memory_;
  size_t memory_bytes_ = 0;
  std::thread prefault_;  // joined before memory_ goes
  std::atomic<bool> stop_prefault_{false};
  std::vector<KvLayerView> layers_;
  std::vector<int32_t> slab_layers_;  // [n_slabs] the first layer in each slab
  std::vector<float> rope_table_;     // RopeTable (attention.h) of positions [0, 16 * rope_blocks_)
  int32_t rope_blocks_ = 0;
};

}  // namespace kvs
