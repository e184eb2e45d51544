// Corrupt and hostile GGUF files: each must end in a one-line error naming the problem,
// never a crash, a hang or a huge allocation (the sanitizer build runs these too).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/weights.h"
#include "testing/tiny_model.h"

namespace kvs::gguf {
namespace {

// Hand-assembles GGUF bytes so a test can put any value in any field.
class RawGguf {
 public:
  template <typename T>
  RawGguf& Put(T v) {
    size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
    return *this;
  }
  RawGguf& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  RawGguf& Header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    return Put<uint32_t>(0x46554747)
        .Put<uint32_t>(version)
        .Put<uint64_t>(n_tensors)
        .Put<uint64_t>(n_kv);
  }
  std::vector<uint8_t> bytes;
};

std::string ErrorOf(std::vector<uint8_t> bytes) {
  auto f = File::FromBytes(std::move(bytes));
  return f.ok() ? std::string() : f.error();
}

std::string ModelErrorOf(std::vector<uint8_t> bytes) {
  auto f = File::FromBytes(std::move(bytes));
  if (!f.ok()) return f.error();
  auto m = Model::FromFile(std::move(*f));
  return m.ok() ? std::string() : m.error();
}

void ExpectError(const std::string& error, const std::string& fragment) {
  EXPECT_FALSE(error.empty()) << "expected an error mentioning '" << fragment << "'";
  EXPECT_NE(error.find(fragment), std::string::npos) << "error was: " << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << "error must be one line: " << error;
}

TEST(GgufCorrupt, WrongMagic) {
  RawGguf g;
  g.Put<uint32_t>(0x46554746).Put<uint32_t>(3).Put<uint64_t>(0).Put<uint64_t>(0);
  ExpectError(ErrorOf(g.bytes), "bad magic");
}

TEST(GgufCorrupt, TooShortForAHeader) {
  ExpectError(ErrorOf({'G', 'G'}), "not a GGUF file");
  ExpectError(ErrorOf({}), "not a GGUF file");
}

TEST(GgufCorrupt, UnsupportedVersions) {
  ExpectError(ErrorOf(RawGguf().Header(1, 0, 0).bytes), "version 1 is not supported");
  ExpectError(ErrorOf(RawGguf().Header(4, 0, 0).bytes), "unsupported GGUF version 4");
}

TEST(GgufCorrupt, AbsurdCounts) {
  ExpectError(ErrorOf(RawGguf().Header(3, 0, 1ull << 62).bytes), "metadata count");
  ExpectError(ErrorOf(RawGguf().Header(3, 1ull << 62, 0).bytes), "tensor count");
}

TEST(GgufCorrupt, AbsurdStringLength) {
  RawGguf g;
  g.Header(3, 0, 1).Put<uint64_t>(1ull << 40);  // key length
  g.bytes.resize(g.bytes.size() + 64);
  ExpectError(ErrorOf(g.bytes), "past the end");
}

TEST(GgufCorrupt, AbsurdArrayLength) {
  RawGguf g;
  g.Header(3, 0, 1).Str("arr").Put<uint32_t>(9).Put<uint32_t>(4).Put<uint64_t>(1ull << 61);
  ExpectError(ErrorOf(g.bytes), "claims");
}

TEST(GgufCorrupt, UnknownValueType) {
  RawGguf g;
  g.Header(3, 0, 1).Str("k").Put<uint32_t>(77).Put<uint32_t>(0);
  ExpectError(ErrorOf(g.bytes), "unknown value type 77");
}

TEST(GgufCorrupt, BadBoolAndDuplicateKey) {
  RawGguf g;
  g.Header(3, 0, 1).Str("b").Put<uint32_t>(7).Put<uint8_t>(5);
  ExpectError(ErrorOf(g.bytes), "bool value");
  RawGguf d;
  d.Header(3, 0, 2)
      .Str("k")
      .Put<uint32_t>(4)
      .Put<uint32_t>(1)
      .Str("k")
      .Put<uint32_t>(4)
      .Put<uint32_t>(2);
  ExpectError(ErrorOf(d.bytes), "duplicate metadata key 'k'");
}

TEST(GgufCorrupt, DeeplyNestedArrays) {
  RawGguf g;
  g.Header(3, 0, 1).Str("deep").Put<uint32_t>(9);
  for (int i = 0; i < 10; ++i) g.Put<uint32_t>(9).Put<uint64_t>(1);
  g.Put<uint32_t>(4).Put<uint64_t>(0);
  ExpectError(ErrorOf(g.bytes), "nests arrays deeper");
}

RawGguf OneTensor(uint32_t n_dims, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
  RawGguf g;
  g.Header(3, 1, 0).Str("t").Put<uint32_t>(n_dims);
  for (uint64_t d : dims) g.Put<uint64_t>(d);
  g.Put<uint32_t>(type).Put<uint64_t>(offset);
  while (g.bytes.size() % 32) g.bytes.push_back(0);
  return g;
}

TEST(GgufCorrupt, TensorDimensions) {
  ExpectError(ErrorOf(OneTensor(0, {}, 0, 0).bytes), "0 dimensions");
  ExpectError(ErrorOf(OneTensor(5, {1, 1, 1, 1, 1}, 0, 0).bytes), "5 dimensions");
  ExpectError(ErrorOf(OneTensor(2, {1ull << 62, 4}, 0, 0).bytes), "absurd dimension");
  ExpectError(ErrorOf(OneTensor(2, {1ull << 30, 1ull << 30}, 0, 0).bytes), "absurd dimension");
  ExpectError(ErrorOf(OneTensor(1, {0}, 0, 0).bytes), "absurd dimension");
  ExpectError(ErrorOf(OneTensor(1, {33}, 8, 0).bytes), "not a multiple");
}

TEST(GgufCorrupt, UnknownTensorType) {
  ExpectError(ErrorOf(OneTensor(1, {4}, 99, 0).bytes), "unknown type id 99");
}

TEST(GgufCorrupt, TensorDataPastTheEnd) {
  RawGguf g = OneTensor(1, {1024}, 0, 0);
  g.bytes.resize(g.bytes.size() + 100);  // 4096 bytes promised, 100 present
  ExpectError(ErrorOf(g.bytes), "runs past the end");
  RawGguf far = OneTensor(1, {4}, 0, 1ull << 50);
  far.bytes.resize(far.bytes.size() + 64);
  ExpectError(ErrorOf(far.bytes), "runs past the end");
  ExpectError(ErrorOf(OneTensor(1, {4}, 0, 3).bytes), "not aligned");
}

TEST(GgufCorrupt, EveryTruncationOfAValidFileFails) {
  testing::TinyModelSpec spec;
  spec.n_layer = 1;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  ASSERT_TRUE(File::FromBytes(bytes).ok());
  // Every prefix that cuts into the header, metadata, tensor infos or tensor data.
  for (size_t len = 0; len < bytes.size(); len += (len < 4096 ? 1 : 997)) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + len);
    auto f = File::FromBytes(std::move(cut));
    EXPECT_FALSE(f.ok()) << "truncated to " << len << " bytes but accepted";
  }
}

