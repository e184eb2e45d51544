// KVS_DISPATCH(call): return <level>::call for the level in force (kernels/cpu_isa.h). Each
// level's namespace (avx512, avx2, neon, scalar) must declare `call`'s function where the
// macro is used; only the levels this build carries are named.
#pragma once

#include "kernels/cpu_isa.h"

#if defined(__x86_64__)
#define KVS_DISPATCH(call)        \
  do {                            \
    switch (::kvs::ActiveIsa()) { \
      case ::kvs::Isa::kAvx512:   \
        return avx512::call;      \
      case ::kvs::Isa::kAvx2:     \
        return avx2::call;        \
      default:                    \
        return scalar::call;      \
    }                             \
  } while (0)
#define KVS_FOR_EACH_ISA_NAMESPACE(X) X(avx512) X(avx2) X(scalar)
#elif defined(__aarch64__)
#define KVS_DISPATCH(call)        \
  do {                            \
    switch (::kvs::ActiveIsa()) { \
      case ::kvs::Isa::kNeon:     \
        return neon::call;        \
      default:                    \
        return scalar::call;      \
    }                             \
  } while (0)
#define KVS_FOR_EACH_ISA_NAMESPACE(X) X(neon) X(scalar)
#else
#define KVS_DISPATCH(call) return scalar::call
#define KVS_FOR_EACH_ISA_NAMESPACE(X) X(scalar)
#endif
