// The compute roofline of this CPU, measured rather than assumed (as `bench bandwidth` measures
// the memory one): loops of independent multiply-adds on registers alone, no memory traffic.
//   int8: vpdpbusd, u8 × s8 with four products summed into each int32 lane: 64 multiply-adds a
//         512-bit instruction, the instruction the quantized matmuls run on;
//   f32:  vfmadd231ps, 16 multiply-adds a 512-bit instruction (the float matmuls, attention).
// Each loop keeps kPeakAccumulators accumulators in flight (more than latency × issue width)
// and returns a checksum of them, so the work cannot be optimized away and a scalar twin can
// check it.
#pragma once

#include <cstdint>

namespace kvs {

inline constexpr int kPeakAccumulators = 16;
// Multiply-adds one iteration of each loop performs.
inline constexpr int64_t kInt8MacsPerIteration = kPeakAccumulators * 64;
inline constexpr int64_t kF32MacsPerIteration = kPeakAccumulators * 16;

// True when the loops below run the AVX-512 instructions; else they run their scalar twins,
// which compute the same results in closed form and must not be timed (bench compute refuses).
bool ComputePeakHasAvx512();
// True when F32MacLoop runs 256-bit FMAs at least (the avx2 level: the int8 loop has no AVX2
// form, AVX2 lacking vpdpbusd, and runs its twin there).
bool ComputePeakHasAvx2Fma();

// `iterations` of acc[j] += dot4(a, b[j % 4]) in each int32 lane (wrapping) from acc[j] = j,
// with a and b derived from seed; returns the sum of every lane of every accumulator (wrapping).
uint32_t Int8MacLoop(int64_t iterations, uint32_t seed);
uint32_t Int8MacLoopScalar(int64_t iterations, uint32_t seed);
// `iterations` of acc[j] = fma(acc[j], x, y[j % 4]) in each lane, x just under 1 so the values
// stay bounded; returns the sum of every lane of every accumulator (in lane order).
double F32MacLoop(int64_t iterations, uint32_t seed);
double F32MacLoopScalar(int64_t iterations, uint32_t seed);

}  // namespace kvs
