// The on-disk KV block format (kv/block_file.h): what is written reads back exactly, raw and
// zstd; nothing else ever decodes: every truncation, every flipped bit, another model, KV format,
// geometry or hash, an empty file and a directory are errors.
#include "kv/block_file.h"

#include "kernels/kv_layer.h"
#include "kv/kv_storage.h"
#include "testing/temp_dir.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>

namespace kvs {
namespace {

BlockIdentity Identity() {
  BlockIdentity id;
  id.model = {0x1111, 0x2222};
  id.kv_format = {0x3333, 0x4444};
  id.k_type = 1;
  id.v_type = 4;
  id.block_size = 16;
  id.n_layer = 4;
  id.n_head_kv = 2;
  id.head_dim_k = id.head_dim_v = 64;
  return id;
}

BlockFileHeader Header(BlockCodec codec) {
  BlockFileHeader h;
  h.identity = Identity();
  h.hash = {0xabcdef, 0x123456};
  h.parent = {0x777, 0x888};
  h.codec = codec;
  for (int32_t i = 0; i < 16; ++i) h.tokens.push_back(100 + i * 3);
  return h;
}

// A payload with structure (compressible) and noise (not entirely).
std::vector<uint8_t> Payload(size_t n) {
  std::mt19937 rng(3);
  std::vector<uint8_t> p(n);
  for (size_t i = 0; i < n; ++i) p[i] = i % 7 == 0 ? static_cast<uint8_t>(rng()) : i % 13;
  return p;
}

using testing::TempDir;

TEST(BlockFile, RoundTripsRawAndZstd) {
  const std::vector<uint8_t> payload = Payload(32768);
  for (BlockCodec codec : {BlockCodec::kRaw, BlockCodec::kZstd}) {
    SCOPED_TRACE(BlockCodecName(codec));
    auto bytes = EncodeBlockFile(Header(codec), payload);
    ASSERT_TRUE(bytes.ok()) << bytes.error();
    if (codec == BlockCodec::kZstd) {
      EXPECT_LT(bytes->size(), payload.size());
    }
    auto d = DecodeBlockFile(*bytes, Identity(), Header(codec).hash);
    ASSERT_TRUE(d.ok()) << d.error();
    EXPECT_EQ(d->payload, payload);
    EXPECT_EQ(d->header.tokens, Header(codec).tokens);
    EXPECT_EQ(d->header.parent, Header(codec).parent);
    EXPECT_EQ(d->header.codec, codec);
  }
}

TEST(BlockFile, EveryTruncationAndEveryFlippedBitIsAnError) {
  const std::vector<uint8_t> payload = Payload(512);
  for (BlockCodec codec : {BlockCodec::kRaw, BlockCodec::kZstd}) {
    SCOPED_TRACE(BlockCodecName(codec));
    auto bytes = EncodeBlockFile(Header(codec), payload);
    ASSERT_TRUE(bytes.ok());
    const BlockHash hash = Header(codec).hash;
    for (size_t n = 0; n < bytes->size(); ++n) {
      const std::span<const uint8_t> cut(bytes->data(), n);
      ASSERT_FALSE(DecodeBlockFile(cut, Identity(), hash).ok()) << "truncated to " << n;
    }
    for (size_t byte = 0; byte < bytes->size(); ++byte) {
      for (int bit = 0; bit < 8; bit += 3) {
        std::vector<uint8_t> flipped = *bytes;
        flipped[byte] ^= static_cast<uint8_t>(1u << bit);
        ASSERT_FALSE(DecodeBlockFile(flipped, Identity(), hash).ok())
            << "bit " << bit << " of byte " << byte << " flipped";
      }
    }
  }
}

TEST(BlockFile, AnotherModelFormatGeometryOrHashIsRefused) {
  auto bytes = EncodeBlockFile(Header(BlockCodec::kRaw), Payload(256));
  ASSERT_TRUE(bytes.ok());
  const BlockHash hash = Header(BlockCodec::kRaw).hash;
  std::vector<BlockIdentity> others(6, Identity());
  others[0].model.lo ^= 1;
  others[1].kv_format.hi ^= 1;
  others[2].k_type = 0;
  others[3].block_size = 32;
  others[4].n_head_kv = 4;
  others[5].head_dim_v = 128;
  for (size_t i = 0; i < others.size(); ++i) {
    auto d = DecodeBlockFile(*bytes, others[i], hash);
    ASSERT_FALSE(d.ok()) << "identity " << i;
    EXPECT_NE(d.error().find("another model"), std::string::npos) << d.error();
  }
  auto d = DecodeBlockFile(*bytes, Identity(), BlockHash{1, 2});
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.error().find("hash"), std::string::npos) << d.error();
}

TEST(BlockFile, WrittenAtomicallyAndReadBack) {
  TempDir dir;
  auto bytes = EncodeBlockFile(Header(BlockCodec::kZstd), Payload(4096));
  ASSERT_TRUE(bytes.ok());
  ASSERT_TRUE(WriteFileAtomically(dir.path(), "b1", *bytes).ok());
  auto read = ReadBlockFileBytes(dir.path() + "/b1");
  ASSERT_TRUE(read.ok()) << read.error();
  EXPECT_EQ(*read, *bytes);
  // Overwriting replaces the whole file; no temporary file is left behind.
  auto other = EncodeBlockFile(Header(BlockCodec::kRaw), Payload(100));
  ASSERT_TRUE(WriteFileAtomically(dir.path(), "b1", *other).ok());
  EXPECT_EQ(*ReadBlockFileBytes(dir.path() + "/b1"), *other);
  EXPECT_EQ(std::system(("test $(ls -A '" + dir.path() + "' | wc -l) -eq 1").c_str()), 0);
}

TEST(BlockFile, EmptyFilesDirectoriesAndMissingPathsAreErrors) {
  TempDir dir;
  ASSERT_TRUE(WriteFileAtomically(dir.path(), "empty", {}).ok());
  auto empty = ReadBlockFileBytes(dir.path() + "/empty");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(DecodeBlockFile(*empty, Identity(), Header(BlockCodec::kRaw).hash).ok());
  ASSERT_EQ(mkdir((dir.path() + "/sub").c_str(), 0755), 0);
  EXPECT_FALSE(ReadBlockFileBytes(dir.path() + "/sub").ok()) << "a directory is not a block";
  EXPECT_FALSE(ReadBlockFileBytes(dir.path() + "/missing").ok());
  auto bytes = EncodeBlockFile(Header(BlockCodec::kRaw), Payload(1000));
  ASSERT_TRUE(WriteFileAtomically(dir.path(), "big", *bytes).ok());
  EXPECT_FALSE(ReadBlockFileBytes(dir.path() + "/big", 999).ok()) << "over the size bound";
  EXPECT_FALSE(WriteFileAtomically(dir.path() + "/missing-dir", "x", *bytes).ok());
}

// A pool block's bytes go through the file and into another pool of the same format, every
// layer's K and V byte for byte, for every KV type; the identity names the format.
TEST(BlockFile, APoolBlockRoundTripsThroughAFileIntoAnotherPool) {
  for (KvType t : kAllKvTypes) {
    SCOPED_TRACE(std::string(KvTypeName(t)));
    KvGeometry g;
    g.n_layer = 3;
    g.n_head_kv = 2;
    g.head_dim_k = g.head_dim_v = 64;
    g.block_size = 32;
    g.k_type = g.v_type = t;
    const KvFormatPtr format = PlainKvFormat(g);
    KvStorage src(format, 5), dst(format, 7);
    std::mt19937 rng(9);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(128), v(128);
    for (const KvLayerView& layer : src.layers()) {
      for (int64_t slot = 3 * 32; slot < 4 * 32; ++slot) {  // pool block 3
        for (float& x : k) x = dist(rng);
        for (float& x : v) x = dist(rng);
        WriteKv(layer, slot, static_cast<int32_t>(slot), k.data(), v.data());
      }
    }
    std::vector<uint8_t> payload;
    ASSERT_TRUE(src.ReadBlock(3, &payload).ok());
    ASSERT_EQ(payload.size(), g.BytesPerBlock());
    BlockFileHeader h = Header(BlockCodec::kZstd);
    h.identity = MakeBlockIdentity(Digest128{5, 6}, *format);
    h.tokens.assign(32, 7);
    auto file = EncodeBlockFile(h, payload);
    ASSERT_TRUE(file.ok());
    auto decoded = DecodeBlockFile(*file, h.identity, h.hash);
    ASSERT_TRUE(decoded.ok()) << decoded.error();
    ASSERT_TRUE(dst.WriteBlock(6, decoded->payload).ok());
    std::vector<uint8_t> back;
    ASSERT_TRUE(dst.ReadBlock(6, &back).ok());
    EXPECT_EQ(back, payload);
    EXPECT_FALSE(dst.WriteBlock(7, decoded->payload).ok()) << "out of the pool";
    EXPECT_FALSE(dst.WriteBlock(0, decoded->payload).ok()) << "the null block";
    EXPECT_FALSE(dst.WriteBlock(2, std::span(decoded->payload).first(10)).ok()) << "short";
    // Another KV type's pool has another identity: its file is refused.
    KvGeometry other = g;
    other.v_type = t == KvType::kF16 ? KvType::kF32 : KvType::kF16;
    EXPECT_FALSE(
        DecodeBlockFile(*file, MakeBlockIdentity(Digest128{5, 6}, *PlainKvFormat(other)), h.hash)
            .ok());
    // So has another KV cache group's (a sliding window's layers); the first, global group keeps
    // a one-group model's identity.
    EXPECT_EQ(MakeBlockIdentity(Digest128{5, 6}, *format, 0, KvGroupSpec{}), h.identity);
    const BlockIdentity local = MakeBlockIdentity(Digest128{5, 6}, *format, 1, KvGroupSpec{24});
    EXPECT_NE(local, h.identity);
    EXPECT_NE(local, MakeBlockIdentity(Digest128{5, 6}, *format, 1, KvGroupSpec{32}));
    EXPECT_FALSE(DecodeBlockFile(*file, local, h.hash).ok());
  }
}

}  // namespace
}  // namespace kvs
