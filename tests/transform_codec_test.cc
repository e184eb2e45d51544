// The transform codec of the cold tiers (issue #23) with the real stories260K model: its error
// shrinks as its bits grow; a block it decodes loads into every pool KV type, and an engine
// restarted over a disk store of such blocks gives, token for token, the greedy output of the
// codec's own in-memory round trip (determinism); the fit is saved beside the store and reused,
// and a damaged fit file is refitted; and a payload of another fit, bit budget or KV format, a
// truncated one, or a reader without the codec is a miss, never a load.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "engine/key_offsets.h"
#include "engine/kv_transforms.h"
#include "engine/transform_codec.h"
#include "kv/block_file.h"
#include "testing/temp_dir.h"
#include "testing/test_models.h"
#include "testing/tier_engine.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;
using testing::Served;
using testing::TempDir;
using testing::TierEngine;

constexpr const char* kModel = "stories260K.gguf";
constexpr int32_t kBlock = 16;

// A prompt of 70 tokens (four full blocks, then a tail).
std::vector<int32_t> Prompt(const Model& model, int32_t seed = 0) {
  const int32_t vocab = model.config().n_vocab - 3;
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < 70; ++i) prompt.push_back(3 + (seed * 97 + i * 31 + i * i * 7) % vocab);
  return prompt;
}

// The tokens the engine builder fits the codec on when given no calibration text.
std::vector<int32_t> DefaultCalibration(const Model& model) {
  return KeyCalibrationTokens(nullptr, model.config().n_vocab);
}

TransformCodecOptions Bits(double bits) {
  TransformCodecOptions o;
  o.bits = bits;
  return o;
}

// One sequence of the model in a pool of these types, with a transform codec fitted on the
// default calibration (read from / saved in dir when given).
struct CodecSequence {
  CodecSequence(const Model& model, KvTypes types, double bits, const std::string& dir = "")
      : pool(2),
        builder(model, nullptr, pool, KvFormatWithTypes(types)),
        builder_vocab(model.config().n_vocab) {
    auto s = builder.Single(256);
    EXPECT_TRUE(s.ok()) << s.error();
    if (!s.ok()) return;
    seq = std::move(*s);
    auto f =
        LoadOrFitKvTransforms(model, pool, seq->storage().format(), DefaultCalibration(model), dir);
    EXPECT_TRUE(f.ok()) << f.error();
    if (!f.ok()) return;
    fit = *f;
    auto c = TransformCodec::Make(seq->storage().shared_format(), fit, Bits(bits));
    EXPECT_TRUE(c.ok()) << c.error();
    if (c.ok()) codec = *c;
  }
  bool ok() const { return codec != nullptr; }

  // Prefills prompt's full blocks, puts each through Encode and Decode in memory, computes the
  // tail and generates n greedy tokens.
  std::vector<int32_t> GreedyAfterRoundTrip(const std::vector<int32_t>& prompt, int32_t n) {
    const int32_t n_vocab = builder_vocab;
    const int32_t full = static_cast<int32_t>(prompt.size() - 1) / kBlock * kBlock;
    std::vector<float> logits(n_vocab);
    EXPECT_TRUE(seq->Run(prompt.data(), full, 0, 0, nullptr).ok());
    std::vector<uint8_t> block, decoded;
    for (int32_t b = 0; b < full / kBlock; ++b) {
      EXPECT_TRUE(seq->storage().ReadBlock(seq->pool_block(b), &block).ok());
      auto payload = codec->Encode(block, b * kBlock);
      EXPECT_TRUE(payload.ok()) << payload.error();
      EXPECT_TRUE(codec->Decode(*payload, &decoded).ok());
      EXPECT_TRUE(seq->mutable_storage().WriteBlock(seq->pool_block(b), decoded).ok());
    }
    std::vector<int32_t> out;
    EXPECT_TRUE(seq->Run(prompt.data() + full, static_cast<int32_t>(prompt.size()) - full, full, 1,
                         logits.data())
                    .ok());
    int32_t pos = static_cast<int32_t>(prompt.size());
    for (int32_t i = 0; i < n; ++i) {
      const int32_t next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      if (i + 1 < n) {
        EXPECT_TRUE(seq->Run(&next, 1, pos++, 1, logits.data()).ok());
      }
    }
    return out;
  }

  ThreadPool pool;
  EngineBuilder builder;
  std::unique_ptr<SingleSequence> seq;
  std::shared_ptr<const KvTransforms> fit;
  std::shared_ptr<TransformCodec> codec;
  int32_t builder_vocab = 0;
};

// RMS of (a - b) over RMS of a, for blocks of an f32 pool (their bytes are the floats).
double RelativeError(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i + 4 <= std::min(a.size(), b.size()); i += 4) {
    float x, y;
    std::memcpy(&x, a.data() + i, 4);
    std::memcpy(&y, b.data() + i, 4);
    num += (double{x} - y) * (double{x} - y);
    den += double{x} * x;
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

KvTierConfig TransformTier(double bits) {
  KvTierConfig tier;
  tier.codec = BlockCodec::kTransform;
  tier.transform_options = Bits(bits);
  return tier;
}

std::vector<std::string> BasisFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("tc-", 0) == 0 && e.path().extension() == ".basis") files.push_back(e.path());
  }
  return files;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void WriteAll(const std::string& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

TEST(TransformCodec, ErrorShrinksAsBitsGrow) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  CodecSequence cs(*model, {KvType::kF32, KvType::kF32}, 2);
  ASSERT_TRUE(cs.ok());
  const std::vector<int32_t> prompt = Prompt(*model);
  ASSERT_TRUE(cs.seq->Run(prompt.data(), 64, 0, 0, nullptr).ok());
  for (int32_t b : {1, 3}) {
    SCOPED_TRACE("block " + std::to_string(b));
    std::vector<uint8_t> block, decoded;
    ASSERT_TRUE(cs.seq->storage().ReadBlock(cs.seq->pool_block(b), &block).ok());
    double last_error = 1e9;
    size_t last_size = 0;
    for (double bits : {0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0}) {
      SCOPED_TRACE("tc:" + std::to_string(bits));
      auto codec = TransformCodec::Make(cs.seq->storage().shared_format(), cs.fit, Bits(bits));
      ASSERT_TRUE(codec.ok()) << codec.error();
      EXPECT_NEAR((*codec)->allocated_bits_per_element(), bits, 0.01);
      auto payload = (*codec)->Encode(block, b * kBlock);
      ASSERT_TRUE(payload.ok()) << payload.error();
      ASSERT_TRUE((*codec)->Decode(*payload, &decoded).ok());
      ASSERT_EQ(decoded.size(), block.size());
      const double error = RelativeError(block, decoded);
      EXPECT_LT(error, last_error);
      EXPECT_GE(payload->size(), last_size);
      // f32 KV is 32 bits per element: even 8 bits is a 4x smaller payload.
      EXPECT_LT(payload->size(), block.size() / 3);
      last_error = error;
      last_size = payload->size();
    }
    EXPECT_LT(last_error, 0.02);  // 8 bits: within 2% RMS
  }
}

class TransformCodecEveryType : public ::testing::TestWithParam<KvType> {};

