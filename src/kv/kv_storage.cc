#include "kv/kv_storage.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include <sys/mman.h>

#include "core/check.h"

namespace kvs {

KvLayerView KvLayerViewOf(const KvFormat& format, int32_t l) {
  const KvGeometry& g = format.geometry();
  const KeyCoding& coding = format.key_coding();
  KvLayerView layer;
  layer.n_head_kv = g.n_head_kv;
  layer.head_dim_k = g.head_dim_k;
  layer.head_dim_v = g.head_dim_v;
  layer.k_type = g.k_type;
  layer.v_type = g.v_type;
  layer.key_coding = format.key_coding_kind();
  layer.n_rot = format.rope().n_rot;
  layer.rope_neox = format.rope().neox;
  const size_t per_layer = static_cast<size_t>(g.n_head_kv) * g.head_dim_k;
  if (!coding.offsets.empty()) layer.k_offset = coding.offsets.data() + l * per_layer;
  if (!coding.whitening.empty()) {
    layer.k_whitening = coding.whitening.data() + static_cast<size_t>(l) * g.n_head_kv;
  }
  return layer;
}

size_t SlabBlockBytes(const KvGeometry& geometry, int32_t n_slabs) {
  return geometry.BytesPerBlock() / static_cast<size_t>(geometry.n_layer) * n_slabs;
}

KvStorage::KvStorage(KvFormatPtr format, int32_t n_blocks, std::vector<int32_t> layer_slab)
    : format_(std::move(format)), n_blocks_(n_blocks) {
  KVS_CHECK(format_ != nullptr && n_blocks >= 1);
  const KvGeometry& g = format_->geometry();
  if (layer_slab.empty()) {
    for (int32_t l = 0; l < g.n_layer; ++l) layer_slab.push_back(l);
  }
  KVS_CHECK(static_cast<int32_t>(layer_slab.size()) == g.n_layer);
  n_slabs_ = 1 + *std::max_element(layer_slab.begin(), layer_slab.end());
  KVS_CHECK(*std::min_element(layer_slab.begin(), layer_slab.end()) >= 0 && n_slabs_ <= g.n_layer);
  const size_t kernel_blocks = static_cast<size_t>(n_blocks) * (g.block_size / kKvBlockTokens);
  KvLayerView layer = KvLayerViewOf(*format_, 0);
  const size_t k_bytes = kernel_blocks * layer.k_block_stride();
  const size_t v_bytes = kernel_blocks * layer.v_block_stride();
  constexpr size_t kHugePage = size_t{2} << 20;
  memory_bytes_ = ((k_bytes + v_bytes) * n_slabs_ + kHugePage - 1) / kHugePage * kHugePage;
  void* memory = std::aligned_alloc(kHugePage, memory_bytes_);
  if (memory == nullptr) throw std::bad_alloc();  // the builders report it as too much --kv-memory
  memory_.reset(static_cast<uint8_t*>(memory));
  madvise(memory, memory_bytes_, MADV_HUGEPAGE);  // advice only: without THP, 4 KiB pages
  prefault_ = std::thread([this, data = memory_.get(), size = memory_bytes_] {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; an older kernel refuses it and pages fault on use
#endif
    // In 64 MiB steps, so that a storage destroyed early (a short command) does not wait for
    // all of it.
    constexpr size_t kStep = size_t{64} << 20;
    for (size_t at = 0; at < size && !stop_prefault_.load(std::memory_order_relaxed); at += kStep) {
      if (madvise(data + at, std::min(kStep, size - at), MADV_POPULATE_WRITE) != 0) break;
    }
  });
  for (int32_t l = 0; l < g.n_layer; ++l) {
    uint8_t* slab = memory_.get() + static_cast<size_t>(layer_slab[l]) * (k_bytes + v_bytes);
    layer = KvLayerViewOf(*format_, l);
    layer.k = slab;
    layer.v = slab + k_bytes;
    layers_.push_back(layer);
  }
  slab_layers_.assign(n_slabs_, -1);
  for (int32_t l = g.n_layer - 1; l >= 0; --l) slab_layers_[layer_slab[l]] = l;
  KVS_CHECK(*std::min_element(slab_layers_.begin(), slab_layers_.end()) >= 0);  // none unused
}

KvStorage::~KvStorage() {
  stop_prefault_ = true;
  if (prefault_.joinable()) prefault_.join();
}

std::vector<int32_t> KvStorage::KernelBlocks(std::span<const BlockId> blocks) const {
  const int32_t n = static_cast<int32_t>(blocks.size()) * kernel_blocks_per_block();
  std::vector<int32_t> out(n);
  for (int32_t b = 0; b < n; ++b) out[b] = KernelBlock(blocks, b);
  return out;
}

Status KvStorage::ReadBlock(int32_t block, std::vector<uint8_t>* out) const {
  if (shares_slabs())
    return Status::Error("a KV block of a storage that shares slabs is not whole");
  if (block < 1 || block >= n_blocks_) {
    return Status::Error(StrFormat("KV block %d is not in the pool (1..%d)", block, n_blocks_ - 1));
  }
  const size_t m = static_cast<size_t>(kernel_blocks_per_block());
  out->clear();
  out->reserve(geometry().BytesPerBlock());
  for (const KvLayerView& layer : layers_) {
    const uint8_t* k = layer.k + block * m * layer.k_block_stride();
    const uint8_t* v = layer.v + block * m * layer.v_block_stride();
    out->insert(out->end(), k, k + m * layer.k_block_stride());
    out->insert(out->end(), v, v + m * layer.v_block_stride());
  }
  return Status::Ok();
}

Status KvStorage::WriteBlock(int32_t block, std::span<const uint8_t> bytes) {
  if (shares_slabs())
    return Status::Error("a KV block of a storage that shares slabs is not whole");
  if (block < 1 || block >= n_blocks_) {
    return Status::Error(StrFormat("KV block %d is not in the pool (1..%d)", block, n_blocks_ - 1));
  }
  if (bytes.size() != geometry().BytesPerBlock()) {
    return Status::Error(StrFormat("a KV block of this format has %zu bytes, not %zu",
                                   geometry().BytesPerBlock(), bytes.size()));
  }
  const size_t m = static_cast<size_t>(kernel_blocks_per_block());
  size_t at = 0;
  for (const KvLayerView& layer : layers_) {
    const size_t kb = m * layer.k_block_stride(), vb = m * layer.v_block_stride();
    std::memcpy(layer.k + block * m * layer.k_block_stride(), bytes.data() + at, kb);
    std::memcpy(layer.v + block * m * layer.v_block_stride(), bytes.data() + at + kb, vb);
    at += kb + vb;
  }
  return Status::Ok();
}

void KvStorage::ReservePositions(int32_t n_positions) {
  if (!format_->NeedsRopeTable()) return;
  const int32_t need = (std::max(n_positions, 1) + kKvBlockTokens - 1) / kKvBlockTokens;
  if (need <= rope_blocks_) return;
  const KvRope& r = format_->rope();
  const RopeParams rope{r.n_rot, r.freq_base, r.freq_scale, r.neox,
                        r.freq_factors.empty() ? nullptr : r.freq_factors.data()};
  const int32_t blocks = std::max(need, 2 * rope_blocks_);
  rope_table_.resize(static_cast<size_t>(blocks) * r.n_rot * kKvBlockTokens);
  FillRopeTable(rope, rope_blocks_, blocks - rope_blocks_, rope_table_.data());
  rope_blocks_ = blocks;
  for (KvLayerView& layer : layers_) {
    layer.rope_table = rope_table_.data();
    layer.rope_positions = blocks * kKvBlockTokens;
  }
}

}  // namespace kvs
