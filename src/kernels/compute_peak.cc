#include "kernels/compute_peak.h"

#include <cmath>

#include "kernels/cpu_isa.h"

#if defined(__x86_64__)
// Included at the baseline target: each intrinsic carries its own target, so the AVX-512 and the
// AVX2 loops below (each under its own `#pragma GCC target`) can both inline them.
#include <immintrin.h>
#define KVS_PEAK_AVX512 1
#else
#define KVS_PEAK_AVX512 0
#endif

namespace kvs {
namespace {

// The operands, byte by byte and lane by lane, shared by the vector loops and their twins.
uint8_t ActByte(uint32_t seed, int byte) {
  return static_cast<uint8_t>((seed * 31 + byte * 7) & 0xff);
}
int8_t WeightByte(uint32_t seed, int k, int byte) {
  return static_cast<int8_t>(((seed + 13 * k) * 17 + byte * 11) & 0xff);
}
float Scale(uint32_t seed) {
  return 1.0f - static_cast<float>(1 + seed % 7) * 1e-6f;
}
// Accumulator j's first value (f32; the int8 loop starts accumulator j at j).
float Start(int j) {
  return static_cast<float>(j) * 0.01f;
}
float Addend(uint32_t seed, int k, int lane) {
  return static_cast<float>((seed + 3 * k + lane) % 29) * 0.001f;
}

}  // namespace

bool ComputePeakHasAvx512() {
  return KVS_PEAK_AVX512 && ActiveIsa() == Isa::kAvx512;
}

uint32_t Int8MacLoopScalar(int64_t iterations, uint32_t seed) {
  uint32_t total = 0;
  for (int j = 0; j < kPeakAccumulators; ++j) {
    for (int lane = 0; lane < 16; ++lane) {
      int32_t dot = 0;  // one iteration's four products
      for (int q = 0; q < 4; ++q) {
        const int byte = lane * 4 + q;
        dot += static_cast<int32_t>(ActByte(seed, byte)) * WeightByte(seed, j % 4, byte);
      }
      total +=
          static_cast<uint32_t>(j) + static_cast<uint32_t>(dot) * static_cast<uint32_t>(iterations);
    }
  }
  return total;
}

double F32MacLoopScalar(int64_t iterations, uint32_t seed) {
  const float x = Scale(seed);
  double total = 0;
  for (int j = 0; j < kPeakAccumulators; ++j) {
    for (int lane = 0; lane < 16; ++lane) {
      float acc = Start(j);
      const float y = Addend(seed, j % 4, lane);
      for (int64_t i = 0; i < iterations; ++i) acc = std::fma(acc, x, y);
      total += acc;
    }
  }
  return total;
}

#if KVS_PEAK_AVX512

// The AVX-512 loops are compiled for that level alone (the file is not one of the per-level
// sources): Int8MacLoop and F32MacLoop call them only when it is the level in force.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
namespace {

uint32_t Int8MacLoopAvx512(int64_t iterations, uint32_t seed) {
  alignas(64) uint8_t a_bytes[64];
  alignas(64) int8_t b_bytes[4][64];
  for (int byte = 0; byte < 64; ++byte) {
    a_bytes[byte] = ActByte(seed, byte);
    for (int k = 0; k < 4; ++k) b_bytes[k][byte] = WeightByte(seed, k, byte);
  }
  const __m512i a = _mm512_load_si512(a_bytes);
  __m512i b[4];
  for (int k = 0; k < 4; ++k) b[k] = _mm512_load_si512(b_bytes[k]);
  // Sixteen named accumulators: GCC keeps an array of them on the stack between iterations.
  // Each starts from its own value, or the compiler computes the four that share an operand once.
  __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
          c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
          c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7), c8 = _mm512_set1_epi32(8),
          c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10), c11 = _mm512_set1_epi32(11),
          c12 = _mm512_set1_epi32(12), c13 = _mm512_set1_epi32(13), c14 = _mm512_set1_epi32(14),
          c15 = _mm512_set1_epi32(15);
  for (int64_t i = 0; i < iterations; ++i) {
    // The compiler may not fold a loop of these: a and b are not constants.
    c0 = _mm512_dpbusd_epi32(c0, a, b[0]);
    c1 = _mm512_dpbusd_epi32(c1, a, b[1]);
    c2 = _mm512_dpbusd_epi32(c2, a, b[2]);
    c3 = _mm512_dpbusd_epi32(c3, a, b[3]);
    c4 = _mm512_dpbusd_epi32(c4, a, b[0]);
    c5 = _mm512_dpbusd_epi32(c5, a, b[1]);
    c6 = _mm512_dpbusd_epi32(c6, a, b[2]);
    c7 = _mm512_dpbusd_epi32(c7, a, b[3]);
    c8 = _mm512_dpbusd_epi32(c8, a, b[0]);
    c9 = _mm512_dpbusd_epi32(c9, a, b[1]);
    c10 = _mm512_dpbusd_epi32(c10, a, b[2]);
    c11 = _mm512_dpbusd_epi32(c11, a, b[3]);
    c12 = _mm512_dpbusd_epi32(c12, a, b[0]);
    c13 = _mm512_dpbusd_epi32(c13, a, b[1]);
    c14 = _mm512_dpbusd_epi32(c14, a, b[2]);
    c15 = _mm512_dpbusd_epi32(c15, a, b[3]);
  }
  const __m512i acc[kPeakAccumulators] = {c0, c1, c2,  c3,  c4,  c5,  c6,  c7,
                                          c8, c9, c10, c11, c12, c13, c14, c15};
  uint32_t total = 0;
  for (const __m512i& v : acc) {
    alignas(64) uint32_t lanes[16];
    _mm512_store_si512(lanes, v);
    for (uint32_t l : lanes) total += l;
  }
  return total;
}