// Blocks of every pool type, coded on disk by the first engine and loaded by the next, give the
// greedy tokens of the codec's in-memory round trip (the same blocks through Encode and Decode
// in one process): the disk, the restart and the refitted-or-reread basis change nothing.
TEST_P(TransformCodecEveryType, DiskRestartGivesTheInMemoryRoundTripTokens) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes types{GetParam(), GetParam()};
  const std::vector<std::vector<int32_t>> prompts = {Prompt(*model, 0), Prompt(*model, 1)};
  std::vector<std::vector<int32_t>> expected;
  for (const auto& prompt : prompts) {
    CodecSequence cs(*model, types, 2);
    ASSERT_TRUE(cs.ok());
    expected.push_back(cs.GreedyAfterRoundTrip(prompt, 8));
  }
  TempDir dir;
  {
    TierEngine first(*model, types, dir.path(), 64, TransformTier(2));
    ASSERT_TRUE(first.ok());
    first.Serve(prompts);
    first.engine().connectors().Flush(/*wait=*/true);
    const KvTierStats s = first.engine().connectors().tier("disk")->stats();
    EXPECT_EQ(s.blocks_written, 2 * 4);
    // The payload is coded (f16-equivalent 2 bits per element: 8x smaller than f16), and the
    // files are smaller than the pool's bytes of the blocks.
    EXPECT_LT(s.bytes_written, s.payload_bytes_written);
  }
  EXPECT_EQ(BasisFiles(dir.path()).size(), 1u);
  TierEngine second(*model, types, dir.path(), 64, TransformTier(2));
  ASSERT_TRUE(second.ok());
  const Served run = second.Serve(prompts);
  EXPECT_EQ(run.tokens, expected);
  EXPECT_EQ(run.tier.hits, 2 * 4);
  EXPECT_EQ(run.tier.corrupt, 0);
  EXPECT_EQ(run.disk_tokens, (std::vector<int32_t>{64, 64}));
}

INSTANTIATE_TEST_SUITE_P(EveryKvType, TransformCodecEveryType, ::testing::ValuesIn(kAllKvTypes),
                         [](const ::testing::TestParamInfo<KvType>& info) {
                           return std::string(KvTypeName(info.param));
                         });

// The fit is saved beside the store under its key and read back (not refitted) by the next
// start; a damaged file, or one of another key, is refitted and replaced.
TEST(TransformCodec, FitIsSavedReusedAndRefittedWhenDamaged) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f32{KvType::kF32, KvType::kF32};
  TempDir dir;
  CodecSequence a(*model, f32, 2, dir.path());
  ASSERT_TRUE(a.ok());
  const auto files = BasisFiles(dir.path());
  ASSERT_EQ(files.size(), 1u);
  const std::vector<uint8_t> saved = ReadAll(files[0]);

  // Another calibration's fit, written under this key's name with this key: it is what the next
  // start reads, so the digest is the other fit's (a refit would give a's).
  std::vector<int32_t> other_tokens = DefaultCalibration(*model);
  std::reverse(other_tokens.begin() + 1, other_tokens.end());
  const Digest128 key = a.fit->key;
  auto other = FitKvTransforms(*model, a.pool, other_tokens, 64, key);
  ASSERT_TRUE(other.ok()) << other.error();
  ASSERT_NE(other->digest, a.fit->digest);
  WriteAll(files[0], SerializeKvTransforms(*other));
  {
    CodecSequence b(*model, f32, 2, dir.path());
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b.fit->digest, other->digest);
  }
  // A flipped byte: the checksum fails, the fit is made again and the file replaced.
  std::vector<uint8_t> damaged = saved;
  damaged[damaged.size() / 2] ^= 0x20;
  WriteAll(files[0], damaged);
  {
    CodecSequence c(*model, f32, 2, dir.path());
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c.fit->digest, a.fit->digest);
    EXPECT_EQ(ReadAll(files[0]), saved);
  }
  // Truncated, empty, or of another key: refitted too.
  for (size_t size : {saved.size() - 1, size_t{16}, size_t{0}}) {
    WriteAll(files[0], std::span<const uint8_t>(saved.data(), size));
    CodecSequence d(*model, f32, 2, dir.path());
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d.fit->digest, a.fit->digest);
    EXPECT_EQ(ReadAll(files[0]), saved);
  }
  auto wrong_key = *other;
  wrong_key.key = Digest128{1, 2};
  WriteAll(files[0], SerializeKvTransforms(wrong_key));
  CodecSequence e(*model, f32, 2, dir.path());
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e.fit->digest, a.fit->digest);
}

