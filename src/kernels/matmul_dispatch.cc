// The unqualified matmul_internal functions: each calls the version of the level in force.
#include "kernels/isa_dispatch.h"
#include "kernels/matmul_internal.h"

namespace kvs::matmul_internal {

void QuantizeActivations(const float* x, int64_t cols, int32_t code_offset, ActPair* dst) {
  KVS_DISPATCH(QuantizeActivations(x, cols, code_offset, dst));
}
void QuantizeActivationsFlat(const float* x, int64_t cols, int32_t code_offset, ActBlock* dst) {
  KVS_DISPATCH(QuantizeActivationsFlat(x, cols, code_offset, dst));
}
void MatMulRowsQ8_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsQ8_0(w, r0, r1, a, t0, t1, out, out_stride));
}
void MatMulRowsQ4_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsQ4_0(w, r0, r1, a, t0, t1, out, out_stride));
}
void MatMulRowsQ5_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsQ5_0(w, r0, r1, a, t0, t1, out, out_stride));
}
void MatMulRowsFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0,
                     int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsFloat(w, r0, r1, x, t0, t1, out, out_stride));
}
bool InterleavedKernelAvailable(DType t) {
  KVS_DISPATCH(InterleavedKernelAvailable(t));
}
void MatMulRowsInterleaved(const MatrixView& w, int64_t r0, int64_t r1, const FlatActs& a,
                           int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsInterleaved(w, r0, r1, a, t0, t1, out, out_stride));
}
void MatMulRowsInterleavedFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x,
                                int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsInterleavedFloat(w, r0, r1, x, t0, t1, out, out_stride));
}
void QuantizeActivationsQ8K(const float* x, int64_t cols, KAct256* dst) {
  KVS_DISPATCH(QuantizeActivationsQ8K(x, cols, dst));
}
void MatMulRowsInterleavedKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KActs256& a,
                                 int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsInterleavedKQuant(w, r0, r1, a, t0, t1, out, out_stride));
}
bool KQuantKernelAvailable(DType t) {
  KVS_DISPATCH(KQuantKernelAvailable(t));
}
void QuantizeActivationsK(const float* x, int64_t cols, KActOrder order, KActBlock* dst) {
  KVS_DISPATCH(QuantizeActivationsK(x, cols, order, dst));
}
void MatMulRowsKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KQuantizedActs& a,
                      int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  KVS_DISPATCH(MatMulRowsKQuant(w, r0, r1, a, t0, t1, out, out_stride));
}

}  // namespace kvs::matmul_internal