double F32MacLoopAvx512(int64_t iterations, uint32_t seed) {
  const __m512 x = _mm512_set1_ps(Scale(seed));
  __m512 y[4];
  for (int k = 0; k < 4; ++k) {
    alignas(64) float lanes[16];
    for (int lane = 0; lane < 16; ++lane) lanes[lane] = Addend(seed, k, lane);
    y[k] = _mm512_load_ps(lanes);
  }
  __m512 c[16];
  for (int j = 0; j < 16; ++j) c[j] = _mm512_set1_ps(Start(j));
  __m512 c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4], c5 = c[5], c6 = c[6], c7 = c[7],
         c8 = c[8], c9 = c[9], c10 = c[10], c11 = c[11], c12 = c[12], c13 = c[13], c14 = c[14],
         c15 = c[15];
  for (int64_t i = 0; i < iterations; ++i) {
    c0 = _mm512_fmadd_ps(c0, x, y[0]);
    c1 = _mm512_fmadd_ps(c1, x, y[1]);
    c2 = _mm512_fmadd_ps(c2, x, y[2]);
    c3 = _mm512_fmadd_ps(c3, x, y[3]);
    c4 = _mm512_fmadd_ps(c4, x, y[0]);
    c5 = _mm512_fmadd_ps(c5, x, y[1]);
    c6 = _mm512_fmadd_ps(c6, x, y[2]);
    c7 = _mm512_fmadd_ps(c7, x, y[3]);
    c8 = _mm512_fmadd_ps(c8, x, y[0]);
    c9 = _mm512_fmadd_ps(c9, x, y[1]);
    c10 = _mm512_fmadd_ps(c10, x, y[2]);
    c11 = _mm512_fmadd_ps(c11, x, y[3]);
    c12 = _mm512_fmadd_ps(c12, x, y[0]);
    c13 = _mm512_fmadd_ps(c13, x, y[1]);
    c14 = _mm512_fmadd_ps(c14, x, y[2]);
    c15 = _mm512_fmadd_ps(c15, x, y[3]);
  }
  const __m512 acc[kPeakAccumulators] = {c0, c1, c2,  c3,  c4,  c5,  c6,  c7,
                                         c8, c9, c10, c11, c12, c13, c14, c15};
  double total = 0;
  for (const __m512& v : acc) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    for (float l : lanes) total += l;
  }
  return total;
}

}  // namespace
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic pop
#endif
#pragma GCC pop_options