// A payload decodes only with the codec that made it: another bit budget, fit, KV format or model,
// a truncation at any length, or a changed header byte is an error (the block file's checksum
// covers the payload besides); a block file reader without the codec cannot read it.
TEST(TransformCodec, AnotherFitBudgetFormatOrTruncationIsAnError) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f32{KvType::kF32, KvType::kF32};
  CodecSequence cs(*model, f32, 2);
  ASSERT_TRUE(cs.ok());
  const std::vector<int32_t> prompt = Prompt(*model);
  ASSERT_TRUE(cs.seq->Run(prompt.data(), 32, 0, 0, nullptr).ok());
  std::vector<uint8_t> block, decoded;
  ASSERT_TRUE(cs.seq->storage().ReadBlock(cs.seq->pool_block(1), &block).ok());
  auto payload = cs.codec->Encode(block, kBlock);
  ASSERT_TRUE(payload.ok()) << payload.error();
  ASSERT_TRUE(cs.codec->Decode(*payload, &decoded).ok());
  const std::vector<uint8_t> in_memory = decoded;

  auto three = TransformCodec::Make(cs.seq->storage().shared_format(), cs.fit, Bits(3));
  ASSERT_TRUE(three.ok());
  EXPECT_FALSE((*three)->Decode(*payload, &decoded).ok());
  std::vector<int32_t> other_tokens = DefaultCalibration(*model);
  std::reverse(other_tokens.begin() + 1, other_tokens.end());
  auto other_fit = FitKvTransforms(*model, cs.pool, other_tokens, 64, cs.fit->key);
  ASSERT_TRUE(other_fit.ok());
  auto other = TransformCodec::Make(cs.seq->storage().shared_format(),
                                    std::make_shared<KvTransforms>(*other_fit), Bits(2));
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE((*other)->Decode(*payload, &decoded).ok());
  CodecSequence f16(*model, {KvType::kF16, KvType::kF16}, 2);
  ASSERT_TRUE(f16.ok());
  EXPECT_FALSE(f16.codec->Decode(*payload, &decoded).ok());
  if (auto other_model = testing::LoadTestModel("stories-hd64-3M.gguf")) {
    CodecSequence another(*other_model, f32, 1.9918);
    ASSERT_TRUE(another.ok());
    EXPECT_FALSE(another.codec->Decode(*payload, &decoded).ok()) << "another model's codec";
    // Two budgets a thousandth apart whose allocations differ (127 and 128 bits of a 64-dim
    // vector) name different fits: the payload of one is refused by the other.
    auto near =
        TransformCodec::Make(another.seq->storage().shared_format(), another.fit, Bits(1.9924));
    ASSERT_TRUE(near.ok());
    ASSERT_TRUE(another.seq->Run(prompt.data(), 32, 0, 0, nullptr).ok());
    std::vector<uint8_t> hd64_block;
    ASSERT_TRUE(another.seq->storage().ReadBlock(another.seq->pool_block(1), &hd64_block).ok());
    auto coded = another.codec->Encode(hd64_block, kBlock);
    ASSERT_TRUE(coded.ok());
    EXPECT_TRUE(another.codec->Decode(*coded, &decoded).ok());
    EXPECT_FALSE((*near)->Decode(*coded, &decoded).ok());
    EXPECT_TRUE((*near)->OtherFit(*coded));
  }
  // A budget that gives a head no bits at all is refused (head_dim 8: below 1/16 bit).
  EXPECT_FALSE(TransformCodec::Make(cs.seq->storage().shared_format(), cs.fit, Bits(0.05)).ok());
  EXPECT_TRUE(TransformCodec::Make(cs.seq->storage().shared_format(), cs.fit, Bits(0.0625)).ok());
  // Another fit's payload is "another fit" (a store of other settings); garbage is not.
  EXPECT_TRUE((*three)->OtherFit(*payload));
  EXPECT_FALSE(cs.codec->OtherFit(*payload));
  EXPECT_FALSE(cs.codec->OtherFit(std::vector<uint8_t>(64, 0x5a)));

  for (size_t n = 0; n < payload->size(); ++n) {
    EXPECT_FALSE(cs.codec->Decode(std::span<const uint8_t>(payload->data(), n), &decoded).ok())
        << "truncated to " << n << " bytes";
  }
  std::vector<uint8_t> longer = *payload;
  longer.push_back(0);
  EXPECT_FALSE(cs.codec->Decode(longer, &decoded).ok());
  // Magic, version, flags, sinks, fit digest, and the low bits of the first position (a block's
  // is a multiple of its size; a higher bit gives another block's position, which only the
  // block file's checksum and its chain hash, the store's key, stand between).
  for (size_t i = 0; i < 25; ++i) {
    std::vector<uint8_t> bad = *payload;
    bad[i] ^= 0x01;
    EXPECT_FALSE(cs.codec->Decode(bad, &decoded).ok()) << "byte " << i << " changed";
  }

  // Through the block file: kTransform decodes with the codec only.
  const BlockIdentity identity =
      MakeBlockIdentity(model->weights_digest(), cs.seq->storage().format());
  BlockFileHeader header;
  header.identity = identity;
  header.hash = {7, 7};
  header.codec = BlockCodec::kTransform;
  header.tokens.assign(prompt.begin() + kBlock, prompt.begin() + 2 * kBlock);
  header.first_position = kBlock;
  auto file = EncodeBlockFile(header, block, 3, cs.codec.get());
  ASSERT_TRUE(file.ok()) << file.error();
  EXPECT_LT(file->size(), block.size() / 4);
  auto back = DecodeBlockFile(*file, identity, header.hash, cs.codec.get());
  ASSERT_TRUE(back.ok()) << back.error();
  EXPECT_EQ(back->payload, in_memory);  // the same bytes as the in-memory round trip
  EXPECT_FALSE(DecodeBlockFile(*file, identity, header.hash).ok());
  EXPECT_FALSE(DecodeBlockFile(*file, identity, header.hash, three->get()).ok());
}

