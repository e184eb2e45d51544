#include "kernels/cpu_isa.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace kvs {
namespace {

struct Feature {
  const char* name;
  bool present;
};

// The features a level needs, each with whether this CPU has it.
std::vector<Feature> RequiredFeatures(Isa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kAvx512:
      return {{"avx512f", __builtin_cpu_supports("avx512f") != 0},
              {"avx512bw", __builtin_cpu_supports("avx512bw") != 0},
              {"avx512vl", __builtin_cpu_supports("avx512vl") != 0},
              {"avx512dq", __builtin_cpu_supports("avx512dq") != 0},
              {"avx512vnni", __builtin_cpu_supports("avx512vnni") != 0},
              {"avx2", __builtin_cpu_supports("avx2") != 0},
              {"fma", __builtin_cpu_supports("fma") != 0},
              {"f16c", __builtin_cpu_supports("f16c") != 0},
              {"bmi", __builtin_cpu_supports("bmi") != 0},
              {"bmi2", __builtin_cpu_supports("bmi2") != 0}};
    case Isa::kAvx2:
      return {{"avx2", __builtin_cpu_supports("avx2") != 0},
              {"fma", __builtin_cpu_supports("fma") != 0},
              {"f16c", __builtin_cpu_supports("f16c") != 0},
              {"bmi", __builtin_cpu_supports("bmi") != 0},
              {"bmi2", __builtin_cpu_supports("bmi2") != 0}};
    default:
      return {};
  }
#elif defined(__aarch64__) && defined(__linux__)
  // Advanced SIMD is part of ARMv8-A; AT_HWCAP's ASIMD bit says the kernel exposes it.
  // (dotprod and i8mm, AT_HWCAP/AT_HWCAP2: no kernel uses them yet.)
  const unsigned long hwcap = getauxval(AT_HWCAP);
  if (isa == Isa::kNeon) return {{"asimd", (hwcap & HWCAP_ASIMD) != 0}};
  return {};
#else
  return {};
#endif
}

bool Supported(Isa isa) {
  if (!IsaCompiledIn(isa)) return false;
  for (const Feature& f : RequiredFeatures(isa))
    if (!f.present) return false;
  return true;
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        size_t b = line.find_first_not_of(" \t", colon + 1);
        if (b != std::string::npos) return line.substr(b);
      }
    }
  }
  return "unknown CPU";
}

// The requested value as the messages show it: quoted, printable ASCII only, at most 40 bytes.
std::string Quoted(std::string_view value) {
  std::string out = "\"";
  for (size_t i = 0; i < value.size() && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    out += (c >= 0x20 && c < 0x7f && c != '"') ? static_cast<char>(c) : '?';
  }
  if (value.size() > 40) out += "...";
  return out + "\"";
}

// The levels this build can run, for messages: "avx512, avx2 or scalar".
std::string LevelList() {
#if defined(__x86_64__)
  return "avx512, avx2 or scalar";
#elif defined(__aarch64__)
  return "neon or scalar";
#else
  return "scalar";
#endif
}

}  // namespace

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kNeon:
      return "neon";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

bool IsaCompiledIn(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
    case Isa::kAvx512:
#if defined(__x86_64__)
      return true;
#else
      return false;
#endif
    case Isa::kNeon:
#if defined(__aarch64__)
      return true;
#else
      return false;
#endif
  }
  return false;
}

Isa DetectIsa() {
#if defined(__aarch64__)
  return Supported(Isa::kNeon) ? Isa::kNeon : Isa::kScalar;
#else
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2})
    if (Supported(isa)) return isa;
  return Isa::kScalar;
#endif
}

Expected<Isa> ResolveIsa(std::string_view requested) {
  if (requested.empty()) return DetectIsa();
  Isa isa;
  if (requested == "avx512") {
    isa = Isa::kAvx512;
  } else if (requested == "avx2") {
    isa = Isa::kAvx2;
  } else if (requested == "scalar") {
    isa = Isa::kScalar;
  } else if (requested == "neon") {
    isa = Isa::kNeon;
  } else {
    return Status::Error(StrFormat("KVSERVE_ISA=%s: unknown level (this build runs %s)",
                                   Quoted(requested).c_str(), LevelList().c_str()));
  }
  if (!IsaCompiledIn(isa)) {
    return Status::Error(StrFormat("KVSERVE_ISA=%s: this build has no %s kernels (it runs %s)",
                                   Quoted(requested).c_str(), std::string(IsaName(isa)).c_str(),
                                   LevelList().c_str()));
  }
  std::string missing;
  for (const Feature& f : RequiredFeatures(isa)) {
    if (!f.present) missing += std::string(missing.empty() ? "" : ", ") + f.name;
  }
  if (!missing.empty()) {
    return Status::Error(StrFormat("KVSERVE_ISA=%s: this CPU lacks %s (its best level is %s)",
                                   Quoted(requested).c_str(), missing.c_str(),
                                   std::string(IsaName(DetectIsa())).c_str()));
  }
  return isa;
}

Status CheckIsaEnvironment() {
  const char* env = std::getenv("KVSERVE_ISA");
  Expected<Isa> isa = ResolveIsa(env != nullptr ? env : "");
  return isa.ok() ? Status::Ok() : isa.status();
}

Isa ActiveIsa() {
  static const Isa active = [] {
    const char* env = std::getenv("KVSERVE_ISA");
    Expected<Isa> isa = ResolveIsa(env != nullptr ? env : "");
    if (!isa.ok()) {
      // A library user's process is not ours to end: the CLI refuses such a value before it
      // gets here (CheckIsaEnvironment); an embedding program gets the CPU's best and a warning.
      const Isa best = DetectIsa();
      std::fprintf(stderr, "warning: %s; running at %s\n", isa.error().c_str(),
                   std::string(IsaName(best)).c_str());
      return best;
    }
    return *isa;
  }();
  return active;
}

std::string IsaDescription() {
  const Isa isa = ActiveIsa();
  std::string features;
  for (const Feature& f : RequiredFeatures(isa)) features += std::string(" ") + f.name;
  std::string s = std::string(IsaName(isa)) + " (" + CpuModelName();
  if (!features.empty()) s += ":" + features;
  if (isa != DetectIsa())
    s += "; forced by KVSERVE_ISA, the CPU's best is " + std::string(IsaName(DetectIsa()));
  return s + ")";
}

}  // namespace kvs
