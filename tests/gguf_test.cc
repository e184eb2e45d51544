#include <gtest/gtest.h>

#include <cstring>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "tensor/quantize.h"
#include "testing/test_models.h"

namespace kvs::gguf {
namespace {

TEST(GgufRoundTrip, EveryMetadataTypeSurvives) {
  Writer w;
  auto scalar = [](ValueType t, int64_t i, double f) {
    Value v;
    v.type = t;
    v.i = i;
    v.f = f;
    return v;
  };
  w.Set("u8", scalar(ValueType::kUint8, 200, 0));
  w.Set("i8", scalar(ValueType::kInt8, -100, 0));
  w.Set("u16", scalar(ValueType::kUint16, 60000, 0));
  w.Set("i16", scalar(ValueType::kInt16, -30000, 0));
  w.Set("u32", scalar(ValueType::kUint32, 4000000000ll, 0));
  w.Set("i32", scalar(ValueType::kInt32, -2000000000, 0));
  w.Set("u64", Value::Uint64(~0ull));
  w.Set("i64", scalar(ValueType::kInt64, -(1ll << 60), 0));
  w.Set("f32", Value::Float32(1.5f));
  w.Set("f64", scalar(ValueType::kFloat64, 0, 3.25));
  w.Set("bool", Value::Bool(true));
  w.Set("str", Value::String("héllo"));
  w.Set("strs", Value::StringArray({"a", "", "ccc"}));
  w.Set("floats", Value::Float32Array({1.f, -2.f}));
  w.Set("ints", Value::Int32Array({7, -8, 9}));
  Value nested;
  nested.type = ValueType::kArray;
  nested.array_type = ValueType::kArray;
  nested.arrays = {Value::Int32Array({1, 2}), Value::Int32Array({3})};
  w.Set("nested", nested);
  Value bools;
  bools.type = ValueType::kArray;
  bools.array_type = ValueType::kBool;
  bools.ints = {1, 0, 1};
  w.Set("bools", bools);

  auto f = File::FromBytes(w.Serialize());
  ASSERT_TRUE(f.ok()) << f.error();
  const File& file = **f;
  EXPECT_EQ(file.version(), 3u);
  EXPECT_EQ(file.GetUint("u8"), 200u);
  EXPECT_EQ(file.GetInt("i8"), -100);
  EXPECT_EQ(file.GetUint("u16"), 60000u);
  EXPECT_EQ(file.GetInt("i16"), -30000);
  EXPECT_EQ(file.GetUint("u32"), 4000000000ull);
  EXPECT_EQ(file.GetInt("i32"), -2000000000);
  EXPECT_EQ(file.GetUint("u64"), ~0ull);
  EXPECT_FALSE(file.GetInt("u64").has_value()) << "a u64 above INT64_MAX must not read as int";
  EXPECT_EQ(file.GetInt("i64"), -(1ll << 60));
  EXPECT_FALSE(file.GetUint("i8").has_value()) << "negative values are not unsigned";
  EXPECT_EQ(file.GetFloat("f32"), 1.5);
  EXPECT_EQ(file.GetFloat("f64"), 3.25);
  EXPECT_EQ(file.GetBool("bool"), true);
  EXPECT_EQ(file.GetString("str"), "héllo");
  EXPECT_FALSE(file.GetString("u8").has_value());
  EXPECT_EQ(file.Find("strs")->strings, (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(file.Find("floats")->floats, (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ(file.Find("ints")->ints, (std::vector<int64_t>{7, -8, 9}));
  const Value* n = file.Find("nested");
  ASSERT_EQ(n->ArraySize(), 2u);
  EXPECT_EQ(n->arrays[0].ints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(n->arrays[1].ints, (std::vector<int64_t>{3}));
  EXPECT_EQ(file.Find("bools")->ints, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(file.Find("missing"), nullptr);
}

TEST(GgufRoundTrip, TensorsHonourAlignment) {
  for (uint64_t alignment : {32u, 64u, 256u}) {
    Writer w(alignment);
    std::vector<float> a(5 * 3), b(64);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i) * 0.5f - 3;
    w.AddTensorF32("a", {5, 3}, DType::kF32, a);
    w.AddTensorF32("b", {32, 2}, DType::kQ8_0, b);
    auto f = File::FromBytes(w.Serialize());
    ASSERT_TRUE(f.ok()) << f.error();
    EXPECT_EQ((*f)->alignment(), alignment);
    EXPECT_EQ((*f)->data_offset() % alignment, 0u);
    const TensorInfo* ta = (*f)->FindTensor("a");
    const TensorInfo* tb = (*f)->FindTensor("b");
    ASSERT_NE(ta, nullptr);
    ASSERT_NE(tb, nullptr);
    EXPECT_EQ(ta->dims, (std::vector<uint64_t>{5, 3}));
    EXPECT_EQ(ta->rows(), 3u);
    EXPECT_EQ(ta->n_bytes, 60u);
    EXPECT_EQ(tb->type, DType::kQ8_0);
    EXPECT_EQ(tb->n_bytes, 68u);
    EXPECT_EQ(tb->offset % alignment, 0u);
    const float* fa = reinterpret_cast<const float*>(ta->data);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(fa[i], a[i]);
    std::vector<float> back(64);
    DequantizeRow(DType::kQ8_0, tb->data, back.data(), 64);
    for (size_t i = 0; i < b.size(); ++i)
      EXPECT_NEAR(back[i], b[i], 28.5 / 127);  // one q8_0 step of the block
  }
}

TEST(GgufRealFiles, ReadsStories260K) {
  KVS_REQUIRE_MODEL(path, "stories260K.gguf");
  auto f = File::Open(path);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ((*f)->tensors().size(), 48u);
  EXPECT_EQ((*f)->metadata().size(), 19u);
  EXPECT_EQ((*f)->data_offset(), 14176u);
  EXPECT_EQ((*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ((*f)->GetUint("llama.embedding_length"), 64u);
  EXPECT_EQ((*f)->Find("tokenizer.ggml.tokens")->strings.size(), 512u);
  const TensorInfo* emb = (*f)->FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(emb->type, DType::kF32);
}

TEST(GgufRealFiles, MappedAndReadFilesHoldTheSameBytes) {
  KVS_REQUIRE_MODEL(path, "stories260K.gguf");
  auto mapped = File::Open(path, LoadMode::kMap);
  auto read = File::Open(path, LoadMode::kRead);
  ASSERT_TRUE(mapped.ok()) << mapped.error();
  ASSERT_TRUE(read.ok()) << read.error();
  ASSERT_EQ((*mapped)->tensors().size(), (*read)->tensors().size());
  for (size_t i = 0; i < (*mapped)->tensors().size(); ++i) {
    const TensorInfo& a = (*mapped)->tensors()[i];
    const TensorInfo& b = (*read)->tensors()[i];
    ASSERT_EQ(a.name, b.name);
    ASSERT_NE(a.data, b.data);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
  }
}

TEST(GgufRealFiles, ReadsF16RandomLlama) {
  KVS_REQUIRE_MODEL(path, "random-weights/llama-2-tiny-random.gguf");
  auto f = File::Open(path);
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ((*f)->tensors().size(), 12u);
  EXPECT_EQ((*f)->data_offset(), 724416u);
  EXPECT_EQ((*f)->FindTensor("token_embd.weight")->type, DType::kF16);
}

TEST(GgufRealFiles, RejectsVersion1WithAClearMessage) {
  KVS_REQUIRE_MODEL(path, "legacy-gguf-v1/tinyllamas-stories-260k-f32.gguf");
  auto f = File::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().find("GGUF version 1 is not supported"), std::string::npos) << f.error();
}

TEST(GgufRealFiles, OpensMissingFileWithAMessage) {
  auto f = File::Open("/nonexistent/model.gguf");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.error().find("cannot open"), std::string::npos) << f.error();
}

}  // namespace
}  // namespace kvs::gguf
