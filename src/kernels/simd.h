// One place that pulls in the x86 intrinsics. GCC 12 reports its own AVX-512 intrinsics as
// (maybe) uninitialized (GCC bug 105593), so the include is wrapped to keep builds clean.
#pragma once

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif
