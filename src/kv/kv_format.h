// The KV format: everything that decides the bytes of a KV block — the geometry (layers, heads,
// head sizes, block size), the K and V element types, how keys are coded (offsets or whitening,
// and the calibration they came from), RoPE, and the format version. One immutable object,
// built by one factory (engine/kv_format_factory.h), owned by the KV storage and shared by
// whatever reads its blocks. Its fingerprint is a digest of all of it: two caches whose formats
// have the same fingerprint store interchangeable blocks, which is what the prefix-cache key and
// the tiers (a block on disk, or shared between processes through Redis) rely on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/digest.h"
#include "core/status.h"
#include "kernels/key_whitening.h"
#include "kernels/kv_layer.h"
#include "kernels/kv_types.h"

namespace kvs {

// Bumped whenever a code path changes the bytes a format stores (a codec, the layout, the
// calibration's arithmetic), so that blocks written by an older build are never read as current.
inline constexpr int32_t kKvFormatVersion = 1;

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

// The measured part of a key coding (engine/key_offsets.h).
struct KeyCoding {
  // [n_layer][n_head_kv][head_dim_k] for kConstantOffset and kRopeOffset.
  std::vector<float> offsets;
  // [n_layer][n_head_kv] for kWhitened.
  std::vector<KeyWhitening> whitening;
  bool empty() const { return offsets.empty() && whitening.empty(); }
};

// RoPE as the model applies it, by value (the format outlives no model, but must not point
// into one): RoPE-dependent key codings store keys turned by their position.
struct KvRope {
  int32_t n_rot = 0;
  float freq_base = 10000.f;
  float freq_scale = 1.f;
  bool neox = false;
  std::vector<float> freq_factors;  // [n_rot/2] or empty
};

// Where a key coding came from.
struct KvCalibration {
  std::string source;          // "built-in" or a file path: for people, not fingerprinted
  Digest128 tokens;            // digest of the calibration token ids
  int32_t offset_context = 0;  // positions a constant offset was averaged over (0: none)
  double seconds = 0;          // how long measuring took: for the log
};

class KvFormat {
 public:
  // Checks that the coding fits the geometry (kind, sizes) and computes the fingerprint.
  static Expected<std::shared_ptr<const KvFormat>> Make(const KvGeometry& geometry,
                                                        const KvRope& rope, KeyCoding coding,
                                                        KvCalibration calibration);

  const KvGeometry& geometry() const { return geometry_; }
  KvType k_type() const { return geometry_.k_type; }
  KvType v_type() const { return geometry_.v_type; }
  int32_t block_size() const { return geometry_.block_size; }
  KeyCodingKind key_coding_kind() const { return kind_; }
  const KeyCoding& key_coding() const { return coding_; }
  const KvRope& rope() const { return rope_; }
  const KvCalibration& calibration() const { return calibration_; }
  // Writes and attention need the cos/sin of each key's position.
  bool NeedsRopeTable() const {
    return kind_ == KeyCodingKind::kRopeOffset || kind_ == KeyCodingKind::kWhitened;
  }
  const Digest128& fingerprint() const { return fingerprint_; }
  // "q8_0/turbo4, keys less a constant offset (calibrated: built-in, 57 tokens, c=4096), ..."
  std::string Describe() const;

 private:
  KvFormat() = default;

  KvGeometry geometry_;
  KvRope rope_;
  KeyCodingKind kind_ = KeyCodingKind::kPlain;
  KeyCoding coding_;
  KvCalibration calibration_;
  Digest128 fingerprint_;
};
using KvFormatPtr = std::shared_ptr<const KvFormat>;

// An uncalibrated format: for unquantized K types, or tests that want plain quantized keys.
KvFormatPtr PlainKvFormat(const KvGeometry& geometry, const KvRope& rope = {});

}  // namespace kvs