TEST(GgufCorrupt, RandomByteFlipsNeverCrash) {
  testing::TinyModelSpec spec;
  spec.n_layer = 1;
  const std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  std::mt19937_64 rng(42);
  // Flips land mostly in the header region, where they change counts, lengths and types.
  const size_t header_end = File::FromBytes(bytes).value()->data_offset();
  int rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b = bytes;
    for (int k = 0; k < 3; ++k) b[rng() % header_end] ^= static_cast<uint8_t>(1u << (rng() % 8));
    auto f = File::FromBytes(std::move(b));
    if (!f.ok()) {
      ++rejected;
      continue;
    }
    auto m = Model::FromFile(std::move(*f));  // must validate shapes too, not crash
    if (!m.ok()) ++rejected;
  }
  EXPECT_GT(rejected, 100);
}

TEST(GgufModel, UnknownArchitecture) {
  testing::TinyModelSpec spec;
  Writer w = testing::MakeTinyModelWriter(spec);
  w.Set("general.architecture", Value::String("mamba"));
  ExpectError(ModelErrorOf(w.Serialize()), "unsupported architecture 'mamba'");
}

TEST(GgufModel, MissingTensor) {
  testing::TinyModelSpec spec;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  // Rename one tensor in place: same length, so the file stays well-formed.
  const std::string name = "blk.1.ffn_up.weight";
  auto it = std::search(bytes.begin(), bytes.end(), name.begin(), name.end());
  ASSERT_NE(it, bytes.end());
  *(it + 4) = 'X';
  ExpectError(ModelErrorOf(bytes), "missing tensor 'blk.1.ffn_up.weight'");
}

TEST(GgufModel, WrongShape) {
  testing::TinyModelSpec spec;
  Writer w = testing::MakeTinyModelWriter(spec);
  w.Set("llama.feed_forward_length", Value::Uint32(128));
  ExpectError(ModelErrorOf(w.Serialize()), "has shape");
}

TEST(GgufModel, AbsurdHyperparameters) {
  testing::TinyModelSpec spec;
  Writer w = testing::MakeTinyModelWriter(spec);
  w.Set("llama.embedding_length", Value::Uint64(1ull << 40));
  ExpectError(ModelErrorOf(w.Serialize()), "absurd value");
  Writer w2 = testing::MakeTinyModelWriter(spec);
  w2.Set("llama.attention.head_count_kv", Value::Uint32(3));
  ExpectError(ModelErrorOf(w2.Serialize()), "not a multiple of head_count_kv");
  Writer w3 = testing::MakeTinyModelWriter(spec);
  w3.Set("llama.block_count", Value::String("two"));
  ExpectError(ModelErrorOf(w3.Serialize()), "not an unsigned integer");
}

TEST(GgufModel, UnsupportedWeightType) {
  testing::TinyModelSpec spec;
  spec.n_embd = 256;
  spec.head_dim = 64;
  spec.n_ff = 256;
  Writer w = testing::MakeTinyModelWriter(spec);
  // An i-quant matrix (not computable yet) must be refused by name, not run as garbage.
  w.AddTensor("blk.0.ffn_gate.weight", {256, 256}, static_cast<DType>(16),
              std::vector<uint8_t>(256 * 66));
  ExpectError(ModelErrorOf(w.Serialize()), "'blk.0.ffn_gate.weight' has type iq2_xxs");
}

}  // namespace
}  // namespace kvs::gguf
