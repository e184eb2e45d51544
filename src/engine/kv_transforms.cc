#include "engine/kv_transforms.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/byte_io.h"
#include "core/log.h"
#include "engine/kv_format_factory.h"
#include "kernels/kv_layer.h"
#include "kernels/ops.h"
#include "kv/block_file.h"
#include "kv/kv_storage.h"

namespace kvs {
namespace {

constexpr char kBasisMagic[8] = {'K', 'V', 'T', 'C', 'B', 'A', 'S', 'E'};
constexpr uint32_t kBasisVersion = 1;

Digest128 BasisBodyDigest(std::span<const uint8_t> body) {
  return DigestBytes(body.data(), body.size());
}

}  // namespace

Digest128 KvTransformKey(const Digest128& weights, const KvFormat& format,
                         const std::vector<int32_t>& tokens) {
  return DigestBuilder()
      .Text("kvserve kv transforms")
      .Int(kBasisVersion)
      .Add(weights)
      .Add(format.fingerprint())
      .Bytes(tokens.data(), tokens.size() * sizeof(int32_t))
      .Finish();
}

Expected<KvTransforms> FitKvTransforms(const Model& model, ThreadPool& pool,
                                       const std::vector<int32_t>& tokens, int32_t chunk,
                                       const Digest128& key, CalibrationRuns* runs) {
  const ModelConfig& c = model.config();
  if (tokens.size() < 2) return Status::Error("transform fit: needs at least 2 calibration tokens");
  chunk = std::max(chunk, 2);
  const int32_t n_tok = static_cast<int32_t>(tokens.size());
  if (c.uniform_rope() == nullptr) {
    return Status::Error(
        "transform fit: needs one RoPE for every layer; this model's layers "
        "differ");
  }
  const RopeParams rope = model.Rope(0);
  const int32_t H = c.n_head_kv, dk = c.head_dim_k, dv = c.head_dim_v, n_rot = rope.n_rot;
  const size_t n_heads = static_cast<size_t>(c.n_layer) * H;
  // Samples: [head][sample][d]; position 0 of each chunk left out (attention sinks).
  int64_t n_samples = 0;
  for (int32_t at = 0; at < n_tok; at += chunk) n_samples += std::min(chunk, n_tok - at) - 1;
  if (n_samples < 1) return Status::Error("transform fit: no calibration positions past the first");
  std::vector<float> ks(n_heads * n_samples * dk), vs(n_heads * n_samples * dv);
  std::vector<float> k(static_cast<size_t>(H) * dk), v(static_cast<size_t>(H) * dv), cs(n_rot);
  int64_t sample = 0;
  for (int32_t at = 0; at < n_tok; at += chunk) {
    const int32_t n = std::min(chunk, n_tok - at);
    if (n < 2) break;
    // A text of one chunk is the prefill the key codings and tri measured: shared.
    const std::span<const int32_t> part(tokens.data() + at, static_cast<size_t>(n));
    auto run = runs != nullptr ? runs->Get(part, /*with_queries=*/false)
                               : CalibrationPrefill::Run(model, pool, part, false);
    if (!run.ok()) return run.status();
    const KvStorage& storage = (*run)->storage();
    const std::vector<int32_t>& blocks = (*run)->blocks();
    for (int32_t p = 1; p < n; ++p, ++sample) {
      RopeAngles(p, rope, cs.data());
      for (int32_t i = n_rot / 2; i < n_rot; ++i) cs[i] = -cs[i];  // turn back by -p
      for (int32_t l = 0; l < c.n_layer; ++l) {
        // Slot p of the sequence: kernel block blocks[p / 16], position p % 16.
        const int64_t slot =
            static_cast<int64_t>(blocks[p / kKvBlockTokens]) * kKvBlockTokens + p % kKvBlockTokens;
        ReadKv(storage.layers()[l], slot, p, k.data(), v.data());
        for (int32_t h = 0; h < H; ++h) {
          float* kh = k.data() + static_cast<size_t>(h) * dk;
          ApplyRope(kh, cs.data(), n_rot, rope.neox);
          const size_t head = static_cast<size_t>(l) * H + h;
          std::copy_n(kh, dk, ks.data() + (head * n_samples + sample) * dk);
          std::copy_n(v.data() + static_cast<size_t>(h) * dv, dv,
                      vs.data() + (head * n_samples + sample) * dv);
        }
      }
    }
  }
  KvTransforms t;
  t.key = key;
  t.n_layer = c.n_layer;
  t.n_head_kv = H;
  t.head_dim_k = dk;
  t.head_dim_v = dv;
  t.n_samples = n_samples;
  t.keys.resize(n_heads);
  t.values.resize(n_heads);
  // One head per task: the eigen-decompositions dominate (head_dim^3 each).
  pool.ParallelFor(n_heads, 1, [&](int, size_t begin, size_t end) {
    for (size_t head = begin; head < end; ++head) {
      t.keys[head] = FitHeadTransform(ks.data() + head * n_samples * dk, n_samples, dk, dk);
      t.values[head] = FitHeadTransform(vs.data() + head * n_samples * dv, n_samples, dv, dv);
    }
  });
  const std::vector<uint8_t> bytes = SerializeKvTransforms(t);
  auto parsed = ParseKvTransforms(bytes, key, ModelKvGeometry(c, kKvBlockTokens));
  if (!parsed.ok()) return parsed.status();
  return std::move(*parsed);  // with its digest
}

std::vector<uint8_t> SerializeKvTransforms(const KvTransforms& t) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(kBasisMagic, sizeof(kBasisMagic));
  w.Int(kBasisVersion);
  w.Int(t.key.lo);
  w.Int(t.key.hi);
  for (int32_t v : {t.n_layer, t.n_head_kv, t.head_dim_k, t.head_dim_v}) w.Int(v);
  w.Int(t.n_samples);
  for (const auto* heads : {&t.keys, &t.values}) {
    for (const HeadTransform& h : *heads) {
      w.Floats(h.mean);
      w.Floats(h.components);
      w.Floats(h.variance);
    }
  }
  w.Int(static_cast<uint64_t>(XXH3_64bits(out.data(), out.size())));
  return out;
}

