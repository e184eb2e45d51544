// The transform codec of the cold tiers (issue #23, `--kv-disk-codec tc:N`): a pool block's KV
// is read back to vectors (kernels/kv_layer.h ReadKv, whatever the pool's types), keys turned
// back by RoPE to their position-free form, each head's vectors projected on its principal
// components (engine/kv_transforms.h), the components coded with the bits a budget of N bits per
// element gives them (kernels/kv_transform.h), and the codes stored bit-packed or, where smaller,
// zstd-compressed (which one: measured per block; `kvserve kv codec-bench` reports both).
// Decoding writes the vectors back into a block of the pool's types (WriteKv), so a block loads
// into any pool format the codec was made for.
//
// Exceptions: the first sink_tokens positions of a sequence (attention sinks) may be stored as
// f16 vectors, not coded (off by default: measured, no gain). The most recent positions need no
// exception in the tiers: a prompt's tail past its last full block is always computed.
//
// Payload: magic "KVTC" | version u8 | flags u8 (1: codes zstd) | sinks u16 | fit digest 16 |
//   first position i32 | code bytes u32 | sink vectors f16 [layer][sinks][head][K dk, V dv] |
//   codes: per layer, per head, K then V, component-major [n_coded][positions] (packed or zstd)
// The fit digest covers the transforms, the bits, the sink count, the codec's version and the
// KV format: a payload of any other fit fails to decode.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/kv_transforms.h"
#include "kv/block_codec.h"
#include "kv/kv_format.h"

namespace kvs {

struct TransformCodecOptions {
  double bits = 2.0;  // budget per element (tc:N), 0 < N <= 8
  // First positions of a sequence stored as f16 (attention sinks). Off by default: measured on
  // stories-hd64-3M (docs/BENCHMARKS.md), 4 sink positions left the perplexity change as it was
  // (+0.10% at tc:1 either way) and cost 0.5 bits per element at a 128-token context.
  int32_t sink_tokens = 0;
  int zstd_level = 3;          // of the codes, where zstd beats packing
  int32_t decode_threads = 2;  // layers decoded in parallel (codec-bench: -t; the tiers: 1)
};

// "tc:2" / "tc:1.5" / "tc:3,sink=0": the bits and options; an error naming the problem.
Expected<TransformCodecOptions> ParseTransformCodec(const std::string& spec);
std::string TransformCodecName(const TransformCodecOptions& options);

class TransformCodec : public KvBlockCodec {
 public:
  static Expected<std::shared_ptr<TransformCodec>> Make(KvFormatPtr format,
                                                        std::shared_ptr<const KvTransforms> fit,
                                                        const TransformCodecOptions& options);
  std::string name() const override;
  Expected<std::vector<uint8_t>> Encode(std::span<const uint8_t> block,
                                        int32_t first_position) const override;
  Status Decode(std::span<const uint8_t> payload, std::vector<uint8_t>* block) const override;
  // A "KVTC" payload of this version whose fit digest is not this codec's.
  bool OtherFit(std::span<const uint8_t> payload) const override;

  // Stored bits per element of the codes alone (the allocation's budget as spent).
  double allocated_bits_per_element() const;
  const Digest128& fit_digest() const { return fit_digest_; }
  // Blocks whose codes went through zstd / were stored packed (Encode's choice), for reports.
  int64_t zstd_blocks() const { return zstd_blocks_; }
  int64_t packed_blocks() const { return packed_blocks_; }

 private:
  TransformCodec() = default;
  // Pool-block views over bytes (one block: slots 0..block_size-1), RoPE rows of its positions.
  void Views(uint8_t* block, const float* rope_table, std::vector<KvLayerView>* views) const;
  void FillRope(int32_t first_position, std::vector<float>* cos_sin,
                std::vector<float>* table) const;
  // The payload around a block's byte codes [layer][head][K, V][n_coded][n] and its f16 sink
  // vectors: the codes packed at their bits, or zstd's bytes where smaller, behind the header.
  std::vector<uint8_t> Payload(const std::vector<uint8_t>& codes,
                               const std::vector<uint16_t>& sinks, int32_t n, int32_t n_sink,
                               int32_t first_position) const;
  // Where each layer's packed codes of n positions start in a payload's body, and the end.
  std::vector<size_t> PackedLayerOffsets(int32_t n) const;
  // Layer l's byte codes of n positions into codes (its part of them), unpacked from the body at
  // packed_at or, zstd's, range-checked where they already are; false: codes out of range.
  bool LayerCodes(size_t l, int32_t n, bool zstd, std::span<const uint8_t> body,
                  const std::vector<size_t>& packed_at, uint8_t* codes) const;
  // Writes layer l's decoded vectors into its view (one thread per layer).
  void DecodeLayer(int32_t l, const KvLayerView& view, const uint8_t* codes, size_t code_offset,
                   const uint16_t* sinks, int32_t n_sink, const float* cos_sin) const;

  KvFormatPtr format_;
  std::shared_ptr<const KvTransforms> fit_;
  TransformCodecOptions options_;
  Digest128 fit_digest_;
  std::vector<HeadCode> keys_, values_;    // [n_layer * n_head_kv]
  std::vector<size_t> layer_code_offset_;  // [n_layer + 1]: byte codes per block up to layer l
  mutable std::unique_ptr<ThreadPool> decode_pool_;
  mutable std::mutex decode_mu_;  // the pool is not reentrant: one decode uses it at a time
  mutable std::atomic<int64_t> zstd_blocks_{0}, packed_blocks_{0};
};

}  // namespace kvs
