// The element-wise operations of kernels/ops.h that have vector code, once per
// instruction-set level (kernels/isa_begin.h); ops.cc dispatches to the level in force.
#pragma once

#include <cstdint>

#include "kernels/isa_dispatch.h"

namespace kvs::ops_internal {

#define KVS_DECLARE_OPS_LEVEL(ns)                                            \
  namespace ns {                                                             \
  void SwiGlu(const float* gate, const float* up, float* out, int64_t n);    \
  void GeGluTanh(const float* gate, const float* up, float* out, int64_t n); \
  float DotF32(const float* a, const float* b, int64_t n);                   \
  }
KVS_FOR_EACH_ISA_NAMESPACE(KVS_DECLARE_OPS_LEVEL)
#undef KVS_DECLARE_OPS_LEVEL

}  // namespace kvs::ops_internal
