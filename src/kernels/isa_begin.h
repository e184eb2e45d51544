// Opens the code of one instruction-set level in a kernel source that CMake compiles once per
// level (KVS_KERNEL_LEVEL_SOURCES, with KVS_ISA_LEVEL_<LEVEL> defined). No include guard:
// every such file includes it once, after all of its other includes, and closes the level
// with kernels/isa_end.h.
//
// The level's instructions are enabled by `#pragma GCC target` (as Highway does), not by -m
// flags on the whole file: the standard library's and our headers' inline functions, included
// above this point, stay compiled for the baseline, so the linker can never keep an AVX-512
// copy of, say, std::vector<float>'s growth for a CPU without AVX-512. Everything the file
// defines from here on is either in an unnamed namespace or in the namespace KVS_ISA (avx512,
// avx2, neon or scalar), so the levels' copies never merge either. GCC's C++ front end does not
// define the level's feature macros (__AVX512F__, __AVX2__) under the pragma, so the kernels test
// KVS_ISA_AVX512 and KVS_ISA_AVX2 (AVX-512 implies AVX2) instead.
#if defined(KVS_ISA)
#error "kernels/isa_begin.h included twice without kernels/isa_end.h"
#endif

// The features enabled here are exactly those RequiredFeatures (cpu_isa.cc) checks for the level:
// the compiler may emit any of them (AVX512DQ's vpmullq, for one) where it sees fit.
// What the level's helpers (kernels/simd.h) use, included here before the target changes.
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(KVS_ISA_LEVEL_AVX512)
#define KVS_ISA avx512
#define KVS_ISA_AVX512 1
#define KVS_ISA_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi,bmi2")
#elif defined(KVS_ISA_LEVEL_AVX2)
#define KVS_ISA avx2
#define KVS_ISA_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,bmi,bmi2")
#elif defined(KVS_ISA_LEVEL_NEON)
#define KVS_ISA neon
#define KVS_ISA_NEON 1
#pragma GCC push_options
#elif defined(KVS_ISA_LEVEL_SCALAR)
#define KVS_ISA scalar
#pragma GCC push_options
#else
#error "a per-level kernel source compiled without KVS_ISA_LEVEL_<LEVEL> (see CMakeLists.txt)"
#endif

// Fully unrolls a loop over a tile's groups, halves, tokens or sub-blocks (compile-time counts).
// Without it GCC may keep a loop whose index addresses an accumulator array, and then the array
// lives in memory: the AVX2 F16 prefill tile stored 7 of its 8 accumulators every column.
#define KVS_UNROLL _Pragma("GCC unroll 16")

// GCC 12 reports its own AVX-512 intrinsics as (maybe) uninitialized (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif
