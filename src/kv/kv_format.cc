#include "kv/kv_format.h"

#include "core/check.h"
#include "kernels/attention.h"

namespace kvs {

size_t KvGeometry::BytesPerBlock() const {
  const size_t head_blocks =
      KvHeadBlockBytes(k_type, head_dim_k) + KvHeadBlockBytes(v_type, head_dim_v);
  return static_cast<size_t>(n_layer) * n_head_kv * head_blocks * (block_size / kKvBlockTokens);
}

Status KvGeometry::Validate() const {
  if (n_layer <= 0 || n_head_kv <= 0 || head_dim_k <= 0 || head_dim_v <= 0) {
    return Status::Error("KV geometry: layers, heads and head sizes must be positive");
  }
  if (block_size <= 0 || block_size % kKvBlockTokens != 0 || block_size > 1024) {
    return Status::Error(StrFormat(
        "--block-size %d: must be a multiple of %d between %d and 1024 (the attention kernel "
        "reads %d positions at a time)",
        block_size, kKvBlockTokens, kKvBlockTokens, kKvBlockTokens));
  }
  KVS_RETURN_IF_ERROR(ValidateKvType(k_type, head_dim_k));
  return ValidateKvType(v_type, head_dim_v);
}

Expected<KvFormatPtr> KvFormat::Make(const KvGeometry& geometry, const KvRope& rope,
                                     KeyCoding coding, KvCalibration calibration) {
  KVS_RETURN_IF_ERROR(geometry.Validate());
  const KeyCodingKind kind = coding.empty()
                                 ? KeyCodingKind::kPlain
                                 : KeyCodingKindFor(geometry.k_type, geometry.head_dim_k);
  const size_t heads = static_cast<size_t>(geometry.n_layer) * geometry.n_head_kv;
  switch (kind) {
    case KeyCodingKind::kPlain:
      break;
    case KeyCodingKind::kConstantOffset:
    case KeyCodingKind::kRopeOffset:
      if (coding.offsets.size() != heads * geometry.head_dim_k || !coding.whitening.empty()) {
        return Status::Error("KV format: key offsets do not match the cache geometry");
      }
      break;
    case KeyCodingKind::kWhitened:
      if (coding.whitening.size() != heads || !coding.offsets.empty()) {
        return Status::Error("KV format: key whitening does not match the cache geometry");
      }
      break;
  }
  if (kind != KeyCodingKind::kPlain &&
      (rope.n_rot <= 0 || rope.n_rot > geometry.head_dim_k || rope.n_rot % 2 != 0)) {
    return Status::Error("KV format: a calibrated key coding needs the model's RoPE dims");
  }
  if (kind != KeyCodingKind::kConstantOffset) calibration.offset_context = 0;
  auto f = std::shared_ptr<KvFormat>(new KvFormat());
  f->geometry_ = geometry;
  f->rope_ = rope;
  f->kind_ = kind;
  f->coding_ = std::move(coding);
  f->calibration_ = std::move(calibration);

  // Everything that changes a stored byte; the calibration's source and time do not.
  DigestBuilder d;
  d.Text("kvserve-kv-format").Int(kKvFormatVersion);
  d.Int(geometry.n_layer).Int(geometry.n_head_kv).Int(geometry.head_dim_k).Int(geometry.head_dim_v);
  d.Int(geometry.block_size).Text(KvTypeName(geometry.k_type)).Text(KvTypeName(geometry.v_type));
  d.Int(rope.n_rot).Int(rope.neox ? 1 : 0);
  d.Bytes(&rope.freq_base, sizeof(rope.freq_base)).Bytes(&rope.freq_scale, sizeof(rope.freq_scale));
  d.Bytes(rope.freq_factors.data(), rope.freq_factors.size() * sizeof(float));
  d.Int(static_cast<int64_t>(kind));
  d.Bytes(f->coding_.offsets.data(), f->coding_.offsets.size() * sizeof(float));
  d.Bytes(f->coding_.whitening.data(), f->coding_.whitening.size() * sizeof(KeyWhitening));
  d.Add(f->calibration_.tokens).Int(f->calibration_.offset_context);
  f->fingerprint_ = d.Finish();
  return KvFormatPtr(std::move(f));
}

std::string KvFormat::Describe() const {
  std::string s =
      StrFormat("K %s, V %s, block %d, keys %s", std::string(KvTypeName(k_type())).c_str(),
                std::string(KvTypeName(v_type())).c_str(), block_size(), KeyCodingKindName(kind_));
  if (kind_ != KeyCodingKind::kPlain) {
    s += " (calibration: " + calibration_.source;
    if (calibration_.offset_context > 0)
      s += StrFormat(", averaged over %d positions", calibration_.offset_context);
    s += ")";
  }
  return s + ", fingerprint " + fingerprint_.Hex();
}

KvFormatPtr PlainKvFormat(const KvGeometry& geometry, const KvRope& rope) {
  auto f = KvFormat::Make(geometry, rope, {}, {});
  KVS_CHECK_MSG(f.ok(), f.ok() ? "" : f.error().c_str());
  return *f;
}

}  // namespace kvs