Expected<KvTransforms> ParseKvTransforms(std::span<const uint8_t> bytes, const Digest128& key,
                                         const KvGeometry& g) {
  if (bytes.size() < sizeof(kBasisMagic) + 8) return Status::Error("basis file: truncated");
  const std::span<const uint8_t> body = bytes.first(bytes.size() - 8);
  const uint64_t checksum = LoadLittleEndian<uint64_t>(bytes.data() + bytes.size() - 8);
  if (XXH3_64bits(body.data(), body.size()) != checksum) {
    return Status::Error("basis file: checksum mismatch");
  }
  if (std::memcmp(body.data(), kBasisMagic, sizeof(kBasisMagic)) != 0) {
    return Status::Error("basis file: bad magic");
  }
  ByteReader r(body.subspan(sizeof(kBasisMagic)));
  uint32_t version = 0;
  KvTransforms t;
  if (!r.Int(&version) || version != kBasisVersion) {
    return Status::Error("basis file: another version");
  }
  if (!r.Int(&t.key.lo) || !r.Int(&t.key.hi) || !(t.key == key)) {
    return Status::Error("basis file: fitted for another model, KV format or calibration");
  }
  if (!r.Int(&t.n_layer) || !r.Int(&t.n_head_kv) || !r.Int(&t.head_dim_k) ||
      !r.Int(&t.head_dim_v) || !r.Int(&t.n_samples) || t.n_layer != g.n_layer ||
      t.n_head_kv != g.n_head_kv || t.head_dim_k != g.head_dim_k || t.head_dim_v != g.head_dim_v) {
    return Status::Error("basis file: another geometry");
  }
  const size_t n_heads = static_cast<size_t>(t.n_layer) * t.n_head_kv;
  for (auto [heads, d] : {std::pair{&t.keys, t.head_dim_k}, std::pair{&t.values, t.head_dim_v}}) {
    heads->resize(n_heads);
    for (HeadTransform& h : *heads) {
      h.dim = d;
      const size_t n = static_cast<size_t>(d);
      if (!r.Floats(&h.mean, n) || !r.Floats(&h.components, n * n) || !r.Floats(&h.variance, n)) {
        return Status::Error("basis file: truncated");
      }
      for (float x : h.variance) {
        if (!(x >= 0) || !std::isfinite(x)) return Status::Error("basis file: bad variance");
      }
      for (const auto* vec : {&h.mean, &h.components}) {
        for (float x : *vec) {
          if (!std::isfinite(x)) return Status::Error("basis file: a value is not finite");
        }
      }
    }
  }
  if (sizeof(kBasisMagic) + r.pos() != body.size())
    return Status::Error("basis file: trailing bytes");
  t.digest = BasisBodyDigest(body);
  return t;
}

