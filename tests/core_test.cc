#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/page_memory.h"
#include "core/status.h"
#include "core/text_file.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "tensor/dtype.h"

namespace kvs {
namespace {

Expected<int> Half(int x) {
  if (x % 2) return Status::Error(StrFormat("%d is odd", x));
  return x / 2;
}

Expected<int> Quarter(int x) {
  KVS_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(Status, PropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), "3 is odd");
}

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (size_t n : {1u, 7u, 64u, 1000u}) {
      for (size_t grain : {1u, 16u}) {
        std::vector<std::atomic<int>> hits(n);
        pool.ParallelFor(n, grain, [&](int t, size_t b, size_t e) {
          EXPECT_LT(t, threads);
          if (b != 0) {
            EXPECT_EQ(b % grain, 0u);
          }
          for (size_t i = b; i < e; ++i) hits[i]++;
        });
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
      }
    }
  }
}

TEST(ThreadPool, ManyConsecutiveJobs) {
  ThreadPool pool(2);
  std::atomic<long> sum{0};
  for (int k = 0; k < 2000; ++k) {
    pool.ParallelFor(10, 1, [&](int, size_t b, size_t e) { sum += static_cast<long>(e - b); });
  }
  EXPECT_EQ(sum.load(), 20000);
}

TEST(ThreadPool, ResolveThreadCountClampsToTheCpus) {
  const int cpus = ThreadPool::DefaultThreadCount();
  EXPECT_GE(cpus, 1);
  EXPECT_EQ(ThreadPool::ResolveThreadCount(0), cpus);
  EXPECT_EQ(ThreadPool::ResolveThreadCount(1), 1);
  EXPECT_EQ(ThreadPool::ResolveThreadCount(cpus), cpus);
  EXPECT_EQ(ThreadPool::ResolveThreadCount(cpus + 1000), cpus);  // with a warning on stderr
}

// A scratch directory for the file tests, removed at the end.
class TextFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kvs_text_file_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  std::string dir_;
};

TEST_F(TextFileTest, ReadsARegularFileWhole) {
  const std::string text("Once upon a time\n\0binary too", 29);
  auto r = ReadTextFile(Write("story.txt", text), 1 << 20);
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(*r, text);
  auto empty = ReadTextFile(Write("empty.txt", ""), 1 << 20);
  ASSERT_TRUE(empty.ok()) << empty.error();
  EXPECT_EQ(*empty, "");
}

TEST_F(TextFileTest, EnforcesTheSizeLimit) {
  const std::string path = Write("ten.txt", "0123456789");
  EXPECT_TRUE(ReadTextFile(path, 10).ok());
  auto r = ReadTextFile(path, 9);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("more than the 9 bytes limit"), std::string::npos) << r.error();
}

TEST_F(TextFileTest, RefusesWhatIsNotARegularFile) {
  auto dir = ReadTextFile(dir_, 1 << 20);
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.error().find("is a directory"), std::string::npos) << dir.error();
  // /dev/zero never ends; a FIFO without a writer would block the open itself.
  auto dev = ReadTextFile("/dev/zero", 1 << 20);
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.error().find("character device"), std::string::npos) << dev.error();
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto pipe = ReadTextFile(fifo, 1 << 20);
  ASSERT_FALSE(pipe.ok());
  EXPECT_NE(pipe.error().find("FIFO"), std::string::npos) << pipe.error();
  auto missing = ReadTextFile(dir_ + "/nope.txt", 1 << 20);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().find("cannot read"), std::string::npos) << missing.error();
}

TEST(PageMemory, AllocatesZeroedMemoryAndMovesOwnership) {
  constexpr size_t kBytes = 8 << 20;
  auto mem = AllocatePages(kBytes, PageSize::kHuge);
  ASSERT_TRUE(mem.ok()) << mem.error();
  ASSERT_NE(mem->data(), nullptr);
  EXPECT_EQ(mem->size(), kBytes);
  EXPECT_EQ(mem->data()[0], 0);
  EXPECT_EQ(mem->data()[kBytes - 1], 0);
  for (size_t i = 0; i < kBytes; i += 4096) mem->data()[i] = 1;
  const int64_t huge = HugePageBytes(mem->data(), kBytes);
  EXPECT_GE(huge, -1);
  EXPECT_LE(huge, static_cast<int64_t>(kBytes));
  PageMemory moved = std::move(*mem);
  EXPECT_EQ(mem->data(), nullptr);
  EXPECT_EQ(moved.size(), kBytes);
  EXPECT_EQ(moved.data()[4096], 1);
}

TEST(PageMemory, SmallPagesAreNeverHuge) {
  constexpr size_t kBytes = 8 << 20;
  auto mem = AllocatePages(kBytes, PageSize::kSmall);
  ASSERT_TRUE(mem.ok()) << mem.error();
  for (size_t i = 0; i < kBytes; i += 4096) mem->data()[i] = 1;
  const int64_t huge = HugePageBytes(mem->data(), kBytes);
  if (huge < 0) GTEST_SKIP() << "/proc/self/smaps is not readable";
  EXPECT_EQ(huge, 0);
  const std::string policy = TransparentHugePagePolicy();
  EXPECT_TRUE(policy == "always" || policy == "madvise" || policy == "never" || policy == "unknown")
      << policy;
}

