// The seams of issue #17: the KV format's fingerprint covers what changes stored bytes (the
// calibration among them), the prefix-cache key covers the weights, and keys moved to other
// slots give the same attention once their positions travel with them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "engine/kv_format_factory.h"
#include "gguf/gguf_reader.h"
#include "kernels/attention.h"
#include "kernels/kv_layer.h"
#include "kv/kv_storage.h"
#include "model/forward.h"
#include "model/weights.h"
#include "testing/random.h"
#include "testing/tiny_model.h"

namespace kvs {
namespace {

std::unique_ptr<Model> LoadBytes(std::vector<uint8_t> bytes) {
  auto file = gguf::File::FromBytes(std::move(bytes));
  EXPECT_TRUE(file.ok()) << file.error();
  auto model = Model::FromFile(std::move(*file));
  EXPECT_TRUE(model.ok()) << model.error();
  return std::move(*model);
}

KvFormatPtr Format(const Model& model, ThreadPool& pool, KvTypes types,
                   std::vector<int32_t> calibration = {}, int32_t n_ctx = 512,
                   int32_t block_size = 16) {
  KvFormatOptions o;
  o.types = types;
  o.n_ctx = n_ctx;
  o.block_size = block_size;
  o.calibration_tokens = std::move(calibration);
  auto f = MakeKvFormat(model, nullptr, pool, o);
  EXPECT_TRUE(f.ok()) << f.error();
  return *f;
}

std::vector<int32_t> Tokens(int32_t n, int32_t seed) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = 1 + (i * 37 + seed * 101) % (testing::kTinyVocab - 1);
  return t;
}

TEST(WeightsDigest, OneChangedByteChangesTheDigestAndThePrefixCacheKey) {
  testing::TinyModelSpec spec;
  const std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  // One byte of one weight matrix, well inside the tensor data.
  auto file = gguf::File::FromBytes(bytes);
  ASSERT_TRUE(file.ok());
  const gguf::TensorInfo* t = (*file)->FindTensor("blk.1.ffn_up.weight");
  ASSERT_NE(t, nullptr);
  const size_t at = static_cast<size_t>(t->data - (*file)->bytes()) + t->n_bytes / 2;
  std::vector<uint8_t> changed = bytes;
  changed[at] ^= 0x01;

  auto a = LoadBytes(bytes), a2 = LoadBytes(bytes), b = LoadBytes(changed);
  EXPECT_EQ(a->weights_digest(), a2->weights_digest());  // a function of the bytes alone
  EXPECT_FALSE(a->weights_digest() == b->weights_digest());

  ThreadPool pool(2);
  const KvFormatPtr fa = Format(*a, pool, {KvType::kF16, KvType::kF16});
  const KvFormatPtr fb = Format(*b, pool, {KvType::kF16, KvType::kF16});
  ASSERT_EQ(fa->fingerprint(), fb->fingerprint());  // same shapes and types: only weights differ
  EXPECT_EQ(ModelCacheKey(a->weights_digest(), *fa, ""),
            ModelCacheKey(a2->weights_digest(), *fa, ""));
  EXPECT_FALSE(ModelCacheKey(a->weights_digest(), *fa, "") ==
               ModelCacheKey(b->weights_digest(), *fb, ""));
  EXPECT_FALSE(ModelCacheKey(a->weights_digest(), *fa, "") ==
               ModelCacheKey(a->weights_digest(), *fa, "salt"));
  // The digest is of the file as read: repacking in place (read mode) does not move it, and
  // mapping the same file gives the same digest.
  const std::string path = testing::WriteTinyModel(spec, "digest_model");
  auto mapped = Model::Load(path, {.mode = gguf::LoadMode::kMap});
  auto read = Model::Load(path, {.mode = gguf::LoadMode::kRead});
  ASSERT_TRUE(mapped.ok() && read.ok());
  EXPECT_EQ((*mapped)->weights_digest(), a->weights_digest());
  EXPECT_EQ((*read)->weights_digest(), a->weights_digest());
}

TEST(KvFormat, FingerprintCoversCalibrationContextBlockSizeAndTypes) {
  testing::TinyModelSpec spec;  // head_dim 16: turbo keys are whitened
  auto model = LoadBytes(testing::MakeTinyModel(spec));
  ThreadPool pool(2);
  const std::vector<int32_t> text_a = Tokens(40, 1), text_b = Tokens(40, 2);
  for (KvType k : {KvType::kQ8_0, KvType::kQ4_0, KvType::kTurbo4, KvType::kTurbo3}) {
    SCOPED_TRACE(std::string(KvTypeName(k)));
    const KvTypes types{k, KvType::kF16};
    const KvFormatPtr a = Format(*model, pool, types, text_a);
    EXPECT_NE(a->key_coding_kind(), KeyCodingKind::kPlain);
    EXPECT_EQ(Format(*model, pool, types, text_a)->fingerprint(), a->fingerprint());
    EXPECT_FALSE(Format(*model, pool, types, text_b)->fingerprint() == a->fingerprint());
    EXPECT_FALSE(Format(*model, pool, types, text_a, 512, 32)->fingerprint() == a->fingerprint());
    EXPECT_FALSE(Format(*model, pool, {k, KvType::kQ8_0}, text_a)->fingerprint() ==
                 a->fingerprint());
    // Only a constant offset depends on the context it is averaged over.
    const bool by_context = a->key_coding_kind() == KeyCodingKind::kConstantOffset;
    EXPECT_EQ(Format(*model, pool, types, text_a, 1024)->fingerprint() == a->fingerprint(),
              !by_context);
  }
  // An unquantized K type is not calibrated: the text does not matter.
  EXPECT_EQ(Format(*model, pool, {KvType::kF16, KvType::kF16}, text_a)->fingerprint(),
            Format(*model, pool, {KvType::kF16, KvType::kF16}, text_b)->fingerprint());
}

// Keys moved to other slots, their positions with them, give the same attention output for every
// KV type: a cache written at positions 0..63 with its second block of 16 evicted and the rest
// moved down (the kernel-block copy compaction will use) equals, bit for bit, a cache written
// with only the kept positions, and both stay as close to f32 attention over the kept keys as the
// type is when positions equal slots.
TEST(KvPositions, KeysMovedToOtherSlotsGiveTheSameAttention) {
  constexpr int32_t kHeads = 2, kAll = 64;
  std::vector<int32_t> kept;  // positions 0..15 and 32..63
  for (int32_t p = 0; p < kAll; ++p) {
    if (p < 16 || p >= 32) kept.push_back(p);
  }
  const int32_t n_kept = static_cast<int32_t>(kept.size());
  for (int32_t hd : {8, 64}) {
    const KvRope rope{hd, 10000.f, 1.f, false, {}};
    const RopeParams rope_params{hd, 10000.f, 1.f, false, nullptr};
    // Keys before RoPE: a large common part plus noise, as trained models have.
    const std::vector<float> mean = testing::GaussianVector(kHeads * hd, 3, 4.0f);
    std::vector<float> pre = testing::GaussianVector(static_cast<size_t>(kAll) * kHeads * hd, 5);
    for (size_t i = 0; i < pre.size(); ++i) pre[i] += mean[i % (kHeads * hd)];
    std::vector<float> keys = pre, cos_sin(hd);  // after RoPE, each at its position
    for (int32_t p = 0; p < kAll; ++p) {
      RopeAngles(p, rope_params, cos_sin.data());
      for (int32_t h = 0; h < kHeads; ++h) {
        ApplyRope(keys.data() + (static_cast<size_t>(p) * kHeads + h) * hd, cos_sin.data(), hd,
                  false);
      }
    }
    const std::vector<float> values =
        testing::GaussianVector(static_cast<size_t>(kAll) * kHeads * hd, 7);
    auto key_of = [&](int32_t p) { return keys.data() + static_cast<size_t>(p) * kHeads * hd; };
    auto value_of = [&](int32_t p) { return values.data() + static_cast<size_t>(p) * kHeads * hd; };
    const int32_t n_queries = 6;
    const std::vector<float> queries = testing::GaussianVector(n_queries * hd, 11, 0.5f);
    const int32_t n_keys[n_queries] = {1, 15, 16, 17, 33, n_kept};

    for (KvType t : kAllKvTypes) {
      const KvGeometry g{1, kHeads, hd, hd, 16, t, t};
      if (!g.Validate().ok()) continue;
      SCOPED_TRACE(std::string(KvTypeName(t)) + " head_dim " + std::to_string(hd));
      // The coding a calibrated format of this type has, fitted on the keys themselves.
      KeyCoding coding;
      switch (KeyCodingKindFor(t, hd)) {
        case KeyCodingKind::kPlain:
          break;
        case KeyCodingKind::kConstantOffset:
        case KeyCodingKind::kRopeOffset:
          coding.offsets = mean;
          break;
        case KeyCodingKind::kWhitened:
          for (int32_t h = 0; h < kHeads; ++h) {
            coding.whitening.push_back(
                FitKeyWhitening(pre.data() + h * hd, kAll, static_cast<size_t>(kHeads) * hd, hd));
          }
          break;
      }
      auto format = KvFormat::Make(g, rope, coding, {});
      ASSERT_TRUE(format.ok()) << format.error();
      const std::vector<int32_t> blocks = {1, 2, 3, 4};  // kernel blocks, in table order
      auto slot = [&](int32_t i) { return static_cast<int64_t>(blocks[i / 16]) * 16 + i % 16; };
      KvStorage direct(*format, 5), moved(*format, 5),
          plain(PlainKvFormat({1, kHeads, hd, hd, 16, KvType::kF32, KvType::kF32}), 5);
      for (KvStorage* s : {&direct, &moved, &plain}) s->ReservePositions(kAll);
      for (int32_t i = 0; i < n_kept; ++i) {
        WriteKv(direct.layers()[0], slot(i), kept[i], key_of(kept[i]), value_of(kept[i]));
        WriteKv(plain.layers()[0], slot(i), kept[i], key_of(kept[i]), value_of(kept[i]));
      }
      for (int32_t p = 0; p < kAll; ++p) {
        WriteKv(moved.layers()[0], slot(p), p, key_of(p), value_of(p));
      }
      CopyKvBlocks(moved.layers()[0], 3, 2, 2);  // blocks 3 and 4 (positions 32..63) down one

      std::vector<float> rows;
      if (direct.layers()[0].NeedsRopeTable()) GatherKeyRope(direct.layers()[0], kept, &rows);
      const float* key_rope = rows.empty() ? nullptr : rows.data();
      const AttentionShape shape{hd, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
      auto attend = [&](const KvStorage& s, const float* rope_rows, bool reference) {
        std::vector<float> out(static_cast<size_t>(n_queries) * hd);
        for (int32_t h = 0; h < kHeads; ++h) {
          std::vector<const float*> q(n_queries);
          std::vector<float*> o(n_queries);
          std::vector<float> head_out(out.size());
          for (int32_t i = 0; i < n_queries; ++i) {
            q[i] = queries.data() + static_cast<size_t>(i) * hd;
            o[i] = head_out.data() + static_cast<size_t>(i) * hd;
          }
          (reference ? &AttendReference : &Attend)(shape,
                                                   s.layers()[0].Head(h, blocks.data(), rope_rows),
                                                   q.data(), n_keys, n_queries, o.data(), nullptr);
          for (size_t i = 0; i < out.size(); ++i) out[i] += head_out[i];
        }
        return out;
      };
      auto max_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
        double m = 0;
        for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
        return m;
      };
      auto rms_diff = [](const std::vector<float>& a, const std::vector<float>& b) {
        double s = 0;
        for (size_t i = 0; i < a.size(); ++i) s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        return std::sqrt(s / a.size());
      };
      const std::vector<float> want = attend(plain, nullptr, true);
      const std::vector<float> got_direct = attend(direct, key_rope, false);
      const std::vector<float> got_moved = attend(moved, key_rope, false);
      EXPECT_EQ(0,
                std::memcmp(got_direct.data(), got_moved.data(), got_direct.size() * sizeof(float)))
          << "max difference " << max_diff(got_direct, got_moved);
      EXPECT_LT(max_diff(got_moved, attend(moved, key_rope, true)), 1e-3);  // the scalar twin

      // The type's own error where positions equal slots: keys 0..47 written in place.
      KvStorage in_place(*format, 5),
          in_place_plain(PlainKvFormat({1, kHeads, hd, hd, 16, KvType::kF32, KvType::kF32}), 5);
      for (KvStorage* s : {&in_place, &in_place_plain}) {
        s->ReservePositions(kAll);
        for (int32_t p = 0; p < n_kept; ++p) {
          WriteKv(s->layers()[0], slot(p), p, key_of(p), value_of(p));
        }
      }
      const double type_error =
          rms_diff(attend(in_place, nullptr, false), attend(in_place_plain, nullptr, true));
      const double moved_error = rms_diff(got_moved, want);
      EXPECT_LE(moved_error, 2.0 * type_error + 1e-6) << "type error " << type_error;
      // Without their positions, keys whose coding turns with RoPE are decoded wrong.
      if (key_rope != nullptr) {
        const double unplaced_error = rms_diff(attend(moved, nullptr, false), want);
        // (q4_0 and turbo4: 3-5x; turbo3 at head_dim 8, whose own error is large: 1.7x.)
        EXPECT_GT(unplaced_error, 1.5 * moved_error + 1e-3) << "moved " << moved_error;
      }
    }
  }
}

// The batch carries positions apart from slots: key positions given explicitly (here the same as
// the slots) change nothing, and a batch whose positions differ from its slots without saying
// where its keys are is refused for a key coding that depends on RoPE, not computed wrong.
TEST(KvPositions, TheForwardPassTakesKeyPositionsFromTheBatch) {
  auto model = LoadBytes(testing::MakeTinyModel({}));
  ThreadPool pool(2);
  const KvFormatPtr format = Format(*model, pool, {KvType::kTurbo4, KvType::kQ8_0}, Tokens(40, 1));
  ASSERT_EQ(format->key_coding_kind(), KeyCodingKind::kWhitened);
  const std::vector<int32_t> tokens = Tokens(24, 3);
  const int32_t n_vocab = model->config().n_vocab;
  std::vector<int32_t> identity(24);
  for (int32_t i = 0; i < 24; ++i) identity[i] = i;
  auto run = [&](std::vector<int32_t> key_positions, int32_t first_position, Status* status) {
    KvStorage storage(format, 3);
    storage.ReservePositions(64);
    ForwardPass forward(*model, pool);
    RaggedBatch batch;
    batch.AddSequence(tokens.data(), 24, 0, {1, 2}, 24, first_position, std::move(key_positions));
    std::vector<float> logits(24 * static_cast<size_t>(n_vocab));
    *status = forward.Run(batch, storage.layers(), logits.data());
    return logits;
  };
  Status st;
  const std::vector<float> implicit = run({}, 0, &st);
  ASSERT_TRUE(st.ok()) << st.message();
  const std::vector<float> explicit_positions = run(identity, 0, &st);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(implicit, explicit_positions);
  run({}, 5, &st);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("key positions"), std::string::npos) << st.message();
  std::vector<int32_t> wrong = identity;
  wrong[23] = 30;  // the last token's key at another position than the token
  run(wrong, 0, &st);
  EXPECT_FALSE(st.ok());
}

}  // namespace
}  // namespace kvs
