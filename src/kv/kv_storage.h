// The KV memory: one reservation, cut into blocks of block_size positions in every layer. The
// pool (KvCacheManager) hands out block ids; this class only owns the bytes and tells the
// kernels where a layer's blocks are (kernels/kv_layer.h gives the layout inside a layer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "core/status.h"
#include "kernels/kv_layer.h"

namespace kvs {

struct KvGeometry {
  int32_t n_layer = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  int32_t block_size = 16;  // positions per pool block, a multiple of kKvBlockTokens
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;

  // K and V bytes of one pool block in all layers, and per position (a block's share).
  size_t BytesPerBlock() const;
  double BytesPerToken() const { return static_cast<double>(BytesPerBlock()) / block_size; }
  Status Validate() const;
};

// How a quantized K cache codes keys, measured once per model (engine/key_offsets.h). Set
// before the first write, as every key of a head must be stored alike.
struct KeyCoding {
  // [n_layer][n_head_kv][head_dim_k], of the kind KvKeyOffsetFollowsRope(k_type) says (see
  // KvLayerView::k_offset), or empty.
  std::vector<float> offsets;
  // [n_layer][n_head_kv] where KvKeysWhitened(k_type, head_dim_k) (KvLayerView::k_whitening),
  // or empty.
  std::vector<KeyWhitening> whitening;
  bool empty() const { return offsets.empty() && whitening.empty(); }
};

class KvStorage {
 public:
  // n_blocks counts the null block, which is allocated too (never written, never read).
  KvStorage(const KvGeometry& geometry, int32_t n_blocks);

  const KvGeometry& geometry() const { return geometry_; }
  int32_t num_blocks() const { return n_blocks_; }
  size_t bytes() const { return geometry_.BytesPerBlock() * n_blocks_; }
  // Kernel blocks (16 positions) per pool block.
  int32_t kernel_blocks_per_block() const { return geometry_.block_size / kKvBlockTokens; }
  const std::vector<KvLayerView>& layers() const { return layers_; }
  void SetKeyCoding(KeyCoding coding);

 private:
  KvGeometry geometry_;
  int32_t n_blocks_;
  AlignedPtr<uint8_t> memory_;  // [n_layer][K: kernel blocks of K head blocks | V: ...]
  std::vector<KvLayerView> layers_;
  KeyCoding key_coding_;
};

}  // namespace kvs