TEST(DType, InfoTable) {
  EXPECT_EQ(Info(DType::kQ8_0).block_bytes, 34u);
  EXPECT_EQ(Info(DType::kQ4_K).block_elems, 256u);
  EXPECT_FALSE(GetDTypeInfo(5).has_value());  // removed Q4_2
  EXPECT_EQ(ParseDType("Q4_0"), DType::kQ4_0);
  EXPECT_EQ(ParseDType("bogus"), std::nullopt);
  EXPECT_EQ(RowBytes(DType::kQ4_0, 64), 36u);
}

TEST(Ops, RmsNormMatchesDefinition) {
  float x[4] = {1, -2, 3, -4}, w[4] = {1, 2, 1, 0.5f}, out[4];
  RmsNorm(x, w, 4, 0, out);
  float rms = std::sqrt((1 + 4 + 9 + 16) / 4.f);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], x[i] / rms * w[i], 1e-6);
}

TEST(Ops, RopeModesRotateTheRightPairs) {
  RopeParams p;
  p.n_rot = 4;
  p.freq_base = 10000;
  float cs[4];
  RopeAngles(1, p, cs);
  EXPECT_NEAR(cs[0], std::cos(1.0), 1e-6);   // pair 0: theta = pos
  EXPECT_NEAR(cs[3], std::sin(0.01), 1e-6);  // pair 1: theta = pos * base^(-2/4)
  float normal[4] = {1, 0, 1, 0}, neox[4] = {1, 1, 0, 0};
  ApplyRope(normal, cs, 4, false);
  ApplyRope(neox, cs, 4, true);
  // Normal mode pairs (0,1) and (2,3); NeoX pairs (0,2) and (1,3): same rotations.
  EXPECT_NEAR(normal[0], neox[0], 1e-6);
  EXPECT_NEAR(normal[1], neox[2], 1e-6);
  EXPECT_NEAR(normal[2], neox[1], 1e-6);
  EXPECT_NEAR(normal[3], neox[3], 1e-6);
  EXPECT_NEAR(normal[1], std::sin(1.0), 1e-6);
}

TEST(Ops, DotMatchesScalarTwinForEveryTail) {
  std::vector<float> a(300), b(300);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = std::sin(0.37f * i);
    b[i] = std::cos(0.11f * i) - 0.2f;
  }
  for (int64_t n : {0, 1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 255, 300}) {
    float ref = DotF32Reference(a.data(), b.data(), n);
    EXPECT_NEAR(DotF32(a.data(), b.data(), n), ref, 1e-4f * (1 + std::fabs(ref))) << "n=" << n;
  }
}

TEST(Ops, SoftmaxSumsToOne) {
  float x[5] = {1000, 1001, 999, -5, 0};
  Softmax(x, 5);
  float s = 0;
  for (float v : x) s += v;
  EXPECT_NEAR(s, 1, 1e-6);
  EXPECT_GT(x[1], x[0]);
}

// 300 gate inputs spread over [-span, span] (zeros of both signs at 5 and 6) and up inputs.
void GluInputs(float span, std::vector<float>* gate, std::vector<float>* up) {
  gate->resize(300);
  up->resize(300);
  for (int i = 0; i < 300; ++i) {
    (*gate)[i] = -span + 2 * span * i / 299.f + (i % 7) * 0.013f;
    (*up)[i] = 0.5f + (i % 11) * 0.25f;
  }
  (*gate)[5] = 0.f;
  (*gate)[6] = -0.f;
}

// The vectorised SwiGLU against the formula in double, over every tail length and inputs from
// -100 to 100 (where a naive exp(-g) would overflow).
TEST(Ops, SwiGluMatchesDefinition) {
  std::vector<float> gate, up, out(300);
  GluInputs(100.f, &gate, &up);
  for (int64_t n : {1, 15, 16, 17, 33, 300}) {
    SwiGlu(gate.data(), up.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i], want = g / (1.0 + std::exp(-g)) * up[i];
      EXPECT_NEAR(out[i], want, 2e-6 * (1 + std::fabs(want))) << "n=" << n << " i=" << i;
    }
  }
}

// The vectorised GeGLU (tanh GELU) against the formula in double with tanh itself, over every
// tail length, inputs from -30 to 30 (and extremes where g^3 overflows a float).
TEST(Ops, GeGluTanhMatchesDefinition) {
  std::vector<float> gate, up, out(300);
  GluInputs(30.f, &gate, &up);
  gate[7] = 1e20f;
  gate[8] = -1e20f;
  gate[9] = 1e-3f;
  for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 300}) {
    GeGluTanh(gate.data(), up.data(), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i];
      const double want =
          0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * up[i];
      EXPECT_NEAR(out[i], want, 3e-6 * (1 + std::fabs(want))) << "n=" << n << " i=" << i;
    }
  }
}

}  // namespace
}  // namespace kvs