// An engine restarted over a store coded with another budget, or without the codec, finds the
// stored blocks written with other settings: misses, not corrupt, nothing loaded, the prompts
// computed (the tokens of an engine without a tier) and stored again in the engine's codec.
TEST(TransformCodec, EngineWithAnotherCodecLoadsNothing) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f16{KvType::kF16, KvType::kF16};
  const std::vector<std::vector<int32_t>> prompts = {Prompt(*model, 0), Prompt(*model, 1)};
  TierEngine cold(*model, f16, "");
  const auto cold_tokens = cold.Serve(prompts).tokens;
  for (const KvTierConfig& reader : {TransformTier(3), KvTierConfig{}}) {
    SCOPED_TRACE(reader.codec == BlockCodec::kTransform ? "tc:3" : "raw");
    TempDir dir;
    {
      TierEngine first(*model, f16, dir.path(), 64, TransformTier(2));
      ASSERT_TRUE(first.ok());
      first.Serve(prompts);
      first.engine().connectors().Flush(true);
    }
    TierEngine second(*model, f16, dir.path(), 64, reader);
    ASSERT_TRUE(second.ok());
    const Served run = second.Serve(prompts);
    EXPECT_EQ(run.tokens, cold_tokens);
    EXPECT_EQ(run.tier.hits, 0);
    EXPECT_EQ(run.tier.corrupt, 0);
    EXPECT_GT(run.tier.misses, 0);
    EXPECT_EQ(run.disk_tokens, (std::vector<int32_t>{0, 0}));
    // Rewritten in the second engine's codec: a third engine of its settings loads them all.
    second.engine().connectors().Flush(true);
    TierEngine third(*model, f16, dir.path(), 64, reader);
    const Served again = third.Serve(prompts);
    EXPECT_EQ(again.tier.hits, 2 * 4);
    EXPECT_EQ(again.tier.corrupt, 0);
  }
}

}  // namespace
}  // namespace kvs
