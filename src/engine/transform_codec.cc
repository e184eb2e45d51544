#include "engine/transform_codec.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/byte_io.h"
#include "kernels/attention.h"
#include "kernels/kv_layer.h"
#include "kernels/ops.h"
#include "kv/kv_storage.h"
#include "tensor/dtype.h"

namespace kvs {
namespace {

constexpr uint8_t kPayloadMagic[4] = {'K', 'V', 'T', 'C'};
constexpr uint8_t kPayloadVersion = 1;
constexpr uint8_t kFlagZstd = 1;
constexpr size_t kPayloadHeaderBytes = 4 + 1 + 1 + 2 + 16 + 4 + 4;

// Positions of a block at first_position that are sinks (stored as f16), a prefix of the block.
int32_t PayloadSinkCount(int32_t first_position, int32_t sink_tokens, int32_t block_size) {
  return std::clamp(sink_tokens - first_position, 0, block_size);
}

}  // namespace

Expected<TransformCodecOptions> ParseTransformCodec(const std::string& spec) {
  TransformCodecOptions o;
  if (spec.rfind("tc:", 0) != 0) {
    return Status::Error("codec " + spec + ": a transform codec is tc:BITS[,sink=N]");
  }
  std::string rest = spec.substr(3);
  std::string bits = rest.substr(0, rest.find(','));
  // A plain decimal (digits and at most one point): no signs, spaces, exponents or hex.
  const bool decimal = !bits.empty() &&
                       bits.find_first_not_of("0123456789.") == std::string::npos &&
                       std::count(bits.begin(), bits.end(), '.') <= 1 && bits != ".";
  char* end = nullptr;
  o.bits = decimal ? std::strtod(bits.c_str(), &end) : 0.0;
  if (!decimal || end != bits.c_str() + bits.size() || !(o.bits > 0) ||
      o.bits > kMaxTransformBits) {
    return Status::Error(StrFormat("codec %s: bits per element must be a number in (0, %d]",
                                   spec.c_str(), kMaxTransformBits));
  }
  bool sink_given = false;
  for (size_t at = rest.find(','); at != std::string::npos;) {
    const size_t next = rest.find(',', at + 1);
    const std::string opt = rest.substr(at + 1, next == std::string::npos ? next : next - at - 1);
    at = next;
    if (opt.rfind("sink=", 0) == 0) {
      const std::string n = opt.substr(5);
      if (sink_given) return Status::Error("codec " + spec + ": sink= given twice");
      sink_given = true;
      char* e = nullptr;
      const long v = n.find_first_not_of("0123456789") == std::string::npos && n.size() <= 5
                         ? std::strtol(n.c_str(), &e, 10)
                         : -1;
      if (n.empty() || v < 0 || v > 1024) {
        return Status::Error("codec " + spec + ": sink=N takes 0..1024 positions");
      }
      o.sink_tokens = static_cast<int32_t>(v);
    } else {
      return Status::Error("codec " + spec + ": unknown option '" + opt + "' (known: sink=N)");
    }
  }
  return o;
}

std::string TransformCodecName(const TransformCodecOptions& o) {
  std::string bits = StrFormat("%g", o.bits);
  std::string name = "tc:" + bits;
  if (o.sink_tokens != TransformCodecOptions{}.sink_tokens) {
    name += StrFormat(",sink=%d", o.sink_tokens);
  }
  return name;
}

Expected<std::shared_ptr<TransformCodec>> TransformCodec::Make(
    KvFormatPtr format, std::shared_ptr<const KvTransforms> fit,
    const TransformCodecOptions& options) {
  const KvGeometry& g = format->geometry();
  if (fit->n_layer != g.n_layer || fit->n_head_kv != g.n_head_kv ||
      fit->head_dim_k != g.head_dim_k || fit->head_dim_v != g.head_dim_v) {
    return Status::Error("transform codec: the fit is of another geometry");
  }
  if (!(options.bits > 0) || options.bits > kMaxTransformBits) {
    return Status::Error("transform codec: bits per element out of range");
  }
  const int32_t min_dim = std::min(g.head_dim_k, g.head_dim_v);
  if (std::llround(options.bits * min_dim) < 1) {
    return Status::Error(StrFormat(
        "transform codec tc:%g: that gives a vector of %d dims no bits at all (only its mean "
        "would be stored); give at least tc:%.3g",
        options.bits, min_dim, 1.0 / min_dim));
  }
  std::shared_ptr<TransformCodec> c(new TransformCodec);
  c->format_ = std::move(format);
  c->fit_ = std::move(fit);
  c->options_ = options;
  const size_t n_heads = static_cast<size_t>(g.n_layer) * g.n_head_kv;
  c->layer_code_offset_.assign(1, 0);
  for (size_t h = 0; h < n_heads; ++h) {
    c->keys_.push_back(MakeHeadCode(c->fit_->keys[h], options.bits));
    c->values_.push_back(MakeHeadCode(c->fit_->values[h], options.bits));

    if ((h + 1) % g.n_head_kv == 0) {
      size_t per_position = 0;
      for (size_t k = h + 1 - g.n_head_kv; k <= h; ++k) {
        per_position += c->keys_[k].n_coded + c->values_[k].n_coded;
      }
      c->layer_code_offset_.push_back(c->layer_code_offset_.back() + per_position);
    }
  }
  // The allocation itself, not the budget it came from: two budgets that round to different
  // allocations must not share a digest.
  DigestBuilder digest;
  digest.Text("kvserve transform codec")
      .Int(kPayloadVersion)
      .Add(c->fit_->digest)
      .Int(options.sink_tokens)
      .Add(c->format_->fingerprint());
  for (size_t h = 0; h < n_heads; ++h) {
    for (const HeadCode* code : {&c->keys_[h], &c->values_[h]}) {
      digest.Bytes(code->bits.data(), code->bits.size());
      digest.Bytes(code->step.data(), code->step.size() * sizeof(float));
    }
  }
  c->fit_digest_ = digest.Finish();
  if (options.decode_threads > 1) {
    c->decode_pool_ = std::make_unique<ThreadPool>(options.decode_threads);
  }
  return c;
}

std::string TransformCodec::name() const {
  return TransformCodecName(options_);
}

double TransformCodec::allocated_bits_per_element() const {
  double bits = 0, elements = 0;
  for (size_t h = 0; h < keys_.size(); ++h) {
    bits += keys_[h].total_bits() + values_[h].total_bits();
    elements += keys_[h].dim + values_[h].dim;
  }
  return elements > 0 ? bits / elements : 0;
}

void TransformCodec::Views(uint8_t* block, const float* rope_table,
                           std::vector<KvLayerView>* views) const {
  const KvGeometry& g = format_->geometry();
  views->clear();
  size_t at = 0;
  const size_t m = static_cast<size_t>(g.block_size / kKvBlockTokens);
  for (int32_t l = 0; l < g.n_layer; ++l) {
    KvLayerView v = KvLayerViewOf(*format_, l);
    v.k = block + at;
    at += m * v.k_block_stride();
    v.v = block + at;
    at += m * v.v_block_stride();
    v.rope_table = rope_table;
    v.rope_positions = g.block_size;
    views->push_back(v);
  }
}

void TransformCodec::FillRope(int32_t first_position, std::vector<float>* cos_sin,
                              std::vector<float>* table) const {
  const KvRope& r = format_->rope();
  const int32_t bs = format_->block_size(), n_rot = r.n_rot;
  const RopeParams rope{n_rot, r.freq_base, r.freq_scale, r.neox,
                        r.freq_factors.empty() ? nullptr : r.freq_factors.data()};
  cos_sin->resize(static_cast<size_t>(bs) * n_rot);
  // The table (attention.h's layout) of the block's positions, row j for slot j: what WriteKv
  // and ReadKv look a slot's RoPE up in.
  table->assign(static_cast<size_t>(bs) * n_rot, 0.0f);
  for (int32_t j = 0; j < bs; ++j) {
    float* cs = cos_sin->data() + static_cast<size_t>(j) * n_rot;
    RopeAngles(first_position + j, rope, cs);
    float* tb = table->data() + static_cast<size_t>(j / kKvBlockTokens) * n_rot * kKvBlockTokens;
    for (int32_t i = 0; i < n_rot; ++i) tb[i * kKvBlockTokens + j % kKvBlockTokens] = cs[i];
  }
}

Expected<std::vector<uint8_t>> TransformCodec::Encode(std::span<const uint8_t> block,
                                                      int32_t first_position) const {
  const KvGeometry& g = format_->geometry();
  if (block.size() != g.BytesPerBlock()) {
    return Status::Error("transform codec: not a block of this format");
  }
  if (first_position < 0) return Status::Error("transform codec: negative position");
  const int32_t bs = g.block_size, H = g.n_head_kv, dk = g.head_dim_k, dv = g.head_dim_v;
  const int32_t n_rot = format_->rope().n_rot;
  const bool neox = format_->rope().neox;
  const int32_t n_sink = PayloadSinkCount(first_position, options_.sink_tokens, bs);
  const int32_t n = bs - n_sink;  // coded positions
  std::vector<float> cos_sin, table;
  FillRope(first_position, &cos_sin, &table);
  std::vector<KvLayerView> views;
  Views(const_cast<uint8_t*>(block.data()), table.data(), &views);  // read only
  std::vector<float> k(static_cast<size_t>(bs) * H * dk), v(static_cast<size_t>(bs) * H * dv);
  std::vector<float> xk(static_cast<size_t>(n) * dk), xv(static_cast<size_t>(n) * dv);
  std::vector<uint16_t> sinks;
  std::vector<uint8_t> codes, head_codes;
  codes.reserve(layer_code_offset_.back() * n);
  std::vector<float> back(n_rot);
  for (int32_t l = 0; l < g.n_layer; ++l) {
    for (int32_t j = 0; j < bs; ++j) {
      float* kj = k.data() + static_cast<size_t>(j) * H * dk;
      ReadKv(views[l], j, j, kj, v.data() + static_cast<size_t>(j) * H * dv);
      // Keys before RoPE: turned back by their position.
      const float* cs = cos_sin.data() + static_cast<size_t>(j) * n_rot;
      std::copy(cs, cs + n_rot, back.begin());
      for (int32_t i = n_rot / 2; i < n_rot; ++i) back[i] = -back[i];
      for (int32_t h = 0; h < H; ++h)
        ApplyRope(kj + static_cast<size_t>(h) * dk, back.data(), n_rot, neox);
    }
    for (int32_t h = 0; h < H; ++h) {
      const size_t head = static_cast<size_t>(l) * H + h;
      for (int32_t j = 0; j < n; ++j) {
        const float* src_k = k.data() + (static_cast<size_t>(n_sink + j) * H + h) * dk;
        const float* src_v = v.data() + (static_cast<size_t>(n_sink + j) * H + h) * dv;
        std::copy(src_k, src_k + dk, xk.data() + static_cast<size_t>(j) * dk);
        std::copy(src_v, src_v + dv, xv.data() + static_cast<size_t>(j) * dv);
      }
      for (const auto& [code, x] : {std::pair{&keys_[head], &xk}, std::pair{&values_[head], &xv}}) {
        head_codes.resize(static_cast<size_t>(code->n_coded) * n);
        if (n > 0) EncodeHeadVectors(*code, x->data(), n, head_codes.data());
        codes.insert(codes.end(), head_codes.begin(), head_codes.end());
      }
    }
    // Sink vectors of this layer, f16: [sink j][head][K dk, V dv].
    for (int32_t j = 0; j < n_sink; ++j) {
      for (int32_t h = 0; h < H; ++h) {
        const float* sk = k.data() + (static_cast<size_t>(j) * H + h) * dk;
        const float* sv = v.data() + (static_cast<size_t>(j) * H + h) * dv;
        for (int32_t d = 0; d < dk; ++d) sinks.push_back(F32ToF16(sk[d]));
        for (int32_t d = 0; d < dv; ++d) sinks.push_back(F32ToF16(sv[d]));
      }
    }
  }
  return Payload(codes, sinks, n, n_sink, first_position);
}

std::vector<uint8_t> TransformCodec::Payload(const std::vector<uint8_t>& codes,
                                             const std::vector<uint16_t>& sinks, int32_t n,
                                             int32_t n_sink, int32_t first_position) const {
  // Pack the codes at their bits, and try zstd over the byte codes: keep the smaller.
  std::vector<uint8_t> packed;
  {
    size_t at = 0;
    for (size_t head = 0; head < keys_.size(); ++head) {
      for (const HeadCode* code : {&keys_[head], &values_[head]}) {
        if (n > 0) PackCodes(*code, codes.data() + at, n, &packed);
        at += static_cast<size_t>(code->n_coded) * n;
      }
    }
  }
  std::vector<uint8_t> zstd(ZSTD_compressBound(codes.size()));
  const size_t z =
      ZSTD_compress(zstd.data(), zstd.size(), codes.data(), codes.size(), options_.zstd_level);
  const bool use_zstd = !ZSTD_isError(z) && z < packed.size();
  const std::span<const uint8_t> body =
      use_zstd ? std::span<const uint8_t>(zstd.data(), z) : std::span<const uint8_t>(packed);
  (use_zstd ? zstd_blocks_ : packed_blocks_)++;

  std::vector<uint8_t> out;
  out.reserve(kPayloadHeaderBytes + sinks.size() * 2 + body.size());
  ByteWriter w(&out);
  w.Bytes(kPayloadMagic, 4);
  w.Int(kPayloadVersion);
  w.Int(static_cast<uint8_t>(use_zstd ? kFlagZstd : 0));
  w.Int(static_cast<uint16_t>(n_sink));
  w.Int(fit_digest_.lo);
  w.Int(fit_digest_.hi);
  w.Int(static_cast<uint32_t>(first_position));
  w.Int(static_cast<uint32_t>(body.size()));
  for (uint16_t s : sinks) w.Int(s);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

void TransformCodec::DecodeLayer(int32_t l, const KvLayerView& view, const uint8_t* codes,
                                 size_t n_codes_before, const uint16_t* sinks, int32_t n_sink,
                                 const float* cos_sin) const {
  const KvGeometry& g = format_->geometry();
  const int32_t bs = g.block_size, H = g.n_head_kv, dk = g.head_dim_k, dv = g.head_dim_v;
  const int32_t n_rot = format_->rope().n_rot;
  const bool neox = format_->rope().neox;
  const int32_t n = bs - n_sink;
  thread_local std::vector<float> k, v, xk, xv;
  k.resize(static_cast<size_t>(bs) * H * dk);
  v.resize(static_cast<size_t>(bs) * H * dv);
  xk.resize(static_cast<size_t>(std::max(n, 1)) * dk);
  xv.resize(static_cast<size_t>(std::max(n, 1)) * dv);
  const uint8_t* at = codes + n_codes_before;
  for (int32_t h = 0; h < H; ++h) {
    const size_t head = static_cast<size_t>(l) * H + h;
    DecodeHeadVectors(keys_[head], at, n, xk.data());
    at += static_cast<size_t>(keys_[head].n_coded) * n;
    DecodeHeadVectors(values_[head], at, n, xv.data());
    at += static_cast<size_t>(values_[head].n_coded) * n;
    for (int32_t j = 0; j < n; ++j) {
      std::copy_n(xk.data() + static_cast<size_t>(j) * dk, dk,
                  k.data() + (static_cast<size_t>(n_sink + j) * H + h) * dk);
      std::copy_n(xv.data() + static_cast<size_t>(j) * dv, dv,
                  v.data() + (static_cast<size_t>(n_sink + j) * H + h) * dv);
    }
  }
  // Sinks: [layer][sink j][head][K, V] f16.
  const size_t per_sink_layer = static_cast<size_t>(H) * (dk + dv);
  for (int32_t j = 0; j < n_sink; ++j) {
    const uint16_t* s = sinks + (static_cast<size_t>(l) * n_sink + j) * per_sink_layer;
    for (int32_t h = 0; h < H; ++h) {
      for (int32_t d = 0; d < dk; ++d)
        k[(static_cast<size_t>(j) * H + h) * dk + d] = F16ToF32(*s++);
      for (int32_t d = 0; d < dv; ++d)
        v[(static_cast<size_t>(j) * H + h) * dv + d] = F16ToF32(*s++);
    }
  }
  for (int32_t j = 0; j < bs; ++j) {
    float* kj = k.data() + static_cast<size_t>(j) * H * dk;
    for (int32_t h = 0; h < H; ++h) {
      ApplyRope(kj + static_cast<size_t>(h) * dk, cos_sin + static_cast<size_t>(j) * n_rot, n_rot,
                neox);
    }
    WriteKv(view, j, j, kj, v.data() + static_cast<size_t>(j) * H * dv);
  }
}

bool TransformCodec::OtherFit(std::span<const uint8_t> payload) const {
  if (payload.size() < kPayloadHeaderBytes || std::memcmp(payload.data(), kPayloadMagic, 4) != 0) {
    return false;
  }
  const uint8_t* p = payload.data();
  const Digest128 fit{LoadLittleEndian<uint64_t>(p + 8), LoadLittleEndian<uint64_t>(p + 16)};
  return p[4] != kPayloadVersion || !(fit == fit_digest_);
}

std::vector<size_t> TransformCodec::PackedLayerOffsets(int32_t n) const {
  const KvGeometry& g = format_->geometry();
  // Whole bytes per head (UnpackCodes').
  std::vector<size_t> packed_at(g.n_layer + 1, 0);
  for (int32_t l = 0; l < g.n_layer; ++l) {
    size_t bytes = 0;
    for (int32_t h = 0; h < g.n_head_kv; ++h) {
      const size_t head = static_cast<size_t>(l) * g.n_head_kv + h;
      for (const HeadCode* code : {&keys_[head], &values_[head]})
        bytes += (static_cast<size_t>(code->total_bits()) * n + 7) / 8;
    }
    packed_at[l + 1] = packed_at[l] + bytes;
  }
  return packed_at;
}

bool TransformCodec::LayerCodes(size_t l, int32_t n, bool zstd, std::span<const uint8_t> body,
                                const std::vector<size_t>& packed_at, uint8_t* codes) const {
  const int32_t H = format_->geometry().n_head_kv;
  uint8_t* out = codes + layer_code_offset_[l] * n;
  size_t in = packed_at[l];
  bool ok = true;
  for (int32_t h = 0; h < H && n > 0; ++h) {
    const size_t head = l * H + h;
    for (const HeadCode* code : {&keys_[head], &values_[head]}) {
      const size_t count = static_cast<size_t>(code->n_coded) * n;
      if (zstd) {
        for (size_t i = 0; i < static_cast<size_t>(code->n_coded); ++i) {
          const uint8_t max = static_cast<uint8_t>((1u << code->bits[i]) - 1);
          for (int32_t j = 0; j < n; ++j) ok = ok && out[i * n + j] <= max;
        }
      } else {
        size_t used = 0;
        if (!UnpackCodes(*code, body.subspan(in, packed_at[l + 1] - in), n, out, &used)) {
          return false;
        }
        in += used;
      }
      out += count;
    }
  }
  return ok;
}

Status TransformCodec::Decode(std::span<const uint8_t> payload, std::vector<uint8_t>* block) const {
  const KvGeometry& g = format_->geometry();
  if (payload.size() < kPayloadHeaderBytes || std::memcmp(payload.data(), kPayloadMagic, 4) != 0) {
    return Status::Error("transform payload: bad magic or truncated");
  }
  const uint8_t* p = payload.data();
  if (p[4] != kPayloadVersion) {
    return Status::Error(
        StrFormat("transform payload: version %u, this build reads %u", p[4], kPayloadVersion));
  }
  const uint8_t flags = p[5];
  const int32_t n_sink = LoadLittleEndian<uint16_t>(p + 6);
  const Digest128 fit{LoadLittleEndian<uint64_t>(p + 8), LoadLittleEndian<uint64_t>(p + 16)};
  const int32_t first_position = static_cast<int32_t>(LoadLittleEndian<uint32_t>(p + 24));
  const uint32_t body_bytes = LoadLittleEndian<uint32_t>(p + 28);
  if (!(fit == fit_digest_)) {
    return Status::Error(
        "transform payload: coded with another fit (model, calibration, bits or version)");
  }
  // A block starts at a multiple of the block size (Encode is only given such positions).
  if ((flags & ~kFlagZstd) != 0 || first_position < 0 || first_position % g.block_size != 0 ||
      n_sink != PayloadSinkCount(first_position, options_.sink_tokens, g.block_size)) {
    return Status::Error("transform payload: malformed header");
  }
  const size_t sink_halves =
      static_cast<size_t>(n_sink) * g.n_layer * g.n_head_kv * (g.head_dim_k + g.head_dim_v);
  if (payload.size() != kPayloadHeaderBytes + 2 * sink_halves + body_bytes) {
    return Status::Error("transform payload: sizes disagree with its length");
  }
  std::vector<uint16_t> sinks(sink_halves);
  const uint8_t* s = p + kPayloadHeaderBytes;
  for (size_t i = 0; i < sink_halves; ++i)
    sinks[i] = static_cast<uint16_t>(s[2 * i] | s[2 * i + 1] << 8);
  const std::span<const uint8_t> body = payload.subspan(kPayloadHeaderBytes + 2 * sink_halves);
  const int32_t n = g.block_size - n_sink;
  const size_t n_codes = layer_code_offset_.back() * n;
  std::vector<uint8_t> codes(n_codes);
  const bool zstd = (flags & kFlagZstd) != 0;
  const std::vector<size_t> packed_at = PackedLayerOffsets(n);
  if (zstd) {
    const size_t got = ZSTD_decompress(codes.data(), codes.size(), body.data(), body.size());
    if (ZSTD_isError(got) || got != n_codes) {
      return Status::Error("transform payload: the codes do not decompress to their size");
    }
  } else if (packed_at.back() != body.size()) {
    return Status::Error(body.size() < packed_at.back() ? "transform payload: truncated codes"
                                                        : "transform payload: trailing bytes");
  }
  block->assign(g.BytesPerBlock(), 0);
  std::vector<float> cos_sin, table;
  FillRope(first_position, &cos_sin, &table);
  std::vector<KvLayerView> views;
  Views(block->data(), table.data(), &views);
  // Each layer's codes are unpacked (or, zstd's, range-checked) by the thread that decodes it.
  std::atomic<bool> bad_codes{false};
  const auto run = [&](int, size_t begin, size_t end) {
    for (size_t l = begin; l < end; ++l) {
      if (!LayerCodes(l, n, zstd, body, packed_at, codes.data())) {
        bad_codes.store(true, std::memory_order_relaxed);
        return;
      }
      if (bad_codes.load(std::memory_order_relaxed)) return;
      DecodeLayer(static_cast<int32_t>(l), views[l], codes.data(), layer_code_offset_[l] * n,
                  sinks.data(), n_sink, cos_sin.data());
    }
  };
  std::unique_lock<std::mutex> lock(decode_mu_, std::try_to_lock);
  if (decode_pool_ && lock.owns_lock()) {
    decode_pool_->ParallelFor(g.n_layer, 1, run);
  } else {
    run(0, 0, g.n_layer);
  }
  if (bad_codes.load()) return Status::Error("transform payload: codes out of range");
  return Status::Ok();
}

}  // namespace kvs
