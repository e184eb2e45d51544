// The KV memory: one reservation, cut into blocks of block_size positions in every layer. The
// pool (KvCacheManager) hands out block ids; this class only owns the bytes, the format they are
// in (kv_format.h), and tells the kernels where a layer's blocks are (kernels/kv_layer.h gives
// the layout inside a layer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

#include "core/aligned.h"
#include "kernels/kv_layer.h"
#include "kv/kv_format.h"

namespace kvs {

class KvStorage {
 public:
  // n_blocks counts the null block, which is allocated too (never written, never read).
  KvStorage(KvFormatPtr format, int32_t n_blocks);

  const KvFormat& format() const { return *format_; }
  const KvFormatPtr& shared_format() const { return format_; }
  const KvGeometry& geometry() const { return format_->geometry(); }
  int32_t num_blocks() const { return n_blocks_; }
  size_t bytes() const { return geometry().BytesPerBlock() * n_blocks_; }
  // Kernel blocks (16 positions) per pool block.
  int32_t kernel_blocks_per_block() const { return geometry().block_size / kKvBlockTokens; }
  const std::vector<KvLayerView>& layers() const { return layers_; }

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
  AlignedPtr<uint8_t> memory_;  // [n_layer][K: kernel blocks of K head blocks | V: ...]
  std::vector<KvLayerView> layers_;
  std::vector<float> rope_table_;  // RopeTable (attention.h) of positions [0, 16 * rope_blocks_)
  int32_t rope_blocks_ = 0;
};

}  // namespace kvs
