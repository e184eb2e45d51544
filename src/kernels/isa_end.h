// Closes what kernels/isa_begin.h opened.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic pop
#endif
#pragma GCC pop_options
#undef KVS_ISA
#undef KVS_ISA_AVX512
#undef KVS_ISA_AVX2
#undef KVS_ISA_NEON
#undef KVS_UNROLL
