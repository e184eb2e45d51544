// The instruction-set level every kernel family runs at, chosen once per process.
//
// Each kernel family is compiled once per level (kernels/isa_begin.h) into a namespace named
// after it (avx512, avx2, neon, scalar); a dispatching function calls the active level's
// version. The level is the best the CPU reports (CPUID on x86-64, AT_HWCAP on ARM64), or the
// one named by KVSERVE_ISA, which may only name a level at or below the CPU's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kvs {

enum class Isa : uint8_t {
  kScalar = 0,  // the portable twins (baseline x86-64 or ARMv8)
  kAvx2 = 1,    // AVX2 + FMA + F16C + BMI1/2 (Haswell, Zen 1 and later)
  kAvx512 = 2,  // AVX-512 F, BW, VL, DQ, VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later)
  kNeon = 3,    // ARMv8 Advanced SIMD
};

std::string_view IsaName(Isa isa);

// The best level this CPU (and its OS, which must save the wide registers) supports.
Isa DetectIsa();

// Whether this build carries kernels for `isa` (the x86 levels on x86-64, neon on ARM64).
bool IsaCompiledIn(Isa isa);

// The level named by a KVSERVE_ISA value (empty: the detected one). An unknown name, a level
// this build has no kernels for, or one the CPU lacks a feature of (the feature is named) is
// an error.
Expected<Isa> ResolveIsa(std::string_view requested);

// The level in force: resolved from KVSERVE_ISA on first use and fixed for the process. An
// invalid KVSERVE_ISA gives the CPU's best level and a warning on stderr (the CLI checks
// CheckIsaEnvironment() first and refuses it).
Isa ActiveIsa();

// ResolveIsa(getenv("KVSERVE_ISA")): the CLI calls this at start so that a bad value is an
// ordinary error.
Status CheckIsaEnvironment();

// One line for logs and --version: "avx512 (AMD EPYC 9B45: avx512f avx512bw ...)".
std::string IsaDescription();

}  // namespace kvs