// The AVX2 level's f32 loop: 8-lane FMAs. The 16 accumulators x 16 lanes of the twin are run
// as four passes of 8 accumulators x 8 lanes, each pass `iterations` long (8 chains cover the
// FMA latency x 2 pipes of the AVX2 cores at hand, and 8 + 5 operands fit 16 registers), so the
// multiply-adds are those of the AVX-512 loop and the sum is taken in the twin's order.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace {

double F32MacLoopAvx2(int64_t iterations, uint32_t seed) {
  const __m256 x = _mm256_set1_ps(Scale(seed));
  float out[kPeakAccumulators][16];
  for (int j0 = 0; j0 < kPeakAccumulators; j0 += 8) {
    for (int lane0 = 0; lane0 < 16; lane0 += 8) {
      __m256 y[4];
      for (int k = 0; k < 4; ++k) {
        float lanes[8];
        for (int lane = 0; lane < 8; ++lane) lanes[lane] = Addend(seed, k, lane0 + lane);
        y[k] = _mm256_loadu_ps(lanes);
      }
      // j0 is a multiple of 4, so accumulator j0 + i takes y[i % 4], as acc[j] takes y[j % 4].
      __m256 c0 = _mm256_set1_ps(Start(j0)), c1 = _mm256_set1_ps(Start(j0 + 1)),
             c2 = _mm256_set1_ps(Start(j0 + 2)), c3 = _mm256_set1_ps(Start(j0 + 3)),
             c4 = _mm256_set1_ps(Start(j0 + 4)), c5 = _mm256_set1_ps(Start(j0 + 5)),
             c6 = _mm256_set1_ps(Start(j0 + 6)), c7 = _mm256_set1_ps(Start(j0 + 7));
      for (int64_t i = 0; i < iterations; ++i) {
        c0 = _mm256_fmadd_ps(c0, x, y[0]);
        c1 = _mm256_fmadd_ps(c1, x, y[1]);
        c2 = _mm256_fmadd_ps(c2, x, y[2]);
        c3 = _mm256_fmadd_ps(c3, x, y[3]);
        c4 = _mm256_fmadd_ps(c4, x, y[0]);
        c5 = _mm256_fmadd_ps(c5, x, y[1]);
        c6 = _mm256_fmadd_ps(c6, x, y[2]);
        c7 = _mm256_fmadd_ps(c7, x, y[3]);
      }
      const __m256 c[8] = {c0, c1, c2, c3, c4, c5, c6, c7};
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(&out[j0 + i][lane0], c[i]);
    }
  }
  double total = 0;
  for (int j = 0; j < kPeakAccumulators; ++j)
    for (int lane = 0; lane < 16; ++lane) total += out[j][lane];
  return total;
}

}  // namespace
#pragma GCC pop_options

bool ComputePeakHasAvx2Fma() {
  return ActiveIsa() == Isa::kAvx512 || ActiveIsa() == Isa::kAvx2;
}

uint32_t Int8MacLoop(int64_t iterations, uint32_t seed) {
  return ActiveIsa() == Isa::kAvx512 ? Int8MacLoopAvx512(iterations, seed)
                                     : Int8MacLoopScalar(iterations, seed);
}
double F32MacLoop(int64_t iterations, uint32_t seed) {
  switch (ActiveIsa()) {
    case Isa::kAvx512:
      return F32MacLoopAvx512(iterations, seed);
    case Isa::kAvx2:
      return F32MacLoopAvx2(iterations, seed);
    default:
      return F32MacLoopScalar(iterations, seed);
  }
}

#else

bool ComputePeakHasAvx2Fma() {
  return false;
}
uint32_t Int8MacLoop(int64_t iterations, uint32_t seed) {
  return Int8MacLoopScalar(iterations, seed);
}
double F32MacLoop(int64_t iterations, uint32_t seed) {
  return F32MacLoopScalar(iterations, seed);
}

#endif

}  // namespace kvs