Expected<std::shared_ptr<const KvTransforms>> LoadOrFitKvTransforms(
    const Model& model, ThreadPool& pool, const KvFormat& format,
    const std::vector<int32_t>& tokens, const std::string& dir, CalibrationRuns* runs) {
  const Digest128 key = KvTransformKey(model.weights_digest(), format, tokens);
  const std::string name = "tc-" + key.Hex() + ".basis";
  const KvGeometry g = ModelKvGeometry(model.config(), kKvBlockTokens);
  if (!dir.empty()) {
    const std::string path = dir + "/" + name;
    std::error_code ec;
    auto bytes = ReadBlockFileBytes(path);
    if (!bytes.ok() &&
        std::filesystem::symlink_status(path, ec).type() != std::filesystem::file_type::not_found) {
      // There, but not a readable regular file (a directory, a FIFO, a link, no permission).
      KVS_LOG_WARN("kv codec: %s unusable (%s): fitting again", path.c_str(),
                   bytes.error().c_str());
    }
    if (bytes.ok()) {
      auto t = ParseKvTransforms(*bytes, key, g);
      if (t.ok()) {
        KVS_LOG_INFO("kv codec: transform basis %s/%s (%lld calibration positions per head)",
                     dir.c_str(), name.c_str(), static_cast<long long>(t->n_samples));
        return std::make_shared<const KvTransforms>(std::move(*t));
      }
      KVS_LOG_WARN("kv codec: %s/%s unusable (%s): fitting again", dir.c_str(), name.c_str(),
                   t.error().c_str());
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int32_t n_ctx_train = model.config().n_ctx_train;
  const int32_t chunk = std::min<int32_t>(512, n_ctx_train > 0 ? n_ctx_train : 512);
  auto t = FitKvTransforms(model, pool, tokens, chunk, key, runs);
  if (!t.ok()) return t.status();
  const int32_t min_samples = 4 * std::max(g.head_dim_k, g.head_dim_v);
  KVS_LOG_INFO("kv codec: fitted the transform basis on %lld positions per head in %.1f s",
               static_cast<long long>(t->n_samples),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (t->n_samples < min_samples) {
    KVS_LOG_WARN(
        "kv codec: %lld calibration positions fit a basis of %d dims poorly: give "
        "--kv-calibration FILE (and --kv-calibration-tokens) with at least %d tokens",
        static_cast<long long>(t->n_samples), std::max(g.head_dim_k, g.head_dim_v),
        min_samples + 1);
  }
  if (!dir.empty()) {
    if (Status st = WriteFileAtomically(dir, name, SerializeKvTransforms(*t)); !st.ok()) {
      KVS_LOG_WARN("kv codec: could not save the basis (%s): it is fitted again at start-up",
                   st.message().c_str());
    }
  }
  return std::make_shared<const KvTransforms>(std::move(*t));
}

}  // namespace kvs
