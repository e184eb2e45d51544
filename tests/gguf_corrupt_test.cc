// Corrupt and hostile GGUF files: each must end in a one-line error naming the problem,
// never a crash, a hang or a huge allocation (the sanitizer build runs these too).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/check_tensors.h"
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

std::string ModelErrorOf(std::vector<uint8_t> bytes, const ModelLoadOptions& options = {}) {
  auto f = File::FromBytes(std::move(bytes));
  if (!f.ok()) return f.error();
  auto m = Model::FromFile(std::move(*f), options);
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

// --- Mutants that parse as GGUF but describe something other than their bytes -------------

template <typename T>
void Poke(std::vector<uint8_t>& bytes, size_t at, T value) {
  std::memcpy(bytes.data() + at, &value, sizeof(T));
}
template <typename T>
T Peek(const std::vector<uint8_t>& bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

// Where tensor `name`'s record in the header keeps its type and offset fields.
struct InfoFields {
  size_t type_at = 0, offset_at = 0;
};
InfoFields FindTensorInfo(const std::vector<uint8_t>& bytes, const std::string& name) {
  const std::vector<uint8_t> key = RawGguf().Str(name).bytes;  // length-prefixed, as stored
  auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  EXPECT_NE(it, bytes.end()) << name;
  size_t at = static_cast<size_t>(it - bytes.begin()) + key.size();
  at += 4 + 8 * Peek<uint32_t>(bytes, at);  // n_dims, dims
  return {at, at + 4};
}

// Absolute file position of tensor `name`'s data.
size_t DataPosition(const std::vector<uint8_t>& bytes, const std::string& name) {
  auto f = File::FromBytes(bytes);
  EXPECT_TRUE(f.ok()) << f.error();
  const TensorInfo* t = (*f)->FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  return (*f)->data_offset() + t->offset;
}

TEST(GgufLayout, TwoTensorsAtTheSameOffset) {
  testing::TinyModelSpec spec;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  const InfoFields q = FindTensorInfo(bytes, "blk.0.attn_q.weight");
  const InfoFields k = FindTensorInfo(bytes, "blk.0.attn_k.weight");
  Poke(bytes, k.offset_at, Peek<uint64_t>(bytes, q.offset_at));
  const std::string error = ErrorOf(bytes);
  ExpectError(error, "tensor 'blk.0.attn_k.weight' (f32 [64, 32]");
  ExpectError(error, "overlaps tensor 'blk.0.attn_q.weight' (f32 [64, 64], 16384 bytes");
}

TEST(GgufLayout, OverlappingAndGappedRanges) {
  testing::TinyModelSpec spec;
  const std::vector<uint8_t> clean = testing::MakeTinyModel(spec);
  const InfoFields v = FindTensorInfo(clean, "blk.0.attn_v.weight");
  const uint64_t v_offset = Peek<uint64_t>(clean, v.offset_at);
  // Starting 32 bytes early: the tail of attn_k is read as the head of attn_v.
  std::vector<uint8_t> early = clean;
  Poke<uint64_t>(early, v.offset_at, v_offset - 32);
  ExpectError(ErrorOf(early), "overlaps tensor 'blk.0.attn_k.weight'");
  // Starting 32 bytes late: aligned and inside the file, but 32 bytes belong to nobody.
  std::vector<uint8_t> late = clean;
  Poke<uint64_t>(late, v.offset_at, v_offset + 32);
  const std::string error = ErrorOf(late);
  ExpectError(error, StrFormat("tensor 'blk.0.attn_v.weight' (f32 [64, 32], 8192 bytes at data "
                               "offset %llu) should start at data offset %llu",
                               static_cast<unsigned long long>(v_offset + 32),
                               static_cast<unsigned long long>(v_offset)));
  ExpectError(error, "the end of the tensor before it, 'blk.0.attn_k.weight'");
  // The first tensor must start the data section.
  std::vector<uint8_t> first = clean;
  Poke<uint64_t>(first, FindTensorInfo(first, "token_embd.weight").offset_at, 32);
  ExpectError(ErrorOf(first), "the first tensor 'token_embd.weight'");
}

TEST(GgufLayout, TypeChangedToASmallerOne) {
  testing::TinyModelSpec spec;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  // f32 -> f16 halves attn_q's size; attn_k still starts where the f32 data ended.
  Poke<uint32_t>(bytes, FindTensorInfo(bytes, "blk.0.attn_q.weight").type_at, 1);
  const std::string error = ErrorOf(bytes);
  ExpectError(error, "tensor 'blk.0.attn_k.weight'");
  ExpectError(error, "'blk.0.attn_q.weight' (f16 [64, 64], 8192 bytes at data offset");
  ExpectError(error, "a type, shape or offset is wrong");
}

TEST(GgufLayout, LastTensorTypeChangedToASmallerOne) {
  testing::TinyModelSpec spec;  // the last tensor is blk.1.ffn_down.weight, f32 [96, 64]
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  Poke<uint32_t>(bytes, FindTensorInfo(bytes, "blk.1.ffn_down.weight").type_at, 1);
  const std::string error = ErrorOf(bytes);
  ExpectError(error,
              "12288 bytes of tensor data after the last tensor 'blk.1.ffn_down.weight' "
              "(f16 [96, 64], 12288 bytes at data offset");
  ExpectError(error, "belong to no tensor");
}

TEST(GgufLayout, LastTensorPaddingIsOptional) {
  // Writers pad the last tensor to the alignment, or stop right after its data; both load,
  // and so does a file with less than one alignment unit of trailing bytes.
  Writer w;
  w.AddTensorF32("a", {8}, DType::kF32, std::vector<float>(8, 1.f));
  w.AddTensorF32("b", {5}, DType::kF32, std::vector<float>(5, 2.f));  // 20 bytes, 12 of padding
  const std::vector<uint8_t> padded = w.Serialize();
  EXPECT_EQ(ErrorOf(padded), "");
  EXPECT_EQ(ErrorOf(std::vector<uint8_t>(padded.begin(), padded.end() - 12)), "");
  std::vector<uint8_t> extra = padded;
  extra.resize(padded.size() + 31);
  EXPECT_EQ(ErrorOf(extra), "");
  extra.resize(padded.size() + 32);
  ExpectError(ErrorOf(extra),
              "32 bytes of tensor data after the last tensor 'b' (f32 [5], 20 bytes");
}

TEST(GgufModel, BlockCountLoweredLeavesTensorsUnused) {
  testing::TinyModelSpec spec;  // two layers
  Writer w = testing::MakeTinyModelWriter(spec);
  w.Set("llama.block_count", Value::Uint32(1));
  const std::string error = ModelErrorOf(w.Serialize());
  ExpectError(error, "tensor 'blk.1.attn_norm.weight' is not used by the model");
  ExpectError(error, "the file has 21 tensors, a llama with llama.block_count = 1 uses 12");
}

TEST(GgufModel, StrayTensorIsRefused) {
  testing::TinyModelSpec spec;
  Writer w = testing::MakeTinyModelWriter(spec);
  w.AddTensorF32("blk.0.attn_qkv.weight", {64, 4}, DType::kF32, std::vector<float>(256, 0.f));
  ExpectError(ModelErrorOf(w.Serialize()), "tensor 'blk.0.attn_qkv.weight' is not used");
}

// --- --check-tensors ------------------------------------------------------------------------

const ModelLoadOptions kCheckTensors{.check_tensors = true};

TEST(CheckTensors, CleanModelsLoad) {
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    testing::TinyModelSpec spec;
    spec.weight_type = type;
    EXPECT_EQ(ModelErrorOf(testing::MakeTinyModel(spec), kCheckTensors), "") << DTypeName(type);
  }
  testing::TinyModelSpec k;
  k.n_embd = k.n_ff = 256;
  k.head_dim = 64;
  k.weight_type = DType::kQ4_K;
  EXPECT_EQ(ModelErrorOf(testing::MakeTinyModel(k), kCheckTensors), "");
}

TEST(CheckTensors, NaNInAFloatTensor) {
  testing::TinyModelSpec spec;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  // Element 1000 of ffn_up [64, 96]: row 15, column 40.
  Poke(bytes, DataPosition(bytes, "blk.1.ffn_up.weight") + 1000 * 4, std::nanf(""));
  EXPECT_EQ(ModelErrorOf(bytes), "") << "the check is opt-in";
  ExpectError(ModelErrorOf(bytes, kCheckTensors),
              "tensor 'blk.1.ffn_up.weight' (f32 [64, 96]) has a NaN at element 1000 (row 15, "
              "column 40)");
}

TEST(CheckTensors, InfinityInHalfAndBFloatTensors) {
  for (auto [type, inf] : {std::pair{DType::kF16, uint16_t{0xfc00}},  // -inf
                           std::pair{DType::kBF16, uint16_t{0x7f80}}}) {
    testing::TinyModelSpec spec;
    spec.weight_type = type;
    std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
    Poke(bytes, DataPosition(bytes, "blk.0.attn_output.weight") + 7 * 2, inf);
    ExpectError(ModelErrorOf(bytes, kCheckTensors),
                "tensor 'blk.0.attn_output.weight' (" + std::string(DTypeName(type)) +
                    " [64, 64]) has an infinity at element 7 (row 0, column 7)");
  }
}

TEST(CheckTensors, NaNInAQuantizedBlockScale) {
  testing::TinyModelSpec spec;
  spec.weight_type = DType::kQ8_0;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  // Block 5 of attn_k (rows of 64 values = 2 blocks): row 2, elements 160..191.
  Poke<uint16_t>(bytes, DataPosition(bytes, "blk.0.attn_k.weight") + 5 * sizeof(BlockQ8_0), 0x7e00);
  ExpectError(ModelErrorOf(bytes, kCheckTensors),
              "tensor 'blk.0.attn_k.weight' (q8_0 [64, 32]) has a NaN in the scale d of block 5 "
              "(elements 160..191, row 2)");
}

TEST(CheckTensors, InfinityInAKQuantMinScale) {
  testing::TinyModelSpec spec;
  spec.n_embd = spec.n_ff = 256;
  spec.head_dim = 64;
  spec.weight_type = DType::kQ4_K;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  // Q4_K: d, then dmin, at the start of each 144-byte super-block.
  Poke<uint16_t>(bytes, DataPosition(bytes, "blk.1.ffn_gate.weight") + 3 * 144 + 2, 0x7c00);
  ExpectError(ModelErrorOf(bytes, kCheckTensors),
              "tensor 'blk.1.ffn_gate.weight' (q4_k [256, 256]) has an infinity in the scale dmin "
              "of block 3 (elements 768..1023, row 3)");
}

TEST(CheckTensors, ReportsTheFirstBadTensorWhateverTheThreads) {
  testing::TinyModelSpec spec;
  std::vector<uint8_t> bytes = testing::MakeTinyModel(spec);
  Poke(bytes, DataPosition(bytes, "blk.1.ffn_down.weight"), std::nanf(""));
  Poke(bytes, DataPosition(bytes, "output.weight") + 4 * 4000, std::nanf(""));
  Poke(bytes, DataPosition(bytes, "output.weight") + 4 * 5000, std::nanf(""));
  auto f = File::FromBytes(bytes);
  ASSERT_TRUE(f.ok());
  for (int threads : {1, 2, 3, 8}) {
    ExpectError(CheckTensorValues(**f, threads).message(),
                "tensor 'output.weight' (f32 [64, 291]) has a NaN at element 4000");
  }
}

}  // namespace
}  // namespace kvs::gguf
